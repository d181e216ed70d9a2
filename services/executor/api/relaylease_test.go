package api_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/executor"
)

// Issue 28 §6: the executors that share a store relay its rows one at a
// time (the relay lease, executor.RelayLeaser).

// countingAudit counts, per row (tenant, invocation, phase), how many
// times the executors asked the trail to append it.
type countingAudit struct {
	executor.AuditClient
	mu   sync.Mutex
	sent map[string]int
}

func (c *countingAudit) Append(ctx context.Context, req *mandatev1.AppendRequest, opts ...grpc.CallOption) (*mandatev1.AppendResponse, error) {
	c.mu.Lock()
	if c.sent == nil {
		c.sent = map[string]int{}
	}
	for _, r := range req.GetRecords() {
		c.sent[r.GetTenant()+"/"+r.GetInvocationId()+"/"+r.GetPhase()]++
	}
	c.mu.Unlock()
	return c.AuditClient.Append(ctx, req, opts...)
}

// duplicates lists the rows asked for more than once.
func (c *countingAudit) duplicates() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	dup := map[string]int{}
	for k, n := range c.sent {
		if n > 1 {
			dup[k] = n
		}
	}
	return dup
}

// TestTwoRelaysSendEachRowOnce: two executors on one store (two replicas
// on one database), each with callers of its own, relay the shared outbox
// one round at a time: the trail is asked to append every row exactly
// once — no duplicate is sent, not even one it would drop — whether the
// executors read the whole store every second (their tick) or every 5ms
// (full rounds racing the rounds that send an executor's own rows); every
// caller's intents are in the chain in the order its calls ran, each
// call's outcome after its intent; the chain verifies and the outbox
// empties.
func TestTwoRelaysSendEachRowOnce(t *testing.T) {
	for _, tick := range []time.Duration{time.Second, 5 * time.Millisecond} {
		t.Run(fmt.Sprint("tick=", tick), func(t *testing.T) {
			eachStore(t, func(t *testing.T, st stores) { testTwoRelaysSendEachRowOnce(t, st, tick) })
		})
	}
}

