package api_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/executor"
	execmem "github.com/mandate-dev/mandate/services/executor/memory"
)

// Issue 28 §6: a call's intent is made durable in the executor's own store
// (its outbox of audit rows) and relayed to the audit trail asynchronously.

// searchAs runs a search on ex directly, as alice.
func searchAs(t *testing.T, ex *executor.Executor) (string, error) {
	t.Helper()
	ctx := identity.WithRawToken(identity.WithPrincipal(context.Background(),
		identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "alice"}), token(t, "acme", "alice", ""))
	res, err := ex.Execute(ctx, executor.Call{Code: "ticket.search", Input: []byte(`{"query":"charged twice"}`), Channel: "grpc"})
	if err != nil {
		return "", err
	}
	return res.InvocationID, nil
}

// waitRows waits until the trail holds want rows of tenant's invocation
// (polling finely, so that the time it took is measured, not the poll's);
// it fails the test after 10s, which no relay woken by its rows comes near.
func waitRows(t *testing.T, st audit.Store, tenant, inv string, want int) []audit.Stored {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rows, err := st.Get(context.Background(), tenant, inv)
		if err != nil && !errors.Is(err, audit.ErrNotFound) {
			t.Fatal(err)
		}
		if len(rows) >= want {
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s the trail holds %d rows of %s, want %d", len(rows), inv, want)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// TestTheRelayIsWokenByItsRows: the relay appends a row as soon as it is
// durable, not at its next tick — here the tick is an hour away, and each
// call's intent and outcome still reach the trail, in order. The test logs
// how long after each call returned its outcome row (the later of the two)
// could be read from the trail: p50 and p99 over the calls (no assertion
// on time: the machine is shared).
func TestTheRelayIsWokenByItsRows(t *testing.T) { eachStore(t, testTheRelayIsWokenByItsRows) }

func testTheRelayIsWokenByItsRows(t *testing.T, st stores) {
	e := start(t, st, func(c *executor.Config) { c.SpoolInterval = time.Hour })
	const calls = 200
	lags := make([]time.Duration, 0, calls)
	for range calls {
		inv, err := searchAs(t, e.pipeline)
		if err != nil {
			t.Fatal(err)
		}
		returned := time.Now()
		rows := waitRows(t, e.audit, "acme", inv, 2)
		lags = append(lags, time.Since(returned))
		if len(rows) != 2 || rows[0].Phase != audit.PhaseIntent || rows[1].Phase != audit.PhaseOutcome || rows[0].Seq >= rows[1].Seq {
			t.Fatalf("rows of %s: %+v, want the intent, then the outcome", inv, rows)
		}
	}
	slices.Sort(lags)
	t.Logf("%s: a call's outcome row readable in the trail after it returned: p50 %v, p99 %v, max %v (%d calls, one at a time)",
		st, lags[len(lags)/2], lags[len(lags)*99/100], lags[len(lags)-1], calls)
	if v, err := e.audit.Verify(context.Background(), "acme"); err != nil || !v.OK {
		t.Fatalf("verify: %+v %v", v, err)
	}
}

// TestTwoRelaysOnOneStore: two executors on one store (two replicas on
// one database) both relay the shared outbox; the audit service appends a
// row once per (tenant, invocation, phase), so every row reaches the chain
// exactly once, each call's intent before its outcome, the chain verifies,
// and the outbox empties.
func TestTwoRelaysOnOneStore(t *testing.T) { eachStore(t, testTwoRelaysOnOneStore) }

func testTwoRelaysOnOneStore(t *testing.T, st stores) {
	var base executor.Config
	e := start(t, st, func(c *executor.Config) { base = *c })
	other, err := executor.New(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	before := e.rowCount(t, "acme")
	const callers, each = 8, 12
	var (
		mu   sync.Mutex
		invs []string
		wg   sync.WaitGroup
	)
	for i := range callers {
		ex := e.pipeline
		if i%2 == 1 {
			ex = other
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				inv, err := searchAs(t, ex)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				invs = append(invs, inv)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, inv := range invs {
		rows := waitRows(t, e.audit, "acme", inv, 2)
		if len(rows) != 2 || rows[0].Phase != audit.PhaseIntent || rows[1].Phase != audit.PhaseOutcome || rows[0].Seq >= rows[1].Seq {
			t.Fatalf("rows of %s: %+v, want the intent, then the outcome, once each", inv, rows)
		}
	}
	if n := e.rowCount(t, "acme"); n != before+2*len(invs) {
		t.Fatalf("the trail gained %d rows, want %d", n-before, 2*len(invs))
	}
	if v, err := e.audit.Verify(context.Background(), "acme"); err != nil || !v.OK {
		t.Fatalf("verify: %+v %v", v, err)
	}
	e.outboxEmpties(t)
}

// gatedSpooler is an executor store whose batch spooling waits, while
// gated, until the test lets the next batch through; it records the size
// of each batch.
type gatedSpooler struct {
	executor.Store
	gate    chan struct{}
	gated   atomic.Bool
	waiting atomic.Int32
	mu      sync.Mutex
	batches []int
	// lazyIntents counts intents in batches committed lazily (never
	// right); lazyOutcomes the batches of later rows committed lazily.
	lazyIntents, lazyOutcomes int
}

func (g *gatedSpooler) SpoolRows(ctx context.Context, rows []executor.SpooledRow, lazy bool) ([]int64, error) {
	if g.gated.Load() {
		g.waiting.Add(1)
		select {
		case <-g.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	intents := 0
	for _, r := range rows {
		var rec mandatev1.AuditRecord
		if err := proto.Unmarshal(r.Record, &rec); err == nil && rec.GetPhase() == string(audit.PhaseIntent) {
			intents++
		}
	}
	g.mu.Lock()
	g.batches = append(g.batches, len(rows))
	if intents > 0 && lazy {
		g.lazyIntents += intents
	}
	if intents == 0 && lazy {
		g.lazyOutcomes++
	}
	g.mu.Unlock()
	return g.Store.(executor.BatchSpooler).SpoolRows(ctx, rows, lazy)
}

// TestConcurrentIntentsShareACommit: the intents of calls that arrive
// while the executor's store commits an earlier batch are committed
// together, in one batch (group commit), each caller answered by it; every
// call runs and its rows reach the trail. A batch holding an intent is
// committed durably; one of outcomes alone lazily.
func TestConcurrentIntentsShareACommit(t *testing.T) { eachStore(t, testConcurrentIntentsShareACommit) }

func testConcurrentIntentsShareACommit(t *testing.T, st stores) {
	g := &gatedSpooler{gate: make(chan struct{})}
	e := start(t, st, func(c *executor.Config) {
		g.Store = c.Store
		c.Store = g
	})
	g.gated.Store(true)
	const callers = 6
	invs := make(chan string, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			inv, err := searchAs(t, e.pipeline)
			if err != nil {
				t.Error(err)
				return
			}
			invs <- inv
		})
	}
	// The first batch waits in the store; the other intents queue behind
	// it meanwhile.
	for deadline := time.Now().Add(10 * time.Second); g.waiting.Load() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no batch reached the store")
		}
	}
	time.Sleep(200 * time.Millisecond)
	g.gated.Store(false)
	close(g.gate)
	wg.Wait()
	close(invs)
	for inv := range invs {
		if rows := waitRows(t, e.audit, "acme", inv, 2); len(rows) != 2 {
			t.Fatalf("rows of %s: %+v", inv, rows)
		}
	}
	g.mu.Lock()
	batches := slices.Clone(g.batches)
	g.mu.Unlock()
	if slices.Max(batches) < 2 {
		t.Fatalf("batches %v: want the intents queued while a batch committed committed together", batches)
	}
	// An intent is committed durably, always; a batch of outcomes alone
	// need not wait for the WAL flush.
	g.mu.Lock()
	lazyIntents, lazyOutcomes := g.lazyIntents, g.lazyOutcomes
	g.mu.Unlock()
	if lazyIntents != 0 || lazyOutcomes == 0 {
		t.Fatalf("%d intents committed lazily (want none), %d batches of outcomes committed lazily (want some)", lazyIntents, lazyOutcomes)
	}
	t.Logf("%s: batches of rows committed: %v", st, batches)
}

// TestTheRelayCatchesUpInOrder: while the trail is down the calls run and
// their rows pile up in the outbox (the relay fails, and falls behind);
// once it is back, the next row's wake-up — the tick is an hour away —
// relays the backlog, oldest first, then that row: the chain holds the
// calls' intents in the order the calls ran, each call's outcome after its
// intent. Rows of later calls are then relayed straight from what the
// executor committed.
func TestTheRelayCatchesUpInOrder(t *testing.T) { eachStore(t, testTheRelayCatchesUpInOrder) }

func testTheRelayCatchesUpInOrder(t *testing.T, st stores) {
	flaky := &flakyAudit{}
	e := start(t, st, func(c *executor.Config) {
		flaky.AuditClient = c.Audit
		c.Audit = flaky
		c.SpoolInterval = time.Hour
	})
	flaky.down.Store(true)
	var invs []string
	for range 5 {
		inv, err := searchAs(t, e.pipeline)
		if err != nil {
			t.Fatal(err)
		}
		invs = append(invs, inv)
	}
	flaky.down.Store(false)
	for range 3 {
		inv, err := searchAs(t, e.pipeline)
		if err != nil {
			t.Fatal(err)
		}
		invs = append(invs, inv)
	}
	// Each intent is durable before its call runs, so the intents are in
	// the outbox in the order the calls ran; each outcome after its intent
	// (and after the reply: possibly after the next call's intent).
	var intents []int64
	for _, inv := range invs {
		rows := waitRows(t, e.audit, "acme", inv, 2)
		if len(rows) != 2 || rows[0].Phase != audit.PhaseIntent || rows[1].Phase != audit.PhaseOutcome || rows[0].Seq >= rows[1].Seq {
			t.Fatalf("rows of %s: %+v, want its intent, then its outcome", inv, rows)
		}
		intents = append(intents, rows[0].Seq)
	}
	if !slices.IsSorted(intents) {
		t.Fatalf("the intents' seqs, call after call: %v; want them in the order the calls ran", intents)
	}
	if v, err := e.audit.Verify(context.Background(), "acme"); err != nil || !v.OK {
		t.Fatalf("verify: %+v %v", v, err)
	}
}

// TestADownTrailIsNotAskedForEveryRow: while the trail is down, the rows
// the calls spool do not each wake the relay into another failing round:
// after a failed round it waits relayRetryAfter (100ms) before it tries
// again for rows spooled meanwhile. Over the calls made, the trail is asked
// at most once per 100ms they took (and once more), not once per row.
func TestADownTrailIsNotAskedForEveryRow(t *testing.T) {
	flaky := &flakyAudit{}
	e := start(t, memoryStores, func(c *executor.Config) {
		flaky.AuditClient = c.Audit
		c.Audit = flaky
		c.SpoolInterval = time.Hour
	})
	flaky.down.Store(true)
	const calls = 40
	begin := time.Now()
	var invs []string
	for range calls {
		inv, err := searchAs(t, e.pipeline)
		if err != nil {
			t.Fatal(err)
		}
		invs = append(invs, inv)
	}
	took := time.Since(begin)
	asked := int(flaky.refused.Load())
	if most := int(took/(100*time.Millisecond)) + 2; asked > most {
		t.Fatalf("the trail, down, was asked %d times over %d calls in %v; want at most %d", asked, calls, took, most)
	}
	flaky.down.Store(false)
	// The rows spooled meanwhile are relayed after the pause, without a
	// tick (an hour away) and without another row.
	for _, inv := range invs {
		waitRows(t, e.audit, "acme", inv, 2)
	}
	t.Logf("the trail, down, was asked %d times over %d calls in %v", asked, calls, took.Round(time.Millisecond))
}

// outboxEmpties waits until the executor's outbox holds no row (within 10 s).
func (e *env) outboxEmpties(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		left, err := e.execStore.Spooled(context.Background(), 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the outbox still holds %d rows", len(left))
		}
	}
}

// batchCounting is an audit store that records the invocations and phases
// of every batch appended to it.
type batchCounting struct {
	audit.Store
	mu      sync.Mutex
	batches [][]audit.Key
}

func (b *batchCounting) AppendBatch(ctx context.Context, recs []audit.Record) ([]audit.Stored, error) {
	keys := make([]audit.Key, len(recs))
	for i := range recs {
		keys[i] = recs[i].Key()
	}
	b.mu.Lock()
	b.batches = append(b.batches, keys)
	b.mu.Unlock()
	return b.Store.AppendBatch(ctx, recs)
}

// startLingering starts the sample's topology on b with a relay that
// lingers a second (and no tick): far longer than a call takes, even under
// the race detector on a loaded machine, so the tests below see what one
// append, and one commit of the outbox, carries — not how fast a call is.
func startLingering(t *testing.T, b backing) *env {
	t.Helper()
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	return startOn(t, b, set, func(c *executor.Config) {
		c.SpoolInterval = time.Hour
		c.RelayLinger = time.Second
	})
}

// TestACallsRowsReachTheTrailTogether: the relay woken by a call's intent
// lingers (Config.RelayLinger) before it reads the outbox, so the outcome
// spooled meanwhile goes in the same append — one transaction of the audit
// service for the call, not two, and no pending entry for its intent.
func TestACallsRowsReachTheTrailTogether(t *testing.T) {
	b := memoryBacking(t)
	counting := &batchCounting{Store: b.auditStore}
	b.auditStore = counting
	e := startLingering(t, b)
	for range 3 {
		inv, err := searchAs(t, e.pipeline)
		if err != nil {
			t.Fatal(err)
		}
		waitRows(t, e.audit, "acme", inv, 2)
		counting.mu.Lock()
		last := counting.batches[len(counting.batches)-1]
		counting.mu.Unlock()
		want := []audit.Key{{Tenant: "acme", InvocationID: inv, Phase: audit.PhaseIntent}, {Tenant: "acme", InvocationID: inv, Phase: audit.PhaseOutcome}}
		if !slices.Equal(last, want) {
			t.Fatalf("the append that took %s's rows carried %v, want its intent and outcome together", inv, last)
		}
	}
}

// TestARowReachesTheTrailAfterTheLinger: over Postgres with the linger an
// executor over a database uses (StoreRelayLinger), the test logs how long
// after each call returned its outcome row could be read from the trail —
// the linger plus one append, far inside the second a row has to be
// queryable (no assertion on time: the machine is shared).
func TestARowReachesTheTrailAfterTheLinger(t *testing.T) {
	e := start(t, postgresStores, func(c *executor.Config) {
		c.SpoolInterval = time.Hour
		c.RelayLinger = executor.StoreRelayLinger
	})
	const calls = 40
	lags := make([]time.Duration, 0, calls)
	for range calls {
		inv, err := searchAs(t, e.pipeline)
		if err != nil {
			t.Fatal(err)
		}
		returned := time.Now()
		rows := waitRows(t, e.audit, "acme", inv, 2)
		lags = append(lags, time.Since(returned))
		if len(rows) != 2 || rows[0].Phase != audit.PhaseIntent || rows[1].Phase != audit.PhaseOutcome {
			t.Fatalf("rows of %s: %+v, want the intent, then the outcome", inv, rows)
		}
	}
	slices.Sort(lags)
	t.Logf("linger %v: a call's outcome row readable in the trail after it returned: p50 %v, p99 %v, max %v (%d calls, one at a time)",
		executor.StoreRelayLinger, lags[len(lags)/2], lags[len(lags)*99/100], lags[len(lags)-1], calls)
}

// commitCounting is the memory store, counting the batches of audit rows
// it commits (BatchSpooler.SpoolRows) and whether each was lazy.
type commitCounting struct {
	*execmem.Store
	mu    sync.Mutex
	lazys []bool
}

func (c *commitCounting) SpoolRows(ctx context.Context, rows []executor.SpooledRow, lazy bool) ([]int64, error) {
	c.mu.Lock()
	c.lazys = append(c.lazys, lazy)
	c.mu.Unlock()
	return c.Store.SpoolRows(ctx, rows, lazy)
}

// TestAnOutcomeSharesTheNextIntentsCommit: with a relay linger, the
// outbox's writer holds an outcome (written after the reply, lazy) until
// the next call's intent needs a durable commit, and commits the two
// together: calls one after another cost one commit each, not two — the
// first call's intent alone, then each outcome with the next intent, and
// the last outcome alone once half the linger has passed.
func TestAnOutcomeSharesTheNextIntentsCommit(t *testing.T) {
	b := memoryBacking(t)
	counting := &commitCounting{Store: b.execStore.(*execmem.Store)}
	b.execStore = counting
	e := startLingering(t, b)
	const calls = 4
	var last string
	for range calls {
		inv, err := searchAs(t, e.pipeline)
		if err != nil {
			t.Fatal(err)
		}
		last = inv
	}
	waitRows(t, e.audit, "acme", last, 2)
	counting.mu.Lock()
	defer counting.mu.Unlock()
	// The first intent; each outcome with the next intent; the last outcome.
	want := []bool{false, false, false, false, true}
	if !slices.Equal(counting.lazys, want) {
		t.Fatalf("commits of the outbox (lazy or not): %v, want %v", counting.lazys, want)
	}
}
