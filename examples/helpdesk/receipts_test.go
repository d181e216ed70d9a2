package helpdesk_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/pkg/backend"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

// command is one effectful command of the helpdesk with a request that succeeds against the
// seed data, and a check of how many times its effect happened.
type command struct {
	name   string
	method string
	caller principal
	call   func(ctx context.Context, c helpdeskv1.HelpdeskServiceClient) (proto.Message, error)
	// output returns an empty message of the method's output type.
	output func() proto.Message
	// effects returns how many times the effect happened in e, after one call.
	effects func(t *testing.T, e *env) int
}

func reportState(t *testing.T, e *env, id string) helpdesk.ReportState {
	t.Helper()
	r, err := e.store.Report(testCtx(t), "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	return r.State
}

// exists counts a record that exists as 1.
func exists(err error) int {
	if errors.Is(err, helpdesk.ErrNotFound) {
		return 0
	}
	return 1
}

var commands = []command{
	{
		name: "IssueRefund", method: helpdeskv1.HelpdeskService_IssueRefund_FullMethodName, caller: user("carol"),
		call: func(ctx context.Context, c helpdeskv1.HelpdeskServiceClient) (proto.Message, error) {
			return c.IssueRefund(ctx, &helpdeskv1.IssueRefundRequest{TicketId: "T-1001", Amount: eur(1000), Reason: "Goodwill", CardholderReference: "CH4242424242"})
		},
		output: func() proto.Message { return &helpdeskv1.Refund{} },
		effects: func(t *testing.T, e *env) int {
			rows, _ := e.store.Refunds(testCtx(t), "acme", "T-1001")
			tk, _ := e.store.Ticket(testCtx(t), "acme", "T-1001")
			if int64(len(rows))*1000 != tk.Refunded.Minor || e.gw.Refunds() != len(rows) {
				t.Errorf("%d refund rows, %+v booked, %d gateway refunds: they disagree", len(rows), tk.Refunded, e.gw.Refunds())
			}
			return e.gw.Refunds()
		},
	},
	{
		name: "CreateExpenseReport", method: helpdeskv1.HelpdeskService_CreateExpenseReport_FullMethodName, caller: user("alice"),
		call: func(ctx context.Context, c helpdeskv1.HelpdeskServiceClient) (proto.Message, error) {
			return c.CreateExpenseReport(ctx, &helpdeskv1.CreateExpenseReportRequest{
				Title: "Workshop Lisbon", Payout: &helpdeskv1.CreateExpenseReportRequest_PayrollId{PayrollId: "P-0042"},
				Lines: []*helpdeskv1.ExpenseLine{{Description: "Taxi", Amount: eur(3000), Category: helpdeskv1.ExpenseCategory_EXPENSE_CATEGORY_TRAVEL}},
			})
		},
		output: func() proto.Message { return &helpdeskv1.ExpenseReport{} },
		effects: func(t *testing.T, e *env) int {
			_, first := e.store.Report(testCtx(t), "acme", "ER-2004")
			_, second := e.store.Report(testCtx(t), "acme", "ER-2005")
			return exists(first) + exists(second)
		},
	},
	{
		name: "SubmitExpenseReport", method: helpdeskv1.HelpdeskService_SubmitExpenseReport_FullMethodName, caller: user("alice"),
		call: func(ctx context.Context, c helpdeskv1.HelpdeskServiceClient) (proto.Message, error) {
			return c.SubmitExpenseReport(ctx, &helpdeskv1.SubmitExpenseReportRequest{ReportId: "ER-2001", Note: "Receipts attached"})
		},
		output: func() proto.Message { return &helpdeskv1.ExpenseReport{} },
		// A second submission would be refused (state.not_draft), not replayed.
		effects: func(t *testing.T, e *env) int {
			return map[bool]int{true: 1}[reportState(t, e, "ER-2001") == helpdesk.ReportSubmitted]
		},
	},
	{
		name: "RecallExpenseReport", method: helpdeskv1.HelpdeskService_RecallExpenseReport_FullMethodName, caller: user("alice"),
		call: func(ctx context.Context, c helpdeskv1.HelpdeskServiceClient) (proto.Message, error) {
			return c.RecallExpenseReport(ctx, &helpdeskv1.RecallExpenseReportRequest{ReportId: "ER-2002", Reason: "Missing a receipt"})
		},
		output: func() proto.Message { return &helpdeskv1.ExpenseReport{} },
		effects: func(t *testing.T, e *env) int {
			return map[bool]int{true: 1}[reportState(t, e, "ER-2002") == helpdesk.ReportDraft]
		},
	},
	{
		name: "ApproveExpenseReport", method: helpdeskv1.HelpdeskService_ApproveExpenseReport_FullMethodName, caller: user("bob"),
		call: func(ctx context.Context, c helpdeskv1.HelpdeskServiceClient) (proto.Message, error) {
			return c.ApproveExpenseReport(ctx, &helpdeskv1.ApproveExpenseReportRequest{ReportId: "ER-2003", Comment: "OK"})
		},
		output: func() proto.Message { return &helpdeskv1.ExpenseReport{} },
		effects: func(t *testing.T, e *env) int {
			return map[bool]int{true: 1}[reportState(t, e, "ER-2003") == helpdesk.ReportApproved]
		},
	},
	{
		name: "EraseCustomer", method: helpdeskv1.HelpdeskService_EraseCustomer_FullMethodName, caller: user("carol"),
		call: func(ctx context.Context, c helpdeskv1.HelpdeskServiceClient) (proto.Message, error) {
			return c.EraseCustomer(ctx, &helpdeskv1.EraseCustomerRequest{CustomerEmail: "jane.doe@example.com", Reason: "GDPR request 17"})
		},
		output: func() proto.Message { return &helpdeskv1.CustomerErasure{} },
		effects: func(t *testing.T, e *env) int {
			_, first := e.store.Erasure(testCtx(t), "acme", "CE-4001")
			_, second := e.store.Erasure(testCtx(t), "acme", "CE-4002")
			return exists(first) + exists(second)
		},
	},
}

// TestRedelivery: every effectful command, delivered twice with one invocation id, acts once
// and answers the second delivery with the first's response; GetReceipt then says EXECUTED with
// that response's bytes.
func TestRedelivery(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		for _, c := range commands {
			t.Run(c.name, func(t *testing.T) {
				e := start(t, newStore)
				id := "inv-redelivered-" + c.name
				first, err := c.call(redeliver(t, c.caller, id), e.exec)
				mustOK(t, err)
				again, err := c.call(redeliver(t, c.caller, id), e.exec)
				mustOK(t, err)
				if !proto.Equal(first, again) {
					t.Errorf("redelivery answered %v, want the first response %v", again, first)
				}
				if n := c.effects(t, e); n != 1 {
					t.Errorf("the effect happened %d times, want once", n)
				}

				got, err := e.receipts.GetReceipt(testCtx(t), &mandatev1.GetReceiptRequest{InvocationId: id})
				mustOK(t, err)
				if got.GetState() != mandatev1.ReceiptState_RECEIPT_STATE_EXECUTED || got.GetMethod() != c.method ||
					got.GetInvocationId() != id || got.GetRecordedAt() == nil {
					t.Fatalf("receipt = %v, want EXECUTED %s", got, c.method)
				}
				decoded := c.output()
				if err := proto.Unmarshal(got.GetResult(), decoded); err != nil || !proto.Equal(decoded, first) {
					t.Fatalf("receipt result decodes to %v (%v), want %v", decoded, err, first)
				}

				// Another invocation acts again (where the state allows it).
				if c.name == "IssueRefund" {
					mustOK(t, second(c.call(as(t, c.caller), e.exec)))
					if e.gw.Refunds() != 2 {
						t.Errorf("a new invocation: gateway counted %d refunds, want 2", e.gw.Refunds())
					}
				}
			})
		}
	})
}

