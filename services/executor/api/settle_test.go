package api_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/executor"
)

// Issue 31 item 8: every way a call is settled records what an execution
// records. Lena submits her own expense report; however the executor
// learns that the submit ran — a retry asking the receipt after the
// executor that dispatched it died, the reconciler asking the receipt, or
// an operator's verdict — her approve of the same report is refused at
// sod_check with sod.conflict (before the fix it reached
// confirmation.required: the settled submit left no execution), and the
// submit's domain event is in the outbox.

// dyingDispatcher sends a call to the backend, which commits it, and then
// never answers: the executor that dispatched it is dead from then on
// (died is closed), until release is closed at the end of the test.
type dyingDispatcher struct {
	inner   executor.Dispatcher
	died    chan struct{}
	release chan struct{}
	// invocation is the dead call's invocation id.
	invocation atomic.Value
}

func (d *dyingDispatcher) Dispatch(ctx context.Context, disp executor.Dispatch) (executor.Reply, error) {
	_, err := d.inner.Dispatch(ctx, disp)
	d.invocation.Store(disp.InvocationID)
	close(d.died)
	<-d.release
	if err != nil {
		return executor.Reply{}, err
	}
	return executor.Reply{}, status.Error(codes.Unavailable, "the executor died")
}

// deadStore is the dead executor's view of the executor's store once it
// died: it renews no lease and records nothing more.
type deadStore struct {
	executor.Store
	dead atomic.Bool
}

func (s *deadStore) Renew(ctx context.Context, key executor.IdemKey, inv string, lease time.Duration) (bool, error) {
	if s.dead.Load() {
		return false, executor.ErrUnavailable
	}
	return s.Store.Renew(ctx, key, inv, lease)
}

func (s *deadStore) Finish(ctx context.Context, f executor.Finish) error {
	if s.dead.Load() {
		return executor.ErrUnavailable
	}
	return s.Store.Finish(ctx, f)
}

// settleEnv is the harness with a short lease, the executor's
// configuration kept for the other executors a test builds beside it.
type settleEnv struct {
	*env
	base executor.Config
}

const settleLease = 300 * time.Millisecond

func startSettle(t *testing.T, st stores, opts ...func(*executor.Config)) *settleEnv {
	t.Helper()
	s := &settleEnv{}
	s.env = start(t, st, append(opts, func(c *executor.Config) {
		c.Lease = settleLease
		s.base = *c
	})...)
	return s
}

// lenasReport is a draft report lena created.
func (s *settleEnv) lenasReport(t *testing.T) string {
	t.Helper()
	created, err := s.execute(t, as(token(t, "acme", "lena", "")), "expense.report.create", createInput)
	if err != nil {
		t.Fatal(err)
	}
	return created.GetResult().GetFields()["report_id"].GetStringValue()
}

// submitAndDie has an executor beside the harness's submit lena's report
// with key, and die once the backend committed it: it never answers,
// renews the key's lease or records anything more. It returns the dead
// invocation's id.
func (s *settleEnv) submitAndDie(t *testing.T, report, key string) string {
	t.Helper()
	dying := &dyingDispatcher{inner: s.base.Dispatcher, died: make(chan struct{}), release: make(chan struct{})}
	store := &deadStore{Store: s.base.Store}
	cfg := s.base
	cfg.Dispatcher, cfg.Store = dying, store
	doomed, err := executor.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lena := token(t, "acme", "lena", "")
	ctx := identity.WithRawToken(identity.WithPrincipal(context.Background(),
		identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "lena"}), lena)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = doomed.Execute(ctx, executor.Call{Code: "expense.report.submit", Input: []byte(fmt.Sprintf(`{"report_id":%q}`, report)),
			IdempotencyKey: key, Channel: "grpc"})
	}()
	// Cleanups run last-in first-out: the dead executor's call ends
	// before the harness's stores close.
	t.Cleanup(func() {
		close(dying.release)
		<-done
		doomed.Close()
	})
	select {
	case <-dying.died:
	case <-done:
		t.Fatal("the submit ended before it was dispatched")
	case <-time.After(10 * time.Second):
		t.Fatal("the submit was never dispatched")
	}
	store.dead.Store(true)
	inv := dying.invocation.Load().(string)
	// Its intent was durable in the executor's outbox before the dispatch;
	// the relay (here the dead executor's own, in a deployment any
	// replica's on the same database) appends it to the trail.
	if rows := s.rows(t, "acme", inv, 1); len(rows) != 1 || rows[0].Phase != audit.PhaseIntent {
		t.Fatalf("rows of the dead invocation: %+v, want its intent", rows)
	}
	return inv
}

