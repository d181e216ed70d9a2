package backend_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/pkg/backend"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

// details returns the two details every refusal carries.
func details(t *testing.T, st *status.Status) (*errdetails.ErrorInfo, *mandatev1.CommandError) {
	t.Helper()
	var info *errdetails.ErrorInfo
	var ce *mandatev1.CommandError
	for _, d := range st.Details() {
		switch x := d.(type) {
		case *errdetails.ErrorInfo:
			info = x
		case *mandatev1.CommandError:
			ce = x
		}
	}
	if info == nil || ce == nil {
		t.Fatalf("status %v lacks ErrorInfo or CommandError: %v", st.Code(), st.Details())
	}
	return info, ce
}

func TestRefusalStatus(t *testing.T) {
	r := backend.Refuse(backend.StagePreInvariant, "refund.exceeds_paid", "the refund exceeds what was paid").
		WithCause(errors.New("SELECT … FROM refunds: secret detail"))
	r.Retriable, r.Remedy, r.InvocationID = false, "refund at most the paid amount", "inv-3"
	r.Violations = []backend.Violation{{Pointer: "/amount", Rule: "refund.max", Message: "at most 10.00 EUR"}}
	st := r.GRPCStatus()
	info, ce := details(t, st)
	want := &mandatev1.CommandError{
		Stage: backend.StagePreInvariant, Code: "refund.exceeds_paid", Message: "the refund exceeds what was paid",
		Remedy: "refund at most the paid amount", InvocationId: "inv-3",
		Violations: []*mandatev1.Violation{{Pointer: "/amount", Rule: "refund.max", Message: "at most 10.00 EUR"}},
	}
	if st.Code() != codes.FailedPrecondition || !proto.Equal(ce, want) {
		t.Errorf("status = %v %v, want FailedPrecondition %v", st.Code(), ce, want)
	}
	if info.GetDomain() != "mandate.dev" || info.GetReason() != "refund.exceeds_paid" ||
		info.GetMetadata()["stage"] != backend.StagePreInvariant || info.GetMetadata()["invocation_id"] != "inv-3" {
		t.Errorf("ErrorInfo = %v", info)
	}
	if strings.Contains(st.Message(), "secret") || strings.Contains(r.Error(), "secret") {
		t.Errorf("the cause leaked: %q / %q", st.Message(), r.Error())
	}
	if r.Error() != "pre_invariant: refund.exceeds_paid: the refund exceeds what was paid" {
		t.Errorf("Error() = %q", r.Error())
	}
	if !errors.Is(fmt.Errorf("refund: %w", r), backend.Refuse("", "refund.exceeds_paid", "")) || errors.Is(r, backend.Refuse("", "refund.other", "")) {
		t.Error("errors.Is does not match refusals by code")
	}
	if errors.Unwrap(r) == nil {
		t.Error("the cause is not kept for logs")
	}
	// A gRPC server finds the status through the wrapping.
	if got := status.Convert(fmt.Errorf("wrapped: %w", r)); got.Code() != codes.FailedPrecondition {
		t.Errorf("status.Convert(wrapped) = %v", got.Code())
	}
}

func TestRefusalGRPCCodes(t *testing.T) {
	withStatus := backend.Refuse(backend.StageStateCheck, "state.not_found", "no such ticket")
	withStatus.Status = codes.NotFound
	tests := []struct {
		name string
		r    *backend.Error
		want codes.Code
	}{
		{"a domain code defaults to FailedPrecondition", backend.Refuse(backend.StageStateCheck, "state.closed", "closed"), codes.FailedPrecondition},
		{"an explicit code wins", withStatus, codes.NotFound},
		{"scope.denied is the table's PermissionDenied", backend.Refuse(backend.StageScopeCheck, backend.CodeScopeDenied, "no"), codes.PermissionDenied},
		{"schema.invalid is the table's InvalidArgument", backend.Refuse(backend.StageSchemaValidate, backend.CodeSchemaInvalid, "bad"), codes.InvalidArgument},
		{"idempotency.key_reused is the table's code", backend.Refuse(backend.StageIdempotencyCheck, backend.CodeIdempotencyKeyReused, "reused"), codes.FailedPrecondition},
		{"Internal", backend.Internal(errors.New("x")), codes.Internal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.GRPCStatus().Code(); got != tc.want {
				t.Errorf("gRPC code = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAsErrorAndStatusOf(t *testing.T) {
	// A fenced invocation, refused by pkg/receipt.
	m := receipt.NewMemory()
	ctx := context.Background()
	var fenced error
	_ = m.InTx(ctx, func(tx receipt.MemoryTx) error {
		if _, err := receipt.Resolve(ctx, tx, m, "inv-1", time.Now()); err != nil {
			t.Fatal(err)
		}
		_, fenced = receipt.Effect(ctx, tx, m, "/x.Y/Z", "inv-1", func() (*wrapperspb.StringValue, error) { return wrapperspb.String(""), nil })
		return nil
	})
	tests := []struct {
		name      string
		err       error
		refusal   bool
		wantCode  codes.Code
		wantStage string
		wantErr   string
	}{
		{"a refusal", fmt.Errorf("desk: %w", backend.Refuse(backend.StageStateCheck, "state.closed", "closed")), true, codes.FailedPrecondition, backend.StageStateCheck, "state.closed"},
		{"pkg/receipt's refusal", fenced, true, codes.FailedPrecondition, backend.StageIdempotencyCheck, backend.CodeReceiptFenced},
		{"a plain error", errors.New("pq: relation does not exist"), false, codes.Internal, backend.StageDispatch, backend.CodeInternalError},
		{"a deadline", fmt.Errorf("store: %w", context.DeadlineExceeded), false, codes.DeadlineExceeded, "", "request.deadline_exceeded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := backend.AsError(tc.err)
			if ok != tc.refusal {
				t.Fatalf("AsError = %v, %v; want a refusal: %v", r, ok, tc.refusal)
			}
			if ok && (r.Stage != tc.wantStage || r.Code != tc.wantErr) {
				t.Errorf("AsError = %s/%s, want %s/%s", r.Stage, r.Code, tc.wantStage, tc.wantErr)
			}
			st := backend.StatusOf(tc.err)
			info, ce := details(t, st)
			if st.Code() != tc.wantCode || ce.GetStage() != tc.wantStage || ce.GetCode() != tc.wantErr || info.GetReason() != tc.wantErr {
				t.Errorf("StatusOf = %v %s/%s, want %v %s/%s", st.Code(), ce.GetStage(), ce.GetCode(), tc.wantCode, tc.wantStage, tc.wantErr)
			}
			if strings.Contains(st.Message(), "pq:") {
				t.Errorf("StatusOf leaked the cause: %q", st.Message())
			}
		})
	}
	if backend.StatusOf(nil).Code() != codes.OK {
		t.Error("StatusOf(nil) is not OK")
	}
}