func second[T any](_ T, err error) error { return err }

// TestFence: GetReceipt of an invocation the backend never saw says NOT_EXECUTED and fences it:
// a delivery of it arriving later is refused with receipt.fenced and acts not at all.
func TestFence(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		for _, c := range commands {
			t.Run(c.name, func(t *testing.T) {
				e := start(t, newStore)
				id := "inv-lost-" + c.name
				got, err := e.receipts.GetReceipt(testCtx(t), &mandatev1.GetReceiptRequest{InvocationId: id})
				mustOK(t, err)
				if got.GetState() != mandatev1.ReceiptState_RECEIPT_STATE_NOT_EXECUTED || got.GetMethod() != "" || len(got.GetResult()) != 0 {
					t.Fatalf("receipt of an unknown invocation = %v, want NOT_EXECUTED", got)
				}
				_, err = c.call(redeliver(t, c.caller, id), e.exec)
				ce := checkRefusal(t, err, refusal{codes.FailedPrecondition, helpdesk.StageIdempotencyCheck, backend.CodeReceiptFenced})
				if ce.GetRetriable() || ce.GetInvocationId() != id {
					t.Errorf("refusal = %v, want not retriable, naming %s", ce, id)
				}
				if n := c.effects(t, e); n != 0 {
					t.Errorf("the effect happened %d times, want never", n)
				}
				if e.gw.Refunds() != 0 {
					t.Errorf("gateway counted %d refunds: a fenced invocation moved money", e.gw.Refunds())
				}
				got, err = e.receipts.GetReceipt(testCtx(t), &mandatev1.GetReceiptRequest{InvocationId: id})
				mustOK(t, err)
				if got.GetState() != mandatev1.ReceiptState_RECEIPT_STATE_NOT_EXECUTED {
					t.Fatalf("receipt after the refused delivery = %v, want NOT_EXECUTED still", got)
				}
			})
		}
	})
}