// reconciler is a second executor that settles what the trail leaves
// open from the receipts: intents without outcome at once, unknown
// outcomes older than 100ms.
func (s *settleEnv) reconciler(t *testing.T) *executor.Executor {
	t.Helper()
	cfg := s.base
	cfg.Intents = cfg.Audit.(executor.IntentSource)
	cfg.ReconcileAfter, cfg.ReconcileInterval = time.Nanosecond, 100*time.Millisecond
	r, err := executor.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// approveRefused asserts that lena's approve of report is refused for
// separation of duties, and that invocation's submit has its domain event.
func (s *settleEnv) approveRefused(t *testing.T, report, invocation string) {
	t.Helper()
	_, err := s.execute(t, as(token(t, "acme", "lena", "")), "expense.report.approve", fmt.Sprintf(`{"report_id":%q}`, report))
	if ce := refusal(err); ce.GetStage() != "sod_check" || ce.GetCode() != "sod.conflict" {
		t.Fatalf("lena approving the report she submitted: %v (stage %q code %q), want sod_check sod.conflict", err, ce.GetStage(), ce.GetCode())
	}
	evs, err := s.execStore.Events(context.Background(), "acme", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if ev.InvocationID == invocation {
			n++
			if ev.Command != "expense.report.submit" || ev.Subject != report || ev.UserID != "lena" {
				t.Errorf("the submit's event: %+v", ev)
			}
		}
	}
	if n != 1 {
		t.Fatalf("%d events of the settled submit %s, want 1", n, invocation)
	}
}

// row waits for invocation's row of phase.
func (s *settleEnv) row(t *testing.T, invocation string, phase audit.Phase) audit.Stored {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		rows := s.rows(t, "acme", invocation, 0)
		if i := slices.IndexFunc(rows, func(r audit.Stored) bool { return r.Phase == phase }); i >= 0 {
			return rows[i]
		}
		if time.Now().After(deadline) {
			t.Fatalf("invocation %s has no %s row: %+v", invocation, phase, rows)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestASubmitReplayedFromItsReceiptForbidsTheApprove (ER-2019): lena's
// executor dies after the backend committed her keyed submit; her retry
// finds the key's lease lapsed, asks the receipt, which says the submit
// ran, and replays it. The dead invocation's trail gets its executed
// outcome from the retry, and her approve is refused sod.conflict.
func TestASubmitReplayedFromItsReceiptForbidsTheApprove(t *testing.T) {
	eachStore(t, testASubmitReplayedFromItsReceiptForbidsTheApprove)
}

func testASubmitReplayedFromItsReceiptForbidsTheApprove(t *testing.T, st stores) {
	s := startSettle(t, st)
	report := s.lenasReport(t)
	dead := s.submitAndDie(t, report, "submit-once")
	var res *mandatev1.ExecuteResponse
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(settleLease / 3) {
		var err error
		res, err = s.execute(t, as(token(t, "acme", "lena", "")), "expense.report.submit", fmt.Sprintf(`{"report_id":%q}`, report), withKey("submit-once"))
		if err == nil {
			break
		}
		if ce := refusal(err); ce.GetCode() != "idempotency.in_flight" || time.Now().After(deadline) {
			t.Fatalf("the retry: %v (%v)", err, ce)
		}
	}
	if !res.GetReplayed() || res.GetInvocationId() != dead {
		t.Fatalf("the retry: replayed %v of %s, want the replay of %s", res.GetReplayed(), res.GetInvocationId(), dead)
	}
	s.approveRefused(t, report, dead)
	if out := s.row(t, dead, audit.PhaseOutcome); out.Outcome != audit.OutcomeExecuted || !strings.Contains(out.Message, "receipt") {
		t.Fatalf("the dead invocation's outcome: %+v", out)
	}
}

// TestASubmitTheReconcilerSettlesForbidsTheApprove: lena's executor dies
// after the backend committed her submit, and nobody retries; the
// reconciler settles the intent from the receipt (an executed outcome),
// and her approve is refused sod.conflict.
func TestASubmitTheReconcilerSettlesForbidsTheApprove(t *testing.T) {
	eachStore(t, testASubmitTheReconcilerSettlesForbidsTheApprove)
}

func testASubmitTheReconcilerSettlesForbidsTheApprove(t *testing.T, st stores) {
	s := startSettle(t, st)
	report := s.lenasReport(t)
	dead := s.submitAndDie(t, report, "")
	r := s.reconciler(t)
	if _, err := r.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if out := s.row(t, dead, audit.PhaseOutcome); out.Outcome != audit.OutcomeExecuted || !strings.Contains(out.Message, "receipt") {
		t.Fatalf("the reconciled outcome: %+v", out)
	}
	s.approveRefused(t, report, dead)
}

// TestAnUnknownSubmitTheReconcilerResolvesForbidsTheApprove: the answer to
// lena's submit is lost while the receipts are unreachable, so its outcome
// says unknown; once they answer, the reconciler resolves it as executed,
// and her approve is refused sod.conflict.
func TestAnUnknownSubmitTheReconcilerResolvesForbidsTheApprove(t *testing.T) {
	eachStore(t, testAnUnknownSubmitTheReconcilerResolvesForbidsTheApprove)
}

func testAnUnknownSubmitTheReconcilerResolvesForbidsTheApprove(t *testing.T, st stores) {
	lossy := &lossyDispatcher{}
	s := startSettle(t, st, func(c *executor.Config) {
		lossy.inner = c.Dispatcher.(*executor.GRPCDispatcher)
		c.Dispatcher = lossy
	})
	report := s.lenasReport(t)
	inv := s.unknownSubmit(t, lossy, report)
	lossy.receiptsDown.Store(false)
	r := s.reconciler(t)
	deadline := time.Now().Add(5 * time.Second)
	for {
		// The unknown outcome is settled once it is older than the
		// reconciler's interval.
		if _, err := r.Reconcile(context.Background()); err != nil {
			t.Fatal(err)
		}
		rows := s.rows(t, "acme", inv, 0)
		if i := slices.IndexFunc(rows, func(r audit.Stored) bool { return r.Phase == audit.PhaseResolution }); i >= 0 {
			if rows[i].Outcome != audit.OutcomeExecuted || rows[i].Code != "audit.resolved_executed" {
				t.Fatalf("the resolution: %+v", rows[i])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the unknown outcome was never resolved: %+v", rows)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.approveRefused(t, report, inv)
}

// unknownSubmit submits lena's report with its answer lost while the
// receipts are unreachable: the outcome says unknown, and nothing records
// that the submit ran.
func (s *settleEnv) unknownSubmit(t *testing.T, lossy *lossyDispatcher, report string) string {
	t.Helper()
	lossy.loseAnswer.Store(true)
	lossy.receiptsDown.Store(true)
	defer lossy.loseAnswer.Store(false)
	_, err := s.execute(t, as(token(t, "acme", "lena", "")), "expense.report.submit", fmt.Sprintf(`{"report_id":%q}`, report))
	inv := refusal(err).GetInvocationId()
	if rows := s.rows(t, "acme", inv, 2); len(rows) != 2 || rows[1].Outcome != audit.OutcomeUnknown {
		t.Fatalf("the submit's rows: %+v (%v)", rows, err)
	}
	return inv
}

// TestASubmitAnOperatorResolvesAsExecutedForbidsTheApprove: lena's submit
// has an unknown outcome and no receipt can answer; an operator resolves
// it as executed, and her approve is refused sod.conflict.
func TestASubmitAnOperatorResolvesAsExecutedForbidsTheApprove(t *testing.T) {
	eachStore(t, testASubmitAnOperatorResolvesAsExecutedForbidsTheApprove)
}

func testASubmitAnOperatorResolvesAsExecutedForbidsTheApprove(t *testing.T, st stores) {
	lossy := &lossyDispatcher{}
	s := startSettle(t, st, func(c *executor.Config) {
		lossy.inner = c.Dispatcher.(*executor.GRPCDispatcher)
		c.Dispatcher = lossy
	})
	if _, err := directory.Apply(context.Background(), s.dir, []byte(operatorPolicy)); err != nil {
		t.Fatal(err)
	}
	report := s.lenasReport(t)
	inv := s.unknownSubmit(t, lossy, report)
	resp, err := mandatev1.NewExecutorServiceClient(s.conn).Resolve(as(token(t, "acme", "olive", "")), &mandatev1.ResolveRequest{
		InvocationId: inv, Verdict: "executed", Reason: "the report shows as submitted",
	})
	if err != nil || resp.GetRecord().GetOutcome() != "executed" || resp.GetReceipt() != "" {
		t.Fatalf("resolve: %v %v", resp, err)
	}
	s.approveRefused(t, report, inv)
}

// TestTheReconcilerWaitsForTheOutbox: an intent the trail holds without an
// outcome is not a lost call while the invocation still has a row in the
// executor's outbox — its outcome, on its way behind it (the trail came
// back after an outage longer than the reconciler's wait, and the rows
// keep the time they were made durable). The reconciler leaves it, and
// asks no receipt; once the outbox is empty, the intent is open for real
// and is settled from the receipt.
func TestTheReconcilerWaitsForTheOutbox(t *testing.T) {
	eachStore(t, testTheReconcilerWaitsForTheOutbox)
}

func testTheReconcilerWaitsForTheOutbox(t *testing.T, st stores) {
	s := startSettle(t, st)
	report := s.lenasReport(t)
	dead := s.submitAndDie(t, report, "")
	// The store says the invocation still has a row in the outbox (its
	// outcome, on its way); the conformance suite holds the stores to
	// saying so (Spooling).
	outboxed := &heldOutbox{Store: s.base.Store, invocation: dead}
	outboxed.held.Store(true)
	cfg := s.base
	cfg.Store = outboxed
	cfg.Intents = cfg.Audit.(executor.IntentSource)
	cfg.ReconcileAfter, cfg.ReconcileInterval = time.Nanosecond, time.Hour
	r, err := executor.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if n, err := r.Reconcile(context.Background()); err != nil || n != 0 {
		t.Fatalf("Reconcile with the outcome in the outbox settled %d (%v), want none", n, err)
	}
	if rows := s.rows(t, "acme", dead, 1); len(rows) != 1 {
		t.Fatalf("rows of %s: %+v, want its intent alone", dead, rows)
	}
	// The outbox holds nothing of it any more: the intent is open for
	// real, and the receipt settles it.
	outboxed.held.Store(false)
	if n, err := r.Reconcile(context.Background()); err != nil || n != 1 {
		t.Fatalf("Reconcile once the outbox is empty settled %d (%v), want the intent", n, err)
	}
	if out := s.row(t, dead, audit.PhaseOutcome); out.Outcome != audit.OutcomeExecuted || !strings.Contains(out.Message, "receipt") {
		t.Fatalf("the reconciled outcome: %+v", out)
	}
}

// heldOutbox is an executor store that, while held is set, says that one
// invocation still has a row in the outbox (Spooling).
type heldOutbox struct {
	executor.Store
	invocation string
	held       atomic.Bool
}

func (h *heldOutbox) Spooling(ctx context.Context, tenant string, ids []string) ([]string, error) {
	got, err := h.Store.Spooling(ctx, tenant, ids)
	if h.held.Load() && slices.Contains(ids, h.invocation) && !slices.Contains(got, h.invocation) {
		got = append(got, h.invocation)
	}
	return got, err
}
