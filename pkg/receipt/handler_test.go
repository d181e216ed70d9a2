package receipt_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

var (
	quiet    = slog.New(slog.DiscardHandler)
	executor = identity.Principal{Kind: identity.KindService, ServiceName: "executor"}
	carol    = identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "carol"}
)

func relayed(p identity.Principal, via string) identity.Principal { p.Via = via; return p }

func as(p identity.Principal) context.Context {
	return identity.WithPrincipal(context.Background(), p)
}

// statusOf returns the gRPC code and the google.rpc.ErrorInfo reason of err.
func statusOf(t *testing.T, err error) (codes.Code, string) {
	t.Helper()
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return st.Code(), info.GetReason()
		}
	}
	return st.Code(), ""
}

func TestHandler(t *testing.T) {
	now := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	m := receipt.NewMemory()
	h, err := receipt.NewHandler(receipt.HandlerConfig[receipt.MemoryTx]{
		Store: m, InTx: m.InTx, Trust: receipt.Trust{Services: []string{"executor"}}, Logger: quiet,
		Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := m.InTx(ctx, func(tx receipt.MemoryTx) error {
		return m.Record(ctx, tx, receipt.Receipt{InvocationID: "inv-done", State: receipt.Executed, Method: buy, Result: []byte{10, 1, 'x'}, RecordedAt: now.Add(-time.Minute)})
	}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name       string
		ctx        context.Context
		id         string
		wantCode   codes.Code
		wantReason string
		want       *mandatev1.Receipt
	}{
		{"executed, asked by the executor", as(executor), "inv-done", codes.OK, "",
			&mandatev1.Receipt{InvocationId: "inv-done", State: mandatev1.ReceiptState_RECEIPT_STATE_EXECUTED, Method: buy, Result: []byte{10, 1, 'x'}}},
		{"unknown, asked by the executor", as(executor), "inv-lost", codes.OK, "",
			&mandatev1.Receipt{InvocationId: "inv-lost", State: mandatev1.ReceiptState_RECEIPT_STATE_NOT_EXECUTED}},
		{"asked by the executor for a user", as(relayed(carol, "executor")), "inv-done", codes.OK, "",
			&mandatev1.Receipt{InvocationId: "inv-done", State: mandatev1.ReceiptState_RECEIPT_STATE_EXECUTED, Method: buy, Result: []byte{10, 1, 'x'}}},
		{"a user directly", as(carol), "inv-done", codes.PermissionDenied, receipt.CodeNotViaExecutor, nil},
		{"an untrusted service", as(identity.Principal{Kind: identity.KindService, ServiceName: "mcpbridge"}), "inv-done", codes.PermissionDenied, receipt.CodeNotViaExecutor, nil},
		{"relayed by an untrusted service", as(relayed(carol, "mcpbridge")), "inv-done", codes.PermissionDenied, receipt.CodeNotViaExecutor, nil},
		{"nobody", context.Background(), "inv-done", codes.Unauthenticated, failure.CodeAuthenticationMissingCredentials, nil},
		{"no id", as(executor), "", codes.InvalidArgument, "schema.invalid", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := h.GetReceipt(tt.ctx, &mandatev1.GetReceiptRequest{InvocationId: tt.id})
			code, reason := statusOf(t, err)
			if code != tt.wantCode || reason != tt.wantReason {
				t.Fatalf("GetReceipt: %v %q (%v), want %v %q", code, reason, err, tt.wantCode, tt.wantReason)
			}
			if tt.want == nil {
				return
			}
			if got.GetInvocationId() != tt.want.GetInvocationId() || got.GetState() != tt.want.GetState() ||
				got.GetMethod() != tt.want.GetMethod() || !bytes.Equal(got.GetResult(), tt.want.GetResult()) || got.GetRecordedAt() == nil {
				t.Fatalf("GetReceipt = %v, want %v", got, tt.want)
			}
		})
	}

	// The miss was fenced: a delivery of inv-lost can no longer act.
	if _, err := (&shop{receipts: m}).buy(ctx, buy, "inv-lost", nil); !errors.Is(err, receipt.ErrFenced) {
		t.Fatalf("delivery after NOT_EXECUTED: err = %v, want receipt.fenced", err)
	}
	// Refused callers fenced nothing.
	if _, found, _ := m.Get(ctx, nil, "inv-never"); found {
		t.Fatal("unexpected receipt")
	}
}

// failingStore is a Store whose database is down.
type failingStore struct{}

var errDown = errors.New("dial tcp 10.0.0.7:5432: connection refused (password=hunter2)")

func (failingStore) Get(context.Context, receipt.MemoryTx, string) (receipt.Receipt, bool, error) {
	return receipt.Receipt{}, false, errDown
}
func (failingStore) Record(context.Context, receipt.MemoryTx, receipt.Receipt) error { return errDown }

func TestHandlerStoreDown(t *testing.T) {
	m := receipt.NewMemory()
	h, err := receipt.NewHandler(receipt.HandlerConfig[receipt.MemoryTx]{Store: failingStore{}, InTx: m.InTx, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.GetReceipt(as(executor), &mandatev1.GetReceiptRequest{InvocationId: "inv-1"})
	code, reason := statusOf(t, err)
	if code != codes.Unavailable || reason != receipt.CodeUnavailable {
		t.Fatalf("GetReceipt: %v %q, want Unavailable %s", code, reason, receipt.CodeUnavailable)
	}
	if st, _ := status.FromError(err); bytes.Contains([]byte(st.Message()), []byte("hunter2")) {
		t.Fatalf("the store's text leaked: %q", st.Message())
	}
	for _, d := range status.Convert(err).Details() {
		if ce, ok := d.(*mandatev1.CommandError); ok && !ce.GetRetriable() {
			t.Fatal("receipt.unavailable must be retriable")
		}
	}
}

func TestNewHandlerConfig(t *testing.T) {
	if _, err := receipt.NewHandler(receipt.HandlerConfig[receipt.MemoryTx]{InTx: receipt.NewMemory().InTx}); err == nil {
		t.Error("no store: want an error")
	}
	if _, err := receipt.NewHandler(receipt.HandlerConfig[receipt.MemoryTx]{Store: receipt.NewMemory()}); err == nil {
		t.Error("no InTx: want an error")
	}
}

func TestFromContext(t *testing.T) {
	long := func(n int) string { return string(bytes.Repeat([]byte{'k'}, n)) }
	executorOnly := receipt.Trust{Services: []string{"executor"}}
	tests := []struct {
		name       string
		trust      receipt.Trust
		caller     *identity.Principal
		md         metadata.MD
		want       receipt.Invocation
		wantCode   codes.Code
		wantReason string
	}{
		{"both", executorOnly, ptr(relayed(carol, "executor")), metadata.Pairs(receipt.InvocationIDHeader, "inv-1", receipt.IdempotencyKeyHeader, "k-1"),
			receipt.Invocation{ID: "inv-1", IdempotencyKey: "k-1", Caller: relayed(carol, "executor")}, codes.OK, ""},
		{"none", receipt.Trust{}, ptr(relayed(carol, "mcpbridge")), nil, receipt.Invocation{Caller: relayed(carol, "mcpbridge")}, codes.OK, ""},
		{"empty key", executorOnly, ptr(relayed(carol, "executor")), metadata.Pairs(receipt.InvocationIDHeader, "inv-1", receipt.IdempotencyKeyHeader, ""),
			receipt.Invocation{ID: "inv-1", Caller: relayed(carol, "executor")}, codes.OK, ""},
		{"longest key and id", executorOnly, ptr(relayed(carol, "executor")),
			metadata.Pairs(receipt.InvocationIDHeader, long(receipt.MaxInvocationIDLen), receipt.IdempotencyKeyHeader, long(receipt.MaxIdempotencyKeyLen)),
			receipt.Invocation{ID: long(receipt.MaxInvocationIDLen), IdempotencyKey: long(receipt.MaxIdempotencyKeyLen), Caller: relayed(carol, "executor")}, codes.OK, ""},
		{"two keys", executorOnly, ptr(relayed(carol, "executor")), metadata.Pairs(receipt.IdempotencyKeyHeader, "a", receipt.IdempotencyKeyHeader, "b"),
			receipt.Invocation{}, codes.InvalidArgument, receipt.CodeInvalidKey},
		{"key too long", executorOnly, ptr(relayed(carol, "executor")), metadata.Pairs(receipt.IdempotencyKeyHeader, long(receipt.MaxIdempotencyKeyLen+1)),
			receipt.Invocation{}, codes.InvalidArgument, receipt.CodeInvalidKey},
		{"two invocation ids", executorOnly, ptr(relayed(carol, "executor")), metadata.Pairs(receipt.InvocationIDHeader, "a", receipt.InvocationIDHeader, "b"),
			receipt.Invocation{}, codes.InvalidArgument, receipt.CodeInvalidMetadata},
		{"invocation id too long", executorOnly, ptr(relayed(carol, "executor")), metadata.Pairs(receipt.InvocationIDHeader, long(receipt.MaxInvocationIDLen+1)),
			receipt.Invocation{}, codes.InvalidArgument, receipt.CodeInvalidMetadata},
		{"a user directly", executorOnly, ptr(carol), metadata.Pairs(receipt.InvocationIDHeader, "inv-1"),
			receipt.Invocation{}, codes.PermissionDenied, receipt.CodeNotViaExecutor},
		{"relayed by an untrusted service", executorOnly, ptr(relayed(carol, "mcpbridge")), metadata.Pairs(receipt.InvocationIDHeader, "inv-1"),
			receipt.Invocation{}, codes.PermissionDenied, receipt.CodeNotViaExecutor},
		{"a service alone", receipt.Trust{}, &executor, metadata.Pairs(receipt.InvocationIDHeader, "inv-1"),
			receipt.Invocation{}, codes.Unauthenticated, failure.CodeAuthenticationMissingCredentials},
		{"nobody", receipt.Trust{}, nil, metadata.Pairs(receipt.InvocationIDHeader, "inv-1"),
			receipt.Invocation{}, codes.Unauthenticated, failure.CodeAuthenticationMissingCredentials},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			if tt.caller != nil {
				ctx = identity.WithPrincipal(ctx, *tt.caller)
			}
			if tt.md != nil {
				ctx = metadata.NewIncomingContext(ctx, tt.md)
			}
			got, err := tt.trust.FromContext(ctx)
			code, reason := statusOf(t, err)
			if code != tt.wantCode || reason != tt.wantReason {
				t.Fatalf("FromContext: %v %q (%v), want %v %q", code, reason, err, tt.wantCode, tt.wantReason)
			}
			if err == nil && got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	// The package-level FromContext trusts any Mandate service.
	ctx := metadata.NewIncomingContext(as(relayed(carol, "mcpbridge")), metadata.Pairs(receipt.InvocationIDHeader, "inv-9"))
	if inv, err := receipt.FromContext(ctx); err != nil || inv.ID != "inv-9" {
		t.Fatalf("FromContext = %+v, %v", inv, err)
	}
}

func ptr[T any](v T) *T { return &v }