// TestGetReceiptCallers: receipts are for Mandate services, over the same checks as commands.
func TestGetReceiptCallers(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore, trusting("executor"))
		notVia := refusal{codes.PermissionDenied, helpdesk.StageScopeCheck, backend.CodeScopeNotViaExecutor}
		req := &mandatev1.GetReceiptRequest{InvocationId: "inv-asked"}
		tests := []struct {
			name string
			call func() error
			want *refusal
		}{
			{"the executor", func() error { return second(e.receipts.GetReceipt(testCtx(t), req)) }, nil},
			{"the executor relaying a user", func() error { return second(e.receipts.GetReceipt(as(t, user("alice")), req)) }, nil},
			{"a user directly", func() error {
				return second(e.directReceipts.GetReceipt(bearer(t, token(t, user("alice"))), req))
			}, &notVia},
			{"an agent directly", func() error {
				return second(e.directReceipts.GetReceipt(bearer(t, token(t, agent("support-bot", "alice"))), req))
			}, &notVia},
			{"an untrusted service", func() error { return second(e.serviceReceipts("mcpbridge").GetReceipt(testCtx(t), req)) }, &notVia},
			{"no token", func() error { return second(e.directReceipts.GetReceipt(testCtx(t), req)) },
				&refusal{codes.Unauthenticated, identity.Stage, backend.CodeAuthenticationMissingCredentials}},
			{"no invocation id", func() error {
				return second(e.receipts.GetReceipt(testCtx(t), &mandatev1.GetReceiptRequest{}))
			}, &refusal{codes.InvalidArgument, "schema_validate", "schema.invalid"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				err := tt.call()
				if tt.want == nil {
					mustOK(t, err)
					return
				}
				checkRefusal(t, err, *tt.want)
			})
		}
	})
}