func testTwoRelaysSendEachRowOnce(t *testing.T, st stores, tick time.Duration) {
	counting := &countingAudit{}
	var base executor.Config
	e := start(t, st, func(c *executor.Config) {
		counting.AuditClient = c.Audit
		c.Audit = counting
		c.SpoolInterval = tick
		base = *c
	})
	if _, ok := e.execStore.(executor.RelayLeaser); !ok {
		t.Fatalf("the %s store does not lease relay rounds", st)
	}
	other, err := executor.New(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	before := e.rowCount(t, "acme")
	const callers, each = 8, 15
	invs := make([][]string, callers)
	var wg sync.WaitGroup
	for i := range callers {
		ex := e.pipeline
		if i%2 == 1 {
			ex = other
		}
		wg.Go(func() {
			for range each {
				inv, err := searchAs(t, ex)
				if err != nil {
					t.Error(err)
					return
				}
				invs[i] = append(invs[i], inv)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	total := 0
	for i, calls := range invs {
		last := int64(0)
		for _, inv := range calls {
			rows := waitRows(t, e.audit, "acme", inv, 2)
			if len(rows) != 2 || rows[0].Phase != audit.PhaseIntent || rows[1].Phase != audit.PhaseOutcome {
				t.Fatalf("rows of %s: %+v, want the intent, then the outcome, once each", inv, rows)
			}
			// A call's outcome is spooled after its reply: the caller's
			// next intent may precede it.
			if rows[0].Seq <= last || rows[1].Seq <= rows[0].Seq {
				t.Fatalf("caller %d: the intent and outcome of %s at seqs %d, %d, its previous call's intent at %d: want the intents in the order the calls ran, each outcome after its intent",
					i, inv, rows[0].Seq, rows[1].Seq, last)
			}
			last = rows[0].Seq
			total += 2
		}
	}
	if n := e.rowCount(t, "acme"); n != before+total {
		t.Fatalf("the trail gained %d rows, want %d", n-before, total)
	}
	if dup := counting.duplicates(); len(dup) > 0 {
		t.Fatalf("rows the trail was asked to append more than once (row: times): %v", dup)
	}
	if v, err := e.audit.Verify(context.Background(), "acme"); err != nil || !v.OK {
		t.Fatalf("verify: %+v %v", v, err)
	}
	e.outboxEmpties(t)
}

// hangingAudit is a trail that, while hung, answers no append until the
// caller gives up (its context ends); entered says an append is waiting.
type hangingAudit struct {
	executor.AuditClient
	hung    atomic.Bool
	entered chan struct{}
}

func (h *hangingAudit) Append(ctx context.Context, req *mandatev1.AppendRequest, opts ...grpc.CallOption) (*mandatev1.AppendResponse, error) {
	if h.hung.Load() {
		select {
		case h.entered <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return h.AuditClient.Append(ctx, req, opts...)
}

// spoolOne spools a row straight into the store (no relay is woken).
func spoolOne(t *testing.T, st executor.Store, inv string) {
	t.Helper()
	rec, err := proto.MarshalOptions{Deterministic: true}.Marshal(&mandatev1.AuditRecord{Tenant: "acme", InvocationId: inv, Command: "ticket.search", Channel: "grpc",
		Phase: string(audit.PhaseIntent), Outcome: string(audit.OutcomePending), Time: timestamppb.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Spool(context.Background(), executor.SpooledRow{Tenant: "acme", InvocationID: inv, Record: rec, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

// wantLeaseFree asserts that the store's relay lease is free, and leaves it so.
func wantLeaseFree(t *testing.T, l executor.RelayLeaser, when string) {
	t.Helper()
	lease, err := l.TryRelayLease(context.Background(), nil)
	if err != nil || lease == nil {
		t.Fatalf("%s: TryRelayLease = %v, %v; want the lease free", when, lease, err)
	}
	lease.Release()
}

// TestTheRelayLeaseIsReleased: a relay round gives the store's relay
// lease back when the trail is down (the round fails, its rows stay
// spooled) and when its context is cancelled while the trail does not
// answer; while that round waits, the lease is held (another relay is
// refused).
func TestTheRelayLeaseIsReleased(t *testing.T) { eachStore(t, testTheRelayLeaseIsReleased) }

func testTheRelayLeaseIsReleased(t *testing.T, st stores) {
	flaky := &flakyAudit{}
	hanging := &hangingAudit{entered: make(chan struct{}, 1)}
	e := start(t, st, func(c *executor.Config) {
		flaky.AuditClient = c.Audit
		hanging.AuditClient = flaky
		c.Audit = hanging
		c.SpoolInterval = time.Hour
		c.OutcomeAttemptTimeout = time.Minute
	})
	l, ok := e.execStore.(executor.RelayLeaser)
	if !ok {
		t.Fatalf("the %s store does not lease relay rounds", st)
	}
	spoolOne(t, e.execStore, "inv-lease-1")

	flaky.down.Store(true)
	if _, err := e.pipeline.FlushSpool(context.Background()); err == nil {
		t.Fatal("FlushSpool with the trail down succeeded")
	}
	wantLeaseFree(t, l, "after a round failed with the trail down")
	if rows, err := e.execStore.Spooled(context.Background(), 10); err != nil || len(rows) != 1 {
		t.Fatalf("spooled after the failed round: %d rows, %v; want the one", len(rows), err)
	}

	flaky.down.Store(false)
	hanging.hung.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // before the executor closes, should the test fail
	done := make(chan error, 1)
	go func() {
		_, err := e.pipeline.FlushSpool(ctx)
		done <- err
	}()
	select {
	case <-hanging.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("after 10s the round has not asked the trail")
	}
	if lease, err := l.TryRelayLease(context.Background(), nil); lease != nil || err != nil {
		if lease != nil {
			lease.Release()
		}
		t.Fatalf("TryRelayLease while a round waits on the trail = %v, %v; want it refused", lease, err)
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("FlushSpool whose context was cancelled succeeded")
	}
	wantLeaseFree(t, l, "after a round's context was cancelled")

	hanging.hung.Store(false)
	if n, err := e.pipeline.FlushSpool(context.Background()); err != nil || n != 1 {
		t.Fatalf("FlushSpool = %d, %v; want the row", n, err)
	}
}

// TestARelaySendsTheOlderRowsOfOthers: a row another executor spooled
// (here, straight into the store: that executor's relay is gone, or
// starved of the lease by a busier one) waits before this executor's
// rows; the round woken by this executor's call sends it first, then the
// call's rows, without waiting for a tick (an hour away).
func TestARelaySendsTheOlderRowsOfOthers(t *testing.T) {
	eachStore(t, testARelaySendsTheOlderRowsOfOthers)
}

func testARelaySendsTheOlderRowsOfOthers(t *testing.T, st stores) {
	e := start(t, st, func(c *executor.Config) { c.SpoolInterval = time.Hour })
	spoolOne(t, e.execStore, "inv-of-another")
	inv, err := searchAs(t, e.pipeline)
	if err != nil {
		t.Fatal(err)
	}
	rows := waitRows(t, e.audit, "acme", inv, 2)
	others := waitRows(t, e.audit, "acme", "inv-of-another", 1)
	if len(others) != 1 || others[0].Seq >= rows[0].Seq {
		t.Fatalf("the other executor's row %+v, the call's %+v: want the other's first", others, rows)
	}
}
