package executor

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
)

// savedCode is the code of the failure a saved response replays.
func savedCode(t *testing.T, s Saved) string {
	t.Helper()
	var st spb.Status
	if err := proto.Unmarshal(s.Status, &st); err != nil {
		t.Fatalf("saved status: %v", err)
	}
	fe, ok := failure.FromStatus(status.FromProto(&st))
	if !ok {
		t.Fatalf("the saved status %v carries no code", &st)
	}
	return fe.Code
}

// TestStageDispatch runs dispatch alone, after the intent.
//   - The call is sent once, with its invocation id, key, request and
//     deadline (the command's, else the deployment's); its result is the
//     answer, with the intent's audit id; one outcome row executed, with
//     the result's digest; the key settled on the response, the event
//     published.
//   - A call provably never sent (ErrNotSent) fails, and gives its key and
//     its grant back, so a retry runs.
//   - A backend's refusal keeps its stage and code (outcome refused), and
//     the key keeps it for a retry to replay.
//   - No answer: the backend's receipt decides — none, the effect is
//     unknown (the key keeps the failure); never ran, the call failed and
//     gives key and grant back; ran, its result is the answer.
//   - In check mode nothing is sent and nothing written.
func TestStageDispatch(t *testing.T) {
	alice := testPrincipal("acme", "alice", "")
	bot := testPrincipal("acme", "carol", "finance-bot")
	create := Call{Code: "expense.report.create", Input: []byte(createArgs), Channel: "grpc", IdempotencyKey: "key-1"}
	refund := Call{Code: "ticket.refund", Input: []byte(refundArgs), Channel: "mcp", IdempotencyKey: "key-2", GrantID: "ch-1"}
	createKey := IdemKey{Tenant: "acme", User: "alice", Command: "expense.report.create", Key: "key-1"}
	refundKey := IdemKey{Tenant: "acme", User: "carol", Command: "ticket.refund", Key: "key-2"}
	reply := Reply{JSON: []byte(`{"report_id":"ER-9","status":"EXPENSE_REPORT_STATUS_DRAFT"}`)}

	// dispatch runs the stage on a call prepared through the intent, with
	// the backend scripted, and waits for the rows written after the
	// answer; it returns the rows the stage wrote.
	dispatch := func(t *testing.T, h *stageHarness, ctx context.Context, inv *invocation) ([]*mandatev1.AuditRecord, *Result, error) {
		t.Helper()
		mark, outboxMark := h.audit.mark(), len(h.store.outbox(t))
		res, err := h.run(t, ctx, inv, StageDispatch)
		h.e.wg.Wait()
		// A call whose intent is durable writes its later rows to the
		// outbox, after the intent; a fallback writes them to the trail.
		return append(h.audit.since(mark), h.store.outbox(t)[outboxMark:]...), res, err
	}
	// grantGivenBack reports whether the grant inv redeemed was released.
	grantGivenBack := func(h *stageHarness) bool { return h.confirm.calls().release == 1 }

	t.Run("executed", func(t *testing.T) {
		h := newStageHarness(t)
		h.disp.script(func(d *fakeDispatcher) { d.reply = reply })
		ctx, inv := h.prepared(t, alice, create, StageDispatch, false)
		rows, res, err := dispatch(t, h, ctx, inv)
		// The intent's place in the chain is not known at dispatch (the
		// relay appends it later): the result names the invocation only.
		if err != nil || res == nil || string(res.Output) != string(reply.JSON) || res.InvocationID != inv.id || res.AuditID != "" || res.Replayed {
			t.Fatalf("got (%+v, %v), want the result of %s, no audit id", res, err, inv.id)
		}
		sent := h.disp.dispatched()
		if len(sent) != 1 {
			t.Fatalf("%d dispatches, want one", len(sent))
		}
		d := sent[0]
		if d.InvocationID != inv.id || d.IdempotencyKey != "key-1" || d.Command.Code != "expense.report.create" ||
			!proto.Equal(d.Request, inv.req) || d.Method.FullName() != inv.method.FullName() || d.Deadline != defaultDeadline {
			t.Errorf("dispatched %+v, want this invocation's request, key and the default deadline", d)
		}
		wantOutcomeRow(t, rows, inv, contract.OutcomeExecuted, "", "")
		if rows[0].GetResultDigest() != digest("result", reply.JSON) {
			t.Errorf("the outcome row's result digest %q is not the result's", rows[0].GetResultDigest())
		}
		if r := h.store.key(createKey); r == nil || !r.done || string(r.saved.Output) != string(reply.JSON) || r.saved.AuditID != "" || r.saved.InvocationID != inv.id {
			t.Errorf("the key holds %+v, want the response settled", r)
		}
		if f := h.store.finishes(); len(f) != 1 || f[0].Event == nil || f[0].Event.InvocationID != inv.id || f[0].Event.Command != "expense.report.create" {
			t.Errorf("saved %+v, want the response and the event in one Finish", f)
		}
	})

	t.Run("declared deadline, approval kept", func(t *testing.T) {
		h := newStageHarness(t)
		h.disp.script(func(d *fakeDispatcher) { d.reply = Reply{JSON: []byte(`{"status":"REFUND_STATUS_ACCEPTED"}`)} })
		ctx, inv := h.prepared(t, bot, refund, StageDispatch, false)
		rows, _, err := dispatch(t, h, ctx, inv)
		if err != nil {
			t.Fatal(err)
		}
		if d := h.disp.dispatched(); len(d) != 1 || d[0].Deadline != 10*time.Second {
			t.Errorf("dispatched %+v, want ticket.refund's 10s deadline", d)
		}
		wantOutcomeRow(t, rows, inv, contract.OutcomeExecuted, "", "")
		if rows[0].GetApproval().GetApprover() != "carol" || grantGivenBack(h) {
			t.Errorf("outcome row %v: want carol's approval, and the grant spent", rows[0])
		}
	})

	t.Run("never sent: key and grant given back", func(t *testing.T) {
		h := newStageHarness(t)
		h.disp.script(func(d *fakeDispatcher) {
			d.err = failure.Wrap(StageDispatch, failure.CodeHandlerUnavailable, "no backend is configured", ErrNotSent)
		})
		ctx, inv := h.prepared(t, bot, refund, StageDispatch, false)
		rows, res, err := dispatch(t, h, ctx, inv)
		_ = wantRefusal(t, res, err, inv, StageDispatch, failure.CodeHandlerUnavailable)
		wantOutcomeRow(t, rows, inv, contract.OutcomeFailed, StageDispatch, failure.CodeHandlerUnavailable)
		if h.store.key(refundKey) != nil || !slices.Contains(h.store.released(), refundKey) || inv.idem != nil {
			t.Errorf("the key is still held: %+v", h.store.key(refundKey))
		}
		if !grantGivenBack(h) || inv.redeemedDigest != "" {
			t.Errorf("the grant was not given back: %+v", h.confirm.calls())
		}
		if f := h.store.finishes(); len(f) != 0 {
			t.Errorf("a call never sent saved %+v", f)
		}
	})

	t.Run("backend refusal: stage and code kept, the key replays it", func(t *testing.T) {
		h := newStageHarness(t)
		h.disp.script(func(d *fakeDispatcher) {
			fe := failure.New(failure.StageState, "state.not_draft", "the report is not a draft")
			fe.Status = codes.FailedPrecondition
			d.err = fe.GRPCStatus().Err()
		})
		ctx, inv := h.prepared(t, alice, create, StageDispatch, false)
		rows, res, err := dispatch(t, h, ctx, inv)
		_ = wantRefusal(t, res, err, inv, failure.StageState, "state.not_draft")
		wantOutcomeRow(t, rows, inv, contract.OutcomeRefused, failure.StageState, "state.not_draft")
		r := h.store.key(createKey)
		if r == nil || !r.done || r.saved.Output != nil || savedCode(t, r.saved) != "state.not_draft" {
			t.Errorf("the key holds %+v, want the refusal settled", r)
		}
	})

	t.Run("no answer, no receipt: effect unknown, key kept", func(t *testing.T) {
		h := newStageHarness(t)
		h.disp.script(func(d *fakeDispatcher) { d.err = status.Error(codes.Unavailable, "connection reset") })
		ctx, inv := h.prepared(t, bot, refund, StageDispatch, false)
		rows, res, err := dispatch(t, h, ctx, inv)
		fe := wantRefusal(t, res, err, inv, StageDispatch, failure.CodeHandlerUnavailable)
		if !strings.HasSuffix(fe.Message, "the effect is unknown") {
			t.Errorf("message %q does not say the effect is unknown", fe.Message)
		}
		// Keyed, so a retry is safe: it asks the receipt before running.
		if !fe.Retriable || !strings.Contains(fe.Remedy, "same idempotency key") {
			t.Errorf("refusal %+v, want retriable with the same key", fe)
		}
		wantOutcomeRow(t, rows, inv, contract.OutcomeUnknown, StageDispatch, failure.CodeHandlerUnavailable)
		if asked := h.disp.receipts(); len(asked) != 1 || asked[0].InvocationID != inv.id {
			t.Errorf("receipts asked %+v, want this invocation's", asked)
		}
		if r := h.store.key(refundKey); r == nil || !r.done || savedCode(t, r.saved) != failure.CodeHandlerUnavailable || grantGivenBack(h) {
			t.Errorf("the key holds %+v (grant given back %v), want the failure kept and the grant spent", r, grantGivenBack(h))
		}
	})

	t.Run("no answer, the backend cannot answer for its receipt either: bounded", func(t *testing.T) {
		// A backend whose database hangs: every receipt ask takes 1.5 s and
		// fails. Four asks with their pauses would hold the caller ~8 s;
		// the asks share one budget (receiptBudget), so the call is
		// answered, effect unknown and key kept, after at most three.
		h := newStageHarness(t)
		h.disp.script(func(d *fakeDispatcher) {
			d.err = status.Error(codes.Unavailable, "connection reset")
			d.receipt = func(Dispatch) (Receipt, error) {
				time.Sleep(1500 * time.Millisecond)
				return Receipt{}, status.Error(codes.Unavailable, "database unavailable")
			}
		})
		ctx, inv := h.prepared(t, bot, refund, StageDispatch, false)
		rows, res, err := dispatch(t, h, ctx, inv)
		if fe := wantRefusal(t, res, err, inv, StageDispatch, failure.CodeHandlerUnavailable); !fe.Retriable {
			t.Errorf("refusal %+v, want retriable with the same key", fe)
		}
		wantOutcomeRow(t, rows, inv, contract.OutcomeUnknown, StageDispatch, failure.CodeHandlerUnavailable)
		if asked := len(h.disp.receipts()); asked == 0 || asked >= receiptAttempts {
			t.Errorf("the receipt was asked %d times, want fewer than %d within the budget", asked, receiptAttempts)
		}
	})

	t.Run("no answer, the receipt says it never ran", func(t *testing.T) {
		h := newStageHarness(t)
		h.disp.script(func(d *fakeDispatcher) {
			d.err = status.Error(codes.DeadlineExceeded, "deadline exceeded")
			d.receipt = func(Dispatch) (Receipt, error) { return Receipt{}, nil }
		})
		ctx, inv := h.prepared(t, bot, refund, StageDispatch, false)
		rows, res, err := dispatch(t, h, ctx, inv)
		fe := wantRefusal(t, res, err, inv, StageDispatch, failure.CodeHandlerDeadlineExceeded)
		if !fe.Retriable || !strings.Contains(fe.Message, "did not execute") {
			t.Errorf("refusal %+v, want retriable, saying the call did not run", fe)
		}
		wantOutcomeRow(t, rows, inv, contract.OutcomeFailed, StageDispatch, failure.CodeHandlerDeadlineExceeded)
		if h.store.key(refundKey) != nil || !grantGivenBack(h) {
			t.Errorf("key %+v, grant given back %v: want both given back", h.store.key(refundKey), grantGivenBack(h))
		}
	})

	t.Run("no answer, the receipt says it ran", func(t *testing.T) {
		h := newStageHarness(t)
		h.disp.script(func(d *fakeDispatcher) {
			d.err = status.Error(codes.Unavailable, "connection reset")
			d.receipt = func(disp Dispatch) (Receipt, error) {
				return Receipt{Executed: true, Result: dynamicpb.NewMessage(disp.Method.Output())}, nil
			}
		})
		ctx, inv := h.prepared(t, alice, create, StageDispatch, false)
		rows, res, err := dispatch(t, h, ctx, inv)
		if err != nil || res == nil || string(res.Output) != "{}" {
			t.Fatalf("got (%+v, %v), want the receipt's result", res, err)
		}
		wantOutcomeRow(t, rows, inv, contract.OutcomeExecuted, "", "")
		if r := h.store.key(createKey); r == nil || !r.done || string(r.saved.Output) != "{}" {
			t.Errorf("the key holds %+v, want the receipt's result", r)
		}
	})

	t.Run("check mode: nothing sent", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, alice, create, StageDispatch, true)
		h.passes(t, ctx, inv, StageDispatch)
		h.e.wg.Wait()
		if n, f := h.disp.count(), h.store.finishes(); n != 0 || len(f) != 0 || h.store.key(createKey) != nil {
			t.Errorf("a check dispatched %d calls, saved %+v", n, f)
		}
	})
}