// faultyStore injects a failure into the transactions of a working store, once armed.
type faultyStore struct {
	helpdesk.Store
	// failRecord makes RecordReceipt fail, after the effect's writes.
	failRecord atomic.Bool
	// failCommit makes the transaction fail after the effect and its receipt were written.
	failCommit atomic.Bool
}

var errInjected = errors.New("injected failure")

func (s *faultyStore) InTx(ctx context.Context, fn func(tx helpdesk.Tx) error) error {
	return s.Store.InTx(ctx, func(tx helpdesk.Tx) error {
		if err := fn(faultyTx{tx, s}); err != nil {
			return err
		}
		if s.failCommit.Load() {
			return errInjected
		}
		return nil
	})
}

type faultyTx struct {
	helpdesk.Tx
	s *faultyStore
}

func (t faultyTx) RecordReceipt(ctx context.Context, r receipt.Receipt) error {
	if t.s.failRecord.Load() {
		return fmt.Errorf("recording %s: %w", r.InvocationID, errInjected)
	}
	return t.Tx.RecordReceipt(ctx, r)
}

// TestReceiptCommitsWithEffect: a failure inside the transaction after the effect — recording the
// receipt, or anything after it — leaves neither the effect nor the receipt, and the executor
// is told NOT_EXECUTED; the same command then runs normally under a new invocation.
func TestReceiptCommitsWithEffect(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		for _, fault := range []string{"receipt fails", "commit fails"} {
			for _, c := range commands {
				if c.name == "IssueRefund" {
					// The fake gateway is outside the transaction: it counts a refund the
					// rollback cannot take back (see issueRefund). Its rows are checked below.
					continue
				}
				t.Run(fault+"/"+c.name, func(t *testing.T) {
					fs := &faultyStore{}
					e := start(t, func(t *testing.T) helpdesk.Store { fs.Store = newStore(t); return fs })
					map[string]*atomic.Bool{"receipt fails": &fs.failRecord, "commit fails": &fs.failCommit}[fault].Store(true)
					id := "inv-failed-" + c.name
					_, err := c.call(redeliver(t, c.caller, id), e.exec)
					checkRefusal(t, err, refusal{codes.Internal, helpdesk.StageDispatch, "internal.error"})
					if n := c.effects(t, e); n != 0 {
						t.Errorf("the effect happened %d times after the failure, want never", n)
					}
					fs.failRecord.Store(false)
					fs.failCommit.Store(false)
					got, err := e.receipts.GetReceipt(testCtx(t), &mandatev1.GetReceiptRequest{InvocationId: id})
					mustOK(t, err)
					if got.GetState() != mandatev1.ReceiptState_RECEIPT_STATE_NOT_EXECUTED {
						t.Fatalf("receipt after the failure = %v, want NOT_EXECUTED", got)
					}
					mustOK(t, second(c.call(as(t, c.caller), e.exec)))
					if n := c.effects(t, e); n != 1 {
						t.Errorf("a new invocation: the effect happened %d times, want once", n)
					}
				})
			}
		}
		t.Run("refund rows", func(t *testing.T) {
			fs := &faultyStore{}
			e := start(t, func(t *testing.T) helpdesk.Store { fs.Store = newStore(t); return fs })
			fs.failRecord.Store(true)
			_, err := commands[0].call(redeliver(t, user("carol"), "inv-failed-refund"), e.exec)
			checkRefusal(t, err, refusal{codes.Internal, helpdesk.StageDispatch, "internal.error"})
			rows, _ := e.store.Refunds(testCtx(t), "acme", "T-1001")
			tk, _ := e.store.Ticket(testCtx(t), "acme", "T-1001")
			if len(rows) != 0 || !tk.Refunded.IsZero() {
				t.Errorf("after the rollback: %d refund rows, %+v booked; want none", len(rows), tk.Refunded)
			}
		})
	})
}
