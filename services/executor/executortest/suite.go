package executortest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/services/executor"
)

// Run runs the conformance suite. newStore must return an empty store, independent of the
// stores returned by other calls, whose clock is the real one (expiry is exercised with short
// TTLs); closing it is up to newStore (t.Cleanup).
func Run(t *testing.T, newStore func(t *testing.T) executor.Store) {
	s := &suite{newStore: newStore}
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"ReserveNewKey", s.testReserveNewKey},
		{"ReplaySuccess", s.testReplaySuccess},
		{"ReplayFailure", s.testReplayFailure},
		{"ReplayIsACopy", s.testReplayIsACopy},
		{"KeyReused", s.testKeyReused},
		{"Peek", s.testPeek},
		{"Release", s.testRelease},
		{"Expiry", s.testExpiry},
		{"Scopes", s.testScopes},
		{"ConcurrentReserve", s.testConcurrentReserve},
		{"ConcurrentReserveExpired", s.testConcurrentReserveExpired},
		{"Executed", s.testExecuted},
		{"Events", s.testEvents},
		{"EventsConcurrent", s.testEventsConcurrent},
		{"FinishParts", s.testFinishParts},
		{"FinishWithoutReservation", s.testFinishWithoutReservation},
		{"FinishRepeated", s.testFinishRepeated},
		{"FinishInvalidWritesNothing", s.testFinishInvalid},
		{"ReserveInvalid", s.testReserveInvalid},
		{"Lease", s.testLease},
		{"Renew", s.testRenew},
		{"Reclaim", s.testReclaim},
		{"Settle", s.testSettle},
		{"Spool", s.testSpool},
		{"Spooling", s.testSpooling},
		{"SpoolRows", s.testSpoolRows},
		{"RelayLease", s.testRelayLease}, // relaylease.go
		{"DeadLetter", s.testDeadLetter},
		{"Resolve", s.testResolve},
		{"Canceled", s.testCanceled},
		{"Delivery", s.testDelivery},
		{"Purge", s.testPurge},
		{"PurgeUndelivered", s.testPurgeUndelivered},
		{"Spend", s.testSpend},
		{"SpendAllOrNone", s.testSpendAllOrNone},
		{"SpendKeyed", s.testSpendKeyed},
		{"Refund", s.testRefund},
		{"SpendForce", s.testSpendForce},
		{"SpendDryRun", s.testSpendDryRun},
		{"SpendWindow", s.testSpendWindow},
		{"SpendGrain", s.testSpendGrain},
		{"SpendScopes", s.testSpendScopes},
		{"SpendInvalid", s.testSpendInvalid},
		{"PurgeSpends", s.testPurgeSpends},
		{"SpendConcurrent", s.testSpendConcurrent},
		{"Park", s.testPark},
		{"ParkExpiry", s.testParkExpiry},
		{"ParkInvalid", s.testParkInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // every test has its own store
			tt.fn(t)
		})
	}
}

type suite struct {
	newStore func(t *testing.T) executor.Store
}

// Base is the time of the executions and events the suite writes: fixed, and whole
// microseconds, so it survives a round trip through Postgres unchanged.
var Base = time.Date(2026, 1, 5, 9, 0, 0, 0, time.UTC)

const (
	// TTL is the lifetime of reservations that must not expire during a test.
	TTL = time.Hour
	// shortTTL is the lifetime of reservations that a test lets expire.
	shortTTL = time.Millisecond
	// expiryWait is how long a test sleeps for a shortTTL reservation to expire.
	expiryWait = 25 * time.Millisecond
)

// Key returns the idempotency key the suite uses most: acme / alice / ticket.refund / k1.
func Key() executor.IdemKey {
	return executor.IdemKey{Tenant: "acme", User: "alice", Command: "ticket.refund", Key: "k1"}
}

// Success returns the response of a successful call.
func Success(inv string) executor.Saved {
	return executor.Saved{InvocationID: inv, Output: []byte(`{"refund_id":"r-` + inv + `"}`), AuditID: "acme/" + inv}
}

// Failure returns the response of a call that the backend refused after dispatch.
func Failure(inv string) executor.Saved {
	// A serialized google.rpc.Status: opaque bytes to the store, not valid UTF-8 on purpose.
	return executor.Saved{InvocationID: inv, Status: []byte{0x08, 0x09, 0x12, 0x05, 's', 't', 'a', 't', 'e', 0xff}, AuditID: "acme/" + inv}
}

// Exec returns an execution of command on subject by user in tenant.
func Exec(tenant, user, command, subject, inv string) *executor.Execution {
	return &executor.Execution{Tenant: tenant, User: user, Command: command, Subject: subject, InvocationID: inv, Time: Base}
}

// Ev returns the domain event of invocation inv in tenant.
func Ev(tenant, inv string) *executor.Event {
	return &executor.Event{
		Tenant:       tenant,
		Command:      "ticket.refund",
		Subject:      "ticket/42",
		InvocationID: inv,
		UserID:       "alice",
		AgentID:      "support-bot",
		Result:       []byte(`{"refund_id":"r-` + inv + `","cardholder_reference":"[withheld]"}`),
		Time:         Base,
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// mustReserve asserts that key is free and reserves it.
func mustReserve(t *testing.T, st executor.Store, key executor.IdemKey, digest string, ttl time.Duration) {
	t.Helper()
	saved, err := st.Reserve(testCtx(t), key, executor.Reservation{Digest: digest, TTL: ttl})
	if err != nil || saved != nil {
		t.Fatalf("Reserve(%+v, %q) = (%+v, %v), want (nil, nil): a new key", key, digest, saved, err)
	}
}

// wantRefused asserts that reserving key fails with want.
func wantRefused(t *testing.T, st executor.Store, key executor.IdemKey, digest string, want error) {
	t.Helper()
	saved, err := st.Reserve(testCtx(t), key, executor.Reservation{Digest: digest, TTL: TTL})
	if !errors.Is(err, want) || saved != nil {
		t.Fatalf("Reserve(%+v, %q) = (%+v, %v), want %v", key, digest, saved, err, want)
	}
}

// wantReplay asserts that reserving key replays want.
func wantReplay(t *testing.T, st executor.Store, key executor.IdemKey, digest string, want executor.Saved) {
	t.Helper()
	saved, err := st.Reserve(testCtx(t), key, executor.Reservation{Digest: digest, TTL: TTL})
	if err != nil || saved == nil {
		t.Fatalf("Reserve(%+v, %q) = (%+v, %v), want the saved response", key, digest, saved, err)
	}
	if !sameSaved(*saved, want) {
		t.Fatalf("replayed %s, want %s", fmtSaved(*saved), fmtSaved(want))
	}
}

func mustFinish(t *testing.T, st executor.Store, f executor.Finish) {
	t.Helper()
	if err := st.Finish(testCtx(t), f); err != nil {
		t.Fatalf("Finish: %v", err)
	}
}

func mustEvents(t *testing.T, st executor.Store, tenant string, after int64, limit int) []executor.Event {
	t.Helper()
	evs, err := st.Events(testCtx(t), tenant, after, limit)
	if err != nil {
		t.Fatalf("Events(%s, %d, %d): %v", tenant, after, limit, err)
	}
	return evs
}

func mustExecuted(t *testing.T, st executor.Store, tenant, user string, commands []string, subject string) bool {
	t.Helper()
	ok, err := st.Executed(testCtx(t), tenant, user, commands, subject)
	if err != nil {
		t.Fatalf("Executed: %v", err)
	}
	return ok
}

// sameSaved compares field by field; nil and empty byte slices differ, because "Status is nil
// on success" is part of the contract.
func sameSaved(a, b executor.Saved) bool {
	return a.InvocationID == b.InvocationID && a.AuditID == b.AuditID &&
		bytes.Equal(a.Output, b.Output) && (a.Output == nil) == (b.Output == nil) &&
		bytes.Equal(a.Status, b.Status) && (a.Status == nil) == (b.Status == nil)
}

func fmtSaved(s executor.Saved) string {
	return fmt.Sprintf("{inv %q audit %q output %q (nil %v) status %x (nil %v)}",
		s.InvocationID, s.AuditID, s.Output, s.Output == nil, s.Status, s.Status == nil)
}

func sameEvent(a, b executor.Event) bool {
	return a.Seq == b.Seq && a.Tenant == b.Tenant && a.Command == b.Command && a.Subject == b.Subject &&
		a.InvocationID == b.InvocationID && a.UserID == b.UserID && a.AgentID == b.AgentID &&
		bytes.Equal(a.Result, b.Result) && a.Time.Equal(b.Time)
}

func seqs(evs []executor.Event) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.Seq
	}
	return out
}

func invs(evs []executor.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.InvocationID
	}
	return out
}

func (s *suite) testReserveNewKey(t *testing.T) {
	st := s.newStore(t)
	mustReserve(t, st, Key(), "d1", TTL)
	// A duplicate of the running call, same input: retry later.
	wantRefused(t, st, Key(), "d1", executor.ErrInFlight)
	wantRefused(t, st, Key(), "d1", executor.ErrInFlight)
	// A different input under the running key is a reuse, not a duplicate.
	wantRefused(t, st, Key(), "d2", executor.ErrKeyReused)
	// Another key of the same scope is independent.
	other := Key()
	other.Key = "k2"
	mustReserve(t, st, other, "d1", TTL)
}

func (s *suite) testReplaySuccess(t *testing.T) {
	st := s.newStore(t)
	mustReserve(t, st, Key(), "d1", TTL)
	mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: Success("inv-1"), Execution: Exec("acme", "alice", "ticket.refund", "ticket/42", "inv-1"), Event: Ev("acme", "inv-1")})
	for range 3 { // every retry gets the same response
		wantReplay(t, st, Key(), "d1", Success("inv-1"))
	}
	// Replays record nothing: still one event.
	if evs := mustEvents(t, st, "acme", 0, 0); len(evs) != 1 {
		t.Fatalf("%d events after replays, want 1", len(evs))
	}
}

func (s *suite) testReplayFailure(t *testing.T) {
	st := s.newStore(t)
	mustReserve(t, st, Key(), "d1", TTL)
	// A failed dispatch saves its status and records no execution or event.
	mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: Failure("inv-1")})
	wantReplay(t, st, Key(), "d1", Failure("inv-1"))
	wantRefused(t, st, Key(), "d2", executor.ErrKeyReused)
	if mustExecuted(t, st, "acme", "alice", []string{"ticket.refund"}, "ticket/42") {
		t.Fatal("a failed call counts as executed")
	}
	if evs := mustEvents(t, st, "acme", 0, 0); len(evs) != 0 {
		t.Fatalf("a failed call published %d events", len(evs))
	}
}

func (s *suite) testReplayIsACopy(t *testing.T) {
	st := s.newStore(t)
	mustReserve(t, st, Key(), "d1", TTL)
	in := Success("inv-1")
	ev := Ev("acme", "inv-1")
	mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: in, Event: ev})
	in.Output[0] = 'X'
	ev.Result[0] = 'X'
	got, err := st.Reserve(testCtx(t), Key(), executor.Reservation{Digest: "d1", TTL: TTL})
	if err != nil || got == nil {
		t.Fatalf("Reserve = (%v, %v)", got, err)
	}
	got.Output[0] = 'Y'
	wantReplay(t, st, Key(), "d1", Success("inv-1"))
	evs := mustEvents(t, st, "acme", 0, 0)
	evs[0].Result[0] = 'Y'
	if evs := mustEvents(t, st, "acme", 0, 0); !bytes.Equal(evs[0].Result, Ev("acme", "inv-1").Result) {
		t.Fatalf("the stored event changed with the caller's slices: %q", evs[0].Result)
	}
}

func (s *suite) testKeyReused(t *testing.T) {
	tests := []struct {
		name  string
		saved executor.Saved
	}{
		{"after success", Success("inv-1")},
		{"after failure", Failure("inv-1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := s.newStore(t)
			mustReserve(t, st, Key(), "d1", TTL)
			mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: tt.saved})
			wantRefused(t, st, Key(), "d2", executor.ErrKeyReused)
			wantRefused(t, st, Key(), "", executor.ErrKeyReused)
			// The refusal changed nothing: the original input still replays.
			wantReplay(t, st, Key(), "d1", tt.saved)
		})
	}
}

func (s *suite) testRelease(t *testing.T) {
	st := s.newStore(t)
	ctx := testCtx(t)
	mustReserve(t, st, Key(), "d1", TTL)
	if err := st.Release(ctx, Key()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Free again, and nothing was saved: a different input is a new call, not a reuse.
	mustReserve(t, st, Key(), "d2", TTL)
	wantRefused(t, st, Key(), "d2", executor.ErrInFlight)

	// Releasing what is not reserved is a no-op.
	unknown := Key()
	unknown.Key = "never"
	if err := st.Release(ctx, unknown); err != nil {
		t.Fatalf("Release of an unknown key: %v", err)
	}
	mustReserve(t, st, unknown, "d1", TTL)

	// A finished record is not released: its response is what retries must get.
	mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: Success("inv-2")})
	if err := st.Release(ctx, Key()); err != nil {
		t.Fatalf("Release of a finished key: %v", err)
	}
	wantReplay(t, st, Key(), "d2", Success("inv-2"))
}

func (s *suite) testExpiry(t *testing.T) {
	t.Run("in flight", func(t *testing.T) {
		st := s.newStore(t)
		mustReserve(t, st, Key(), "d1", shortTTL)
		time.Sleep(expiryWait)
		// The caller that held it is presumed gone: the key is new again, whatever the input.
		mustReserve(t, st, Key(), "d2", TTL)
		wantRefused(t, st, Key(), "d2", executor.ErrInFlight)
		wantRefused(t, st, Key(), "d1", executor.ErrKeyReused)
	})
	t.Run("finished", func(t *testing.T) {
		st := s.newStore(t)
		mustReserve(t, st, Key(), "d1", shortTTL)
		mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: Success("inv-1")})
		time.Sleep(expiryWait)
		// Expired: neither replayed nor a reuse.
		mustReserve(t, st, Key(), "d2", TTL)
		wantRefused(t, st, Key(), "d2", executor.ErrInFlight)
		mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: Failure("inv-2")})
		wantReplay(t, st, Key(), "d2", Failure("inv-2"))
	})
	t.Run("sub-microsecond ttl", func(t *testing.T) {
		st := s.newStore(t)
		mustReserve(t, st, Key(), "d1", time.Nanosecond)
		time.Sleep(expiryWait)
		mustReserve(t, st, Key(), "d2", TTL)
	})
	t.Run("ttl is per reservation", func(t *testing.T) {
		st := s.newStore(t)
		long := Key()
		long.Key = "long"
		mustReserve(t, st, Key(), "d1", shortTTL)
		mustReserve(t, st, long, "d1", TTL)
		time.Sleep(expiryWait)
		mustReserve(t, st, Key(), "d1", TTL)
		wantRefused(t, st, long, "d1", executor.ErrInFlight)
	})
}

func (s *suite) testScopes(t *testing.T) {
	variant := func(f func(*executor.IdemKey)) executor.IdemKey {
		k := Key()
		f(&k)
		return k
	}
	tests := []struct {
		name string
		key  executor.IdemKey
	}{
		{"other tenant", variant(func(k *executor.IdemKey) { k.Tenant = "globex" })},
		{"other user", variant(func(k *executor.IdemKey) { k.User = "bob" })},
		{"other command", variant(func(k *executor.IdemKey) { k.Command = "ticket.close" })},
		{"other key", variant(func(k *executor.IdemKey) { k.Key = "k2" })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := s.newStore(t)
			mustReserve(t, st, Key(), "d1", TTL)
			// Same key string, different input, other scope: a new call, not in flight or reused.
			mustReserve(t, st, tt.key, "d2", TTL)
			mustFinish(t, st, executor.Finish{Key: new(tt.key), Saved: Success("inv-other")})
			wantReplay(t, st, tt.key, "d2", Success("inv-other"))
			wantRefused(t, st, Key(), "d1", executor.ErrInFlight)
			if err := st.Release(testCtx(t), Key()); err != nil {
				t.Fatal(err)
			}
			wantReplay(t, st, tt.key, "d2", Success("inv-other"))
			mustReserve(t, st, Key(), "d3", TTL)
		})
	}
}

// reserveConcurrently runs n Reserve calls of key at once and counts the outcomes.
func reserveConcurrently(t *testing.T, st executor.Store, key executor.IdemKey, digest string, n int) (won, inFlight int, saved []*executor.Saved) {
	t.Helper()
	results := make([]*executor.Saved, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	ctx := testCtx(t)
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = st.Reserve(ctx, key, executor.Reservation{Digest: digest, TTL: TTL})
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		switch {
		case errs[i] == nil && results[i] == nil:
			won++
		case errors.Is(errs[i], executor.ErrInFlight):
			inFlight++
		case errs[i] == nil:
			saved = append(saved, results[i])
		default:
			t.Errorf("Reserve %d: %v, want nil or ErrInFlight", i, errs[i])
		}
	}
	return won, inFlight, saved
}

func (s *suite) testConcurrentReserve(t *testing.T) {
	const n = 64
	st := s.newStore(t)
	won, inFlight, saved := reserveConcurrently(t, st, Key(), "d1", n)
	if won != 1 || inFlight != n-1 || len(saved) != 0 {
		t.Fatalf("%d reservations won, %d in flight, %d replays; want 1, %d, 0", won, inFlight, len(saved), n-1)
	}
	mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: Success("inv-1")})
	won, inFlight, saved = reserveConcurrently(t, st, Key(), "d1", n)
	if won != 0 || inFlight != 0 || len(saved) != n {
		t.Fatalf("after Finish: %d won, %d in flight, %d replays; want 0, 0, %d", won, inFlight, len(saved), n)
	}
	for _, sv := range saved {
		if !sameSaved(*sv, Success("inv-1")) {
			t.Fatalf("replayed %s", fmtSaved(*sv))
		}
	}
}

func (s *suite) testConcurrentReserveExpired(t *testing.T) {
	const n = 64
	st := s.newStore(t)
	mustReserve(t, st, Key(), "d1", shortTTL)
	time.Sleep(expiryWait)
	// Replacing an expired record is as race-free as inserting a new one.
	won, inFlight, saved := reserveConcurrently(t, st, Key(), "d1", n)
	if won != 1 || inFlight != n-1 || len(saved) != 0 {
		t.Fatalf("%d reservations won, %d in flight, %d replays; want 1, %d, 0", won, inFlight, len(saved), n-1)
	}
}

func (s *suite) testExecuted(t *testing.T) {
	st := s.newStore(t)
	mustFinish(t, st, executor.Finish{Execution: Exec("acme", "alice", "expense.report.submit", "report/7", "inv-1")})
	mustFinish(t, st, executor.Finish{Execution: Exec("acme", "bob", "expense.report.approve", "report/8", "inv-2")})
	both := []string{"expense.report.approve", "expense.report.submit"}
	tests := []struct {
		name     string
		tenant   string
		user     string
		commands []string
		subject  string
		want     bool
	}{
		{"same user, subject and command", "acme", "alice", []string{"expense.report.submit"}, "report/7", true},
		{"one of several commands", "acme", "alice", both, "report/7", true},
		{"other command", "acme", "alice", []string{"expense.report.approve"}, "report/7", false},
		{"other user", "acme", "bob", both, "report/7", false},
		{"other subject", "acme", "alice", both, "report/8", false},
		{"other tenant", "globex", "alice", both, "report/7", false},
		{"no commands", "acme", "alice", nil, "report/7", false},
		{"empty commands", "acme", "alice", []string{}, "report/7", false},
		{"second execution", "acme", "bob", both, "report/8", true},
		{"command is not a prefix match", "acme", "alice", []string{"expense.report"}, "report/7", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustExecuted(t, st, tt.tenant, tt.user, tt.commands, tt.subject); got != tt.want {
				t.Fatalf("Executed(%s, %s, %v, %s) = %v, want %v", tt.tenant, tt.user, tt.commands, tt.subject, got, tt.want)
			}
		})
	}
}

func (s *suite) testEvents(t *testing.T) {
	st := s.newStore(t)
	// Interleaved tenants: each has its own sequence.
	var want []executor.Event
	for i := range 5 {
		e := Ev("acme", fmt.Sprintf("a%d", i))
		e.Time = Base.Add(time.Duration(i) * time.Second)
		mustFinish(t, st, executor.Finish{Event: e})
		e.Seq = int64(i + 1)
		want = append(want, *e)
		if i < 3 {
			mustFinish(t, st, executor.Finish{Event: Ev("globex", fmt.Sprintf("g%d", i))})
		}
	}
	all := mustEvents(t, st, "acme", 0, 100)
	if len(all) != len(want) {
		t.Fatalf("acme has %d events %v, want %d", len(all), invs(all), len(want))
	}
	for i := range want {
		if !sameEvent(all[i], want[i]) {
			t.Fatalf("event %d = %+v, want %+v", i, all[i], want[i])
		}
	}
	tests := []struct {
		name   string
		tenant string
		after  int64
		limit  int
		want   []int64
	}{
		{"all", "acme", 0, 100, []int64{1, 2, 3, 4, 5}},
		{"limit", "acme", 0, 2, []int64{1, 2}},
		{"after", "acme", 2, 100, []int64{3, 4, 5}},
		{"after and limit", "acme", 1, 3, []int64{2, 3, 4}},
		{"limit 1 from the end", "acme", 4, 1, []int64{5}},
		{"after the last", "acme", 5, 100, nil},
		{"far after the last", "acme", 500, 100, nil},
		{"negative after reads from the start", "acme", -1, 2, []int64{1, 2}},
		{"default limit", "acme", 0, 0, []int64{1, 2, 3, 4, 5}},
		{"other tenant", "globex", 0, 100, []int64{1, 2, 3}},
		{"unknown tenant", "initech", 0, 100, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs := mustEvents(t, st, tt.tenant, tt.after, tt.limit)
			if got := seqs(evs); !slices.Equal(got, tt.want) {
				t.Fatalf("seqs %v, want %v", got, tt.want)
			}
			for _, e := range evs {
				if e.Tenant != tt.tenant {
					t.Fatalf("%s's events include %+v", tt.tenant, e)
				}
			}
		})
	}
}

func (s *suite) testEventsConcurrent(t *testing.T) {
	st := s.newStore(t)
	const n = 32
	tenants := []string{"acme", "globex"}
	ctx := testCtx(t)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, tenant := range tenants {
		for i := range n {
			wg.Go(func() {
				inv := fmt.Sprintf("%s-%02d", tenant, i)
				<-start
				if err := st.Finish(ctx, executor.Finish{Execution: Exec(tenant, "alice", "ticket.refund", "ticket/"+inv, inv), Event: Ev(tenant, inv)}); err != nil {
					t.Errorf("Finish %s: %v", inv, err)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	for _, tenant := range tenants {
		evs := mustEvents(t, st, tenant, 0, 0)
		wantSeqs := make([]int64, n)
		var wantInvs []string
		for i := range n {
			wantSeqs[i] = int64(i + 1)
			wantInvs = append(wantInvs, fmt.Sprintf("%s-%02d", tenant, i))
		}
		if got := seqs(evs); !slices.Equal(got, wantSeqs) {
			t.Fatalf("%s seqs %v, want 1..%d without gaps", tenant, got, n)
		}
		got := invs(evs)
		slices.Sort(got)
		if !slices.Equal(got, wantInvs) {
			t.Fatalf("%s events %v, want each invocation once", tenant, got)
		}
	}
}

func (s *suite) testFinishParts(t *testing.T) {
	tests := []struct {
		name              string
		key, exec, event  bool
		wantEvents        int
		wantExecuted      bool
		wantReplay        bool
		wantStillInFlight bool
	}{
		{"nothing", false, false, false, 0, false, false, true},
		{"key only (a failure)", true, false, false, 0, false, true, false},
		{"execution only", false, true, false, 0, true, false, true},
		{"event only", false, false, true, 1, false, false, true},
		{"key and event (no subject)", true, false, true, 1, false, true, false},
		{"execution and event (no key)", false, true, true, 1, true, false, true},
		{"everything", true, true, true, 1, true, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := s.newStore(t)
			mustReserve(t, st, Key(), "d1", TTL)
			var f executor.Finish
			if tt.key {
				f.Key, f.Saved = new(Key()), Success("inv-1")
			}
			if tt.exec {
				f.Execution = Exec("acme", "alice", "ticket.refund", "ticket/42", "inv-1")
			}
			if tt.event {
				f.Event = Ev("acme", "inv-1")
			}
			mustFinish(t, st, f)
			if got := len(mustEvents(t, st, "acme", 0, 0)); got != tt.wantEvents {
				t.Errorf("%d events, want %d", got, tt.wantEvents)
			}
			if got := mustExecuted(t, st, "acme", "alice", []string{"ticket.refund"}, "ticket/42"); got != tt.wantExecuted {
				t.Errorf("Executed = %v, want %v", got, tt.wantExecuted)
			}
			switch {
			case tt.wantReplay:
				wantReplay(t, st, Key(), "d1", Success("inv-1"))
			case tt.wantStillInFlight:
				wantRefused(t, st, Key(), "d1", executor.ErrInFlight)
			}
		})
	}
}

func (s *suite) testFinishWithoutReservation(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, st executor.Store)
	}{
		{"never reserved", func(*testing.T, executor.Store) {}},
		{"released", func(t *testing.T, st executor.Store) {
			mustReserve(t, st, Key(), "d1", TTL)
			if err := st.Release(testCtx(t), Key()); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := s.newStore(t)
			tt.prepare(t, st)
			// The call ran, so what it did is recorded; there is no reservation to complete.
			mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: Success("inv-1"),
				Execution: Exec("acme", "alice", "ticket.refund", "ticket/42", "inv-1"), Event: Ev("acme", "inv-1")})
			if !mustExecuted(t, st, "acme", "alice", []string{"ticket.refund"}, "ticket/42") {
				t.Error("execution not recorded")
			}
			if evs := mustEvents(t, st, "acme", 0, 0); len(evs) != 1 {
				t.Errorf("%d events, want 1", len(evs))
			}
			mustReserve(t, st, Key(), "d2", TTL)
		})
	}
}

func (s *suite) testFinishRepeated(t *testing.T) {
	st := s.newStore(t)
	mustReserve(t, st, Key(), "d1", TTL)
	f := executor.Finish{Key: new(Key()), Saved: Success("inv-1"),
		Execution: Exec("acme", "alice", "ticket.refund", "ticket/42", "inv-1"), Event: Ev("acme", "inv-1")}
	mustFinish(t, st, f)
	// A retried Finish (its first commit's reply was lost) records nothing twice, and a later
	// response never overwrites the first.
	mustFinish(t, st, f)
	f.Saved = Failure("inv-1")
	mustFinish(t, st, f)
	wantReplay(t, st, Key(), "d1", Success("inv-1"))
	if evs := mustEvents(t, st, "acme", 0, 0); !slices.Equal(seqs(evs), []int64{1}) {
		t.Fatalf("seqs %v after a repeated Finish, want [1]", seqs(evs))
	}
	// The next event takes the next seq: the repeat consumed none.
	mustFinish(t, st, executor.Finish{Event: Ev("acme", "inv-2")})
	if evs := mustEvents(t, st, "acme", 0, 0); !slices.Equal(seqs(evs), []int64{1, 2}) || evs[1].InvocationID != "inv-2" {
		t.Fatalf("seqs %v, invocations %v; want [1 2], inv-2 last", seqs(evs), invs(evs))
	}
	// The same invocation id in another tenant is another event.
	mustFinish(t, st, executor.Finish{Event: Ev("globex", "inv-1")})
	if evs := mustEvents(t, st, "globex", 0, 0); len(evs) != 1 {
		t.Fatalf("globex has %d events, want 1", len(evs))
	}
}

func (s *suite) testFinishInvalid(t *testing.T) {
	valid := func() executor.Finish {
		return executor.Finish{Key: new(Key()), Saved: Success("inv-1"),
			Execution: Exec("acme", "alice", "ticket.refund", "ticket/42", "inv-1"), Event: Ev("acme", "inv-1")}
	}
	tests := []struct {
		name   string
		mutate func(*executor.Finish)
	}{
		{"event without tenant", func(f *executor.Finish) { f.Event.Tenant = "" }},
		{"event without command", func(f *executor.Finish) { f.Event.Command = "" }},
		{"event without invocation", func(f *executor.Finish) { f.Event.InvocationID = "" }},
		{"execution without subject", func(f *executor.Finish) { f.Execution.Subject = "" }},
		{"execution without user", func(f *executor.Finish) { f.Execution.User = "" }},
		{"execution without invocation", func(f *executor.Finish) { f.Execution.InvocationID = "" }},
		{"key without user", func(f *executor.Finish) { f.Key.User = "" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := s.newStore(t)
			mustReserve(t, st, Key(), "d1", TTL)
			f := valid()
			tt.mutate(&f)
			err := st.Finish(testCtx(t), f)
			if err == nil {
				t.Fatal("Finish accepted an invalid part")
			}
			for _, sentinel := range []error{executor.ErrInFlight, executor.ErrKeyReused, executor.ErrUnavailable} {
				if errors.Is(err, sentinel) {
					t.Fatalf("err = %v, matches %v", err, sentinel)
				}
			}
			// All or nothing: the valid parts were not recorded either.
			wantRefused(t, st, Key(), "d1", executor.ErrInFlight)
			if mustExecuted(t, st, "acme", "alice", []string{"ticket.refund"}, "ticket/42") {
				t.Error("the execution was recorded")
			}
			if evs := mustEvents(t, st, "acme", 0, 0); len(evs) != 0 {
				t.Errorf("%d events recorded", len(evs))
			}
		})
	}
}

func (s *suite) testReserveInvalid(t *testing.T) {
	variant := func(f func(*executor.IdemKey)) executor.IdemKey {
		k := Key()
		f(&k)
		return k
	}
	tests := []struct {
		name string
		key  executor.IdemKey
		ttl  time.Duration
	}{
		{"no tenant", variant(func(k *executor.IdemKey) { k.Tenant = "" }), TTL},
		{"no user", variant(func(k *executor.IdemKey) { k.User = "" }), TTL},
		{"no command", variant(func(k *executor.IdemKey) { k.Command = "" }), TTL},
		{"no key", variant(func(k *executor.IdemKey) { k.Key = "" }), TTL},
		{"zero ttl", Key(), 0},
		{"negative ttl", Key(), -time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := s.newStore(t)
			saved, err := st.Reserve(testCtx(t), tt.key, executor.Reservation{Digest: "d1", TTL: tt.ttl})
			if err == nil || saved != nil {
				t.Fatalf("Reserve = (%v, %v), want an error", saved, err)
			}
			for _, sentinel := range []error{executor.ErrInFlight, executor.ErrKeyReused, executor.ErrUnavailable} {
				if errors.Is(err, sentinel) {
					t.Fatalf("err = %v, matches %v", err, sentinel)
				}
			}
			mustReserve(t, st, Key(), "d2", TTL) // nothing was reserved
		})
	}
}

func (s *suite) testCanceled(t *testing.T) {
	st := s.newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if saved, err := st.Reserve(ctx, Key(), executor.Reservation{Digest: "d1", TTL: TTL}); !errors.Is(err, context.Canceled) || saved != nil {
		t.Errorf("Reserve = (%v, %v), want context.Canceled", saved, err)
	}
	if err := st.Finish(ctx, executor.Finish{Key: new(Key()), Saved: Success("inv-1"), Event: Ev("acme", "inv-1")}); !errors.Is(err, context.Canceled) {
		t.Errorf("Finish = %v, want context.Canceled", err)
	}
	if _, err := st.Executed(ctx, "acme", "alice", []string{"ticket.refund"}, "ticket/42"); !errors.Is(err, context.Canceled) {
		t.Errorf("Executed = %v, want context.Canceled", err)
	}
	if _, err := st.Events(ctx, "acme", 0, 10); !errors.Is(err, context.Canceled) {
		t.Errorf("Events = %v, want context.Canceled", err)
	}
	if err := st.Release(ctx, Key()); !errors.Is(err, context.Canceled) {
		t.Errorf("Release = %v, want context.Canceled", err)
	}
	if _, err := st.Backlog(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Backlog = %v, want context.Canceled", err)
	}
	if err := st.MarkDelivered(ctx, "acme", 1); !errors.Is(err, context.Canceled) {
		t.Errorf("MarkDelivered = %v, want context.Canceled", err)
	}
	if _, err := st.Purge(ctx, executor.PurgePolicy{Now: time.Now()}); !errors.Is(err, context.Canceled) {
		t.Errorf("Purge = %v, want context.Canceled", err)
	}
	if bs, err := st.Spend(ctx, spending(item("a", 1, 5))); !errors.Is(err, context.Canceled) || bs != nil {
		t.Errorf("Spend = (%+v, %v), want context.Canceled", bs, err)
	}
	if err := st.Refund(ctx, "acme", []executor.Spent{{Bucket: "a", Amount: 1, Lapses: time.Now().Add(TTL)}}); !errors.Is(err, context.Canceled) {
		t.Errorf("Refund = %v, want context.Canceled", err)
	}
	// None of them did anything.
	mustReserve(t, st, Key(), "d1", TTL)
	if evs := mustEvents(t, st, "acme", 0, 0); len(evs) != 0 {
		t.Errorf("%d events after a canceled Finish", len(evs))
	}
	if u := used(t, st, "acme", "a", TTL); u != 0 {
		t.Errorf("a canceled Spend spent %d", u)
	}
}

func mustBacklog(t *testing.T, st executor.Store) []executor.Cursor {
	t.Helper()
	cs, err := st.Backlog(testCtx(t))
	if err != nil {
		t.Fatalf("Backlog: %v", err)
	}
	return cs
}

func mustMark(t *testing.T, st executor.Store, tenant string, seq int64) {
	t.Helper()
	if err := st.MarkDelivered(testCtx(t), tenant, seq); err != nil {
		t.Fatalf("MarkDelivered(%s, %d): %v", tenant, seq, err)
	}
}

func mustPurge(t *testing.T, st executor.Store, p executor.PurgePolicy) executor.Purged {
	t.Helper()
	n, err := st.Purge(testCtx(t), p)
	if err != nil {
		t.Fatalf("Purge(%+v): %v", p, err)
	}
	return n
}

// testDelivery walks the relay's cursor: the backlog names the tenants with undelivered
// events, MarkDelivered moves a cursor forward only and never past the head, and delivering
// deletes nothing.
func (s *suite) testDelivery(t *testing.T) {
	st := s.newStore(t)
	if cs := mustBacklog(t, st); len(cs) != 0 {
		t.Fatalf("backlog of an empty store = %+v", cs)
	}
	for i := range 3 {
		mustFinish(t, st, executor.Finish{Event: Ev("globex", fmt.Sprintf("g%d", i))})
		mustFinish(t, st, executor.Finish{Event: Ev("acme", fmt.Sprintf("a%d", i))})
	}
	mustFinish(t, st, executor.Finish{Event: Ev("globex", "g3")})
	steps := []struct {
		name   string
		tenant string
		mark   int64
		want   []executor.Cursor
	}{
		{"nothing delivered", "", 0, []executor.Cursor{{Tenant: "acme", Delivered: 0, Head: 3}, {Tenant: "globex", Delivered: 0, Head: 4}}},
		{"forward", "acme", 2, []executor.Cursor{{Tenant: "acme", Delivered: 2, Head: 3}, {Tenant: "globex", Delivered: 0, Head: 4}}},
		{"never back", "acme", 1, []executor.Cursor{{Tenant: "acme", Delivered: 2, Head: 3}, {Tenant: "globex", Delivered: 0, Head: 4}}},
		{"negative changes nothing", "acme", -5, []executor.Cursor{{Tenant: "acme", Delivered: 2, Head: 3}, {Tenant: "globex", Delivered: 0, Head: 4}}},
		{"caught up leaves the backlog", "acme", 3, []executor.Cursor{{Tenant: "globex", Delivered: 0, Head: 4}}},
		{"unknown tenant changes nothing", "initech", 7, []executor.Cursor{{Tenant: "globex", Delivered: 0, Head: 4}}},
		{"never past the head", "globex", 99, nil},
	}
	for _, step := range steps {
		if step.tenant != "" {
			mustMark(t, st, step.tenant, step.mark)
		}
		if got := mustBacklog(t, st); !slices.Equal(got, step.want) {
			t.Fatalf("%s: backlog %+v, want %+v", step.name, got, step.want)
		}
	}
	// The cursor stayed at globex's head (4), not at 99: the next event is undelivered.
	mustFinish(t, st, executor.Finish{Event: Ev("globex", "g4")})
	if got, want := mustBacklog(t, st), []executor.Cursor{{Tenant: "globex", Delivered: 4, Head: 5}}; !slices.Equal(got, want) {
		t.Fatalf("after a new event: backlog %+v, want %+v", got, want)
	}
	// Delivered events stay queryable until purged.
	if evs := mustEvents(t, st, "acme", 0, 0); !slices.Equal(seqs(evs), []int64{1, 2, 3}) {
		t.Fatalf("acme seqs %v after delivery, want [1 2 3]", seqs(evs))
	}
	if err := st.MarkDelivered(testCtx(t), "", 1); err == nil {
		t.Fatal("MarkDelivered without a tenant succeeded")
	}
}

// testPurge bounds the tables: expired idempotency records and old delivered events go; live
// records, recent events and undelivered events stay; seqs keep counting from the head.
func (s *suite) testPurge(t *testing.T) {
	st := s.newStore(t)
	// acme: seq i+1 committed at Base+i minutes; globex: one old event, never delivered.
	for i := range 4 {
		e := Ev("acme", fmt.Sprintf("a%d", i))
		e.Time = Base.Add(time.Duration(i) * time.Minute)
		mustFinish(t, st, executor.Finish{Event: e})
	}
	mustFinish(t, st, executor.Finish{Event: Ev("globex", "g0")})
	expired := Key()
	expired.Key = "expired"
	mustReserve(t, st, expired, "d1", shortTTL)
	mustReserve(t, st, Key(), "d1", TTL)
	mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: Success("inv-1")})
	time.Sleep(expiryWait)
	mustMark(t, st, "acme", 2)

	// Keep events committed after Base+2m: seq 3 is old enough but undelivered, seq 4 is
	// recent. The clock of idempotency expiry is the real one.
	now := time.Now()
	policy := executor.PurgePolicy{Now: now, KeepEvents: now.Sub(Base.Add(2 * time.Minute))}
	if n := mustPurge(t, st, policy); n != (executor.Purged{Events: 2, IdempotencyKeys: 1}) {
		t.Fatalf("Purge = %+v, want 2 events and 1 key", n)
	}
	if evs := mustEvents(t, st, "acme", 0, 0); !slices.Equal(seqs(evs), []int64{3, 4}) {
		t.Fatalf("acme seqs %v after purge, want [3 4]", seqs(evs))
	}
	if evs := mustEvents(t, st, "acme", 1, 1); !slices.Equal(seqs(evs), []int64{3}) {
		t.Fatalf("acme seqs after 1, limit 1: %v, want [3] (the oldest kept)", seqs(evs))
	}
	if evs := mustEvents(t, st, "globex", 0, 0); len(evs) != 1 {
		t.Fatalf("globex has %d events, want its undelivered one kept", len(evs))
	}
	if got, want := mustBacklog(t, st), []executor.Cursor{{Tenant: "acme", Delivered: 2, Head: 4}, {Tenant: "globex", Delivered: 0, Head: 1}}; !slices.Equal(got, want) {
		t.Fatalf("backlog %+v after purge, want %+v", got, want)
	}
	// The live record still replays; the expired one is free.
	wantReplay(t, st, Key(), "d1", Success("inv-1"))
	mustReserve(t, st, expired, "d2", TTL)
	// Purging again finds nothing more.
	if n := mustPurge(t, st, policy); n != (executor.Purged{}) {
		t.Fatalf("second Purge = %+v, want nothing", n)
	}
	// Deliver everything; a zero KeepEvents empties the outbox, and seqs go on from the head.
	mustMark(t, st, "acme", 4)
	if n := mustPurge(t, st, executor.PurgePolicy{Now: time.Now()}); n.Events != 2 {
		t.Fatalf("Purge of everything delivered = %+v, want 2 events", n)
	}
	if evs := mustEvents(t, st, "acme", 0, 0); len(evs) != 0 {
		t.Fatalf("acme kept %v", seqs(evs))
	}
	mustFinish(t, st, executor.Finish{Event: Ev("acme", "a4")})
	if evs := mustEvents(t, st, "acme", 0, 0); !slices.Equal(seqs(evs), []int64{5}) {
		t.Fatalf("acme seqs %v after purging all, want [5]", seqs(evs))
	}
	if _, err := st.Purge(testCtx(t), executor.PurgePolicy{Now: time.Now(), KeepEvents: -time.Second}); err == nil {
		t.Fatal("Purge with a negative KeepEvents succeeded")
	}
}

// testPurgeUndelivered: without a relay nobody delivers, and Undelivered still bounds the
// outbox by age.
func (s *suite) testPurgeUndelivered(t *testing.T) {
	st := s.newStore(t)
	for i := range 3 {
		e := Ev("acme", fmt.Sprintf("a%d", i))
		e.Time = Base.Add(time.Duration(i) * time.Minute)
		mustFinish(t, st, executor.Finish{Event: e})
	}
	now := time.Now()
	n := mustPurge(t, st, executor.PurgePolicy{Now: now, KeepEvents: now.Sub(Base.Add(time.Minute)), Undelivered: true})
	if n.Events != 2 {
		t.Fatalf("Purge = %+v, want 2 events", n)
	}
	if evs := mustEvents(t, st, "acme", 0, 0); !slices.Equal(seqs(evs), []int64{3}) {
		t.Fatalf("acme seqs %v, want [3]", seqs(evs))
	}
}

// reserveFor claims key for invocation inv with a lease.
func reserveFor(t *testing.T, st executor.Store, key executor.IdemKey, digest, inv string, lease time.Duration) {
	t.Helper()
	saved, err := st.Reserve(testCtx(t), key, executor.Reservation{Digest: digest, InvocationID: inv, TTL: TTL, Lease: lease})
	if saved != nil || err != nil {
		t.Fatalf("Reserve(%+v) = (%+v, %v), want a new claim", key, saved, err)
	}
}

// testLease: a claim in flight past its lease is abandoned, and Reserve
// names the invocation that abandoned it; before the lease runs out, and
// without a lease, it is in flight.
func (s *suite) testLease(t *testing.T) {
	st := s.newStore(t)
	const lease = 300 * time.Millisecond
	reserveFor(t, st, Key(), "d1", "inv-1", lease)
	wantRefused(t, st, Key(), "d1", executor.ErrInFlight)
	time.Sleep(lease + expiryWait)
	_, err := st.Reserve(testCtx(t), Key(), executor.Reservation{Digest: "d1", InvocationID: "inv-2", TTL: TTL})
	var ab *executor.AbandonedError
	if !errors.As(err, &ab) || ab.InvocationID != "inv-1" {
		t.Fatalf("Reserve past the lease = %v, want AbandonedError naming inv-1", err)
	}
	wantRefused(t, st, Key(), "d2", executor.ErrKeyReused)
	// Without a lease a claim stays in flight until it expires.
	other := Key()
	other.Key = "no-lease"
	reserveFor(t, st, other, "d1", "inv-3", 0)
	time.Sleep(expiryWait)
	wantRefused(t, st, other, "d1", executor.ErrInFlight)
	// A finished claim is replayed whatever its lease said.
	done := Key()
	done.Key = "done"
	reserveFor(t, st, done, "d1", "inv-4", shortTTL)
	mustFinish(t, st, executor.Finish{Key: &done, Saved: Success("inv-4")})
	time.Sleep(expiryWait)
	wantReplay(t, st, done, "d1", Success("inv-4"))
}

// testReclaim: only the claim of the named invocation, once it is
// abandoned or finished, is handed over — once.
func (s *suite) testReclaim(t *testing.T) {
	ctx := testCtx(t)
	st := s.newStore(t)
	next := executor.Reservation{Digest: "d1", InvocationID: "inv-2", TTL: TTL, Lease: TTL}
	reserveFor(t, st, Key(), "d1", "inv-1", TTL)
	if ok, err := st.Reclaim(ctx, Key(), "inv-1", next); ok || err != nil {
		t.Fatalf("Reclaim of a live claim = %v, %v; want false", ok, err)
	}
	mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: Failure("inv-1")})
	if ok, err := st.Reclaim(ctx, Key(), "inv-9", next); ok || err != nil {
		t.Fatalf("Reclaim naming another invocation = %v, %v; want false", ok, err)
	}
	if ok, err := st.Reclaim(ctx, Key(), "inv-1", executor.Reservation{Digest: "d2", InvocationID: "inv-2", TTL: TTL}); ok || err != nil {
		t.Fatalf("Reclaim with another digest = %v, %v; want false", ok, err)
	}
	if ok, err := st.Reclaim(ctx, Key(), "inv-1", next); !ok || err != nil {
		t.Fatalf("Reclaim of the finished claim = %v, %v; want true", ok, err)
	}
	if ok, _ := st.Reclaim(ctx, Key(), "inv-1", next); ok {
		t.Fatal("a claim was reclaimed twice")
	}
	wantRefused(t, st, Key(), "d1", executor.ErrInFlight)
	mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: Success("inv-2")})
	wantReplay(t, st, Key(), "d1", Success("inv-2"))

	// An abandoned claim, raced by many: exactly one wins.
	raced := Key()
	raced.Key = "raced"
	reserveFor(t, st, raced, "d1", "inv-10", shortTTL)
	time.Sleep(expiryWait)
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := st.Reclaim(ctx, raced, "inv-10", executor.Reservation{Digest: "d1", InvocationID: fmt.Sprintf("inv-r%d", i), TTL: TTL})
			if err != nil {
				t.Error(err)
			}
			if ok {
				wins.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := wins.Load(); n != 1 {
		t.Fatalf("%d reclaims won, want 1", n)
	}
}

// testSettle: the saved response of the named invocation's record is
// replaced (and the record finished); another invocation's is untouched.
func (s *suite) testSettle(t *testing.T) {
	ctx := testCtx(t)
	st := s.newStore(t)
	reserveFor(t, st, Key(), "d1", "inv-1", TTL)
	mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: Failure("inv-1")})
	if err := st.Settle(ctx, Key(), Success("inv-9")); err != nil {
		t.Fatal(err)
	}
	wantReplay(t, st, Key(), "d1", Failure("inv-1"))
	if err := st.Settle(ctx, Key(), Success("inv-1")); err != nil {
		t.Fatal(err)
	}
	wantReplay(t, st, Key(), "d1", Success("inv-1"))
	// An abandoned claim settles too.
	ab := Key()
	ab.Key = "abandoned"
	reserveFor(t, st, ab, "d1", "inv-5", shortTTL)
	time.Sleep(expiryWait)
	if err := st.Settle(ctx, ab, Success("inv-5")); err != nil {
		t.Fatal(err)
	}
	wantReplay(t, st, ab, "d1", Success("inv-5"))
}

// testSpool: spooled rows come back oldest first, byte for byte, until
// unspooled; a row needs a tenant and a record.
func (s *suite) testSpool(t *testing.T) {
	ctx := testCtx(t)
	st := s.newStore(t)
	for i := range 3 {
		rec := []byte(fmt.Sprintf(`{"invocation_id":"inv-%d","message":"\\u0000 and \\\\ survive"}`, i))
		if err := st.Spool(ctx, executor.SpooledRow{Tenant: "acme", InvocationID: fmt.Sprintf("inv-%d", i), Record: rec, Time: Base}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Spool(ctx, executor.SpooledRow{Tenant: "acme"}); err == nil {
		t.Fatal("a row without a record was spooled")
	}
	rows, err := st.Spooled(ctx, 2)
	if err != nil || len(rows) != 2 || rows[0].InvocationID != "inv-0" || rows[1].InvocationID != "inv-1" || rows[0].ID >= rows[1].ID {
		t.Fatalf("Spooled(2) = %+v, %v", rows, err)
	}
	if want := `{"invocation_id":"inv-0","message":"\\u0000 and \\\\ survive"}`; string(rows[0].Record) != want {
		t.Fatalf("record %s, want %s", rows[0].Record, want)
	}
	if err := st.Unspool(ctx, []int64{rows[0].ID}); err != nil {
		t.Fatal(err)
	}
	rows, err = st.Spooled(ctx, 10)
	if err != nil || len(rows) != 2 || rows[0].InvocationID != "inv-1" {
		t.Fatalf("after Unspool: %+v, %v", rows, err)
	}
	if err := st.Unspool(ctx, []int64{rows[0].ID, rows[1].ID}); err != nil {
		t.Fatal(err)
	}
	if rows, err := st.Spooled(ctx, 10); err != nil || len(rows) != 0 {
		t.Fatalf("after unspooling all: %+v, %v", rows, err)
	}
}

// testSpooling: Spooling names, of the tenant's invocations asked about,
// those with a row still in the spool — each once, whatever how many rows
// it has there — and none of another tenant's, nor one unspooled.
func (s *suite) testSpooling(t *testing.T) {
	ctx := testCtx(t)
	st := s.newStore(t)
	for _, r := range []struct{ tenant, inv string }{
		{"acme", "inv-intent"}, {"acme", "inv-both"}, {"acme", "inv-both"}, {"globex", "inv-other"}, {"acme", "inv-gone"},
	} {
		if err := st.Spool(ctx, executor.SpooledRow{Tenant: r.tenant, InvocationID: r.inv, Record: []byte(r.inv), Time: Base}); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := st.Spooled(ctx, 10)
	if err != nil || len(rows) != 5 {
		t.Fatalf("Spooled = %+v, %v", rows, err)
	}
	if err := st.Unspool(ctx, []int64{rows[4].ID}); err != nil {
		t.Fatal(err)
	}
	got, err := st.Spooling(ctx, "acme", []string{"inv-both", "inv-intent", "inv-other", "inv-gone", "inv-never"})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []string{"inv-both", "inv-intent"}; !slices.Equal(got, want) {
		t.Fatalf("Spooling = %v, want %v", got, want)
	}
	if got, err := st.Spooling(ctx, "acme", nil); err != nil || len(got) != 0 {
		t.Fatalf("Spooling of nothing = %v, %v", got, err)
	}
	if got, err := st.Spooling(ctx, "globex", []string{"inv-other", "inv-both"}); err != nil || !slices.Equal(got, []string{"inv-other"}) {
		t.Fatalf("Spooling(globex) = %v, %v", got, err)
	}
}

// testSpoolRows: a store that spools rows in batches (BatchSpooler)
// returns each row's id in the rows' order, as Spooled then reports them,
// after what was spooled before; a batch with an invalid row spools
// nothing.
func (s *suite) testSpoolRows(t *testing.T) {
	ctx := testCtx(t)
	st := s.newStore(t)
	bs, ok := st.(executor.BatchSpooler)
	if !ok {
		t.Skip("the store spools one row at a time")
	}
	if err := st.Spool(ctx, executor.SpooledRow{Tenant: "acme", InvocationID: "inv-first", Record: []byte("first"), Time: Base}); err != nil {
		t.Fatal(err)
	}
	var batch []executor.SpooledRow
	for i := range 40 {
		batch = append(batch, executor.SpooledRow{Tenant: []string{"acme", "globex"}[i%2], InvocationID: fmt.Sprintf("inv-%02d", i),
			Record: []byte(fmt.Sprintf("row %02d", i)), Time: Base.Add(time.Duration(i) * time.Second)})
	}
	// Lazy or not, the rows are spooled alike.
	ids, err := bs.SpoolRows(ctx, batch[:25], false)
	if err != nil || len(ids) != 25 {
		t.Fatalf("SpoolRows = %v, %v", ids, err)
	}
	more, err := bs.SpoolRows(ctx, batch[25:], true)
	if err != nil || len(more) != len(batch)-25 {
		t.Fatalf("SpoolRows(lazy) = %v, %v", more, err)
	}
	ids = append(ids, more...)
	rows, err := st.Spooled(ctx, 100)
	if err != nil || len(rows) != 1+len(batch) || rows[0].InvocationID != "inv-first" {
		t.Fatalf("Spooled = %+v, %v", rows, err)
	}
	for i, r := range rows[1:] {
		if r.ID != ids[i] || r.InvocationID != batch[i].InvocationID || r.Tenant != batch[i].Tenant || string(r.Record) != string(batch[i].Record) ||
			!r.Time.Equal(batch[i].Time) || r.ID <= rows[0].ID {
			t.Fatalf("row %d: %+v, id %d; want %+v", i, r, ids[i], batch[i])
		}
	}
	for _, lazy := range []bool{false, true} {
		if _, err := bs.SpoolRows(ctx, []executor.SpooledRow{{Tenant: "acme", InvocationID: "inv-ok", Record: []byte("ok")}, {Tenant: "acme"}}, lazy); err == nil {
			t.Fatal("a batch with a row without a record was spooled")
		}
	}
	if rows, err := st.Spooled(ctx, 100); err != nil || len(rows) != 1+len(batch) {
		t.Fatalf("after the refused batch: %d rows, %v", len(rows), err)
	}
}

// testDeadLetter: a buried row leaves the spool and is kept, byte for
// byte, per tenant; a re-driven row is spooled again (after what is
// already spooled) and leaves the dead letter; ids of another tenant are
// ignored; nil re-drives all.
func (s *suite) testDeadLetter(t *testing.T) {
	ctx := testCtx(t)
	st := s.newStore(t)
	for i := range 3 {
		if err := st.Spool(ctx, executor.SpooledRow{Tenant: "acme", InvocationID: fmt.Sprintf("inv-%d", i), Record: []byte(fmt.Sprintf(`{"n":%d}`, i)), Time: Base}); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := st.Spooled(ctx, 10)
	if err != nil || len(rows) != 3 {
		t.Fatalf("Spooled = %+v, %v", rows, err)
	}
	// inv-0 is buried from the spool; a held row of globex, never spooled, directly.
	if err := st.Bury(ctx, executor.DeadLetter{SpoolID: rows[0].ID, Tenant: "acme", InvocationID: "inv-0", Record: rows[0].Record, Spooled: Base, Dead: Base.Add(time.Minute), Reason: "refused: bad row"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Bury(ctx, executor.DeadLetter{Tenant: "globex", InvocationID: "inv-g", Record: []byte(`{"g":1}`), Reason: "refused"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Bury(ctx, executor.DeadLetter{Tenant: "acme"}); err == nil {
		t.Fatal("a dead letter without a record was kept")
	}
	if rows, err := st.Spooled(ctx, 10); err != nil || len(rows) != 2 || rows[0].InvocationID != "inv-1" {
		t.Fatalf("the buried row is still spooled: %+v, %v", rows, err)
	}
	dead, err := st.DeadLetters(ctx, "acme", 10)
	if err != nil || len(dead) != 1 {
		t.Fatalf("DeadLetters(acme) = %+v, %v", dead, err)
	}
	d := dead[0]
	if d.InvocationID != "inv-0" || string(d.Record) != `{"n":0}` || d.Reason != "refused: bad row" || !d.Spooled.Equal(Base) || !d.Dead.Equal(Base.Add(time.Minute)) || d.ID == 0 {
		t.Fatalf("dead letter %+v", d)
	}
	if g, err := st.DeadLetters(ctx, "globex", 10); err != nil || len(g) != 1 || g[0].InvocationID != "inv-g" || g[0].Dead.IsZero() {
		t.Fatalf("DeadLetters(globex) = %+v, %v", g, err)
	}
	// acme cannot re-drive globex's row by its id.
	g, _ := st.DeadLetters(ctx, "globex", 10)
	if n, err := st.Redrive(ctx, "acme", []int64{g[0].ID}); err != nil || n != 0 {
		t.Fatalf("acme re-drove globex's row: %d, %v", n, err)
	}
	if n, err := st.Redrive(ctx, "acme", []int64{}); err != nil || n != 0 {
		t.Fatalf("Redrive(no ids) = %d, %v", n, err)
	}
	if n, err := st.Redrive(ctx, "acme", []int64{d.ID}); err != nil || n != 1 {
		t.Fatalf("Redrive(acme, %d) = %d, %v", d.ID, n, err)
	}
	rows, err = st.Spooled(ctx, 10)
	if err != nil || len(rows) != 3 || rows[2].InvocationID != "inv-0" || string(rows[2].Record) != `{"n":0}` || !rows[2].Time.Equal(Base) {
		t.Fatalf("after Redrive the spool is %+v, %v", rows, err)
	}
	if dead, err := st.DeadLetters(ctx, "acme", 10); err != nil || len(dead) != 0 {
		t.Fatalf("after Redrive the dead letter holds %+v, %v", dead, err)
	}
	if n, err := st.Redrive(ctx, "globex", nil); err != nil || n != 1 {
		t.Fatalf("Redrive(globex, all) = %d, %v", n, err)
	}
	if g, err := st.DeadLetters(ctx, "globex", 10); err != nil || len(g) != 0 {
		t.Fatalf("after Redrive(all) globex holds %+v, %v", g, err)
	}
}

// testResolve: an operator's verdict finds an invocation's key whatever its
// state: never run drops it (a retry claims it), run finishes it.
func (s *suite) testResolve(t *testing.T) {
	ctx := testCtx(t)
	st := s.newStore(t)
	reserveFor(t, st, Key(), "d1", "inv-1", TTL)
	mustFinish(t, st, executor.Finish{Key: new(Key()), Saved: Failure("inv-1")})
	if ok, err := st.Resolve(ctx, "globex", "inv-1", nil); ok || err != nil {
		t.Fatalf("Resolve in another tenant = %v, %v", ok, err)
	}
	if ok, err := st.Resolve(ctx, "acme", "inv-1", nil); !ok || err != nil {
		t.Fatalf("Resolve as never run = %v, %v", ok, err)
	}
	reserveFor(t, st, Key(), "d1", "inv-2", TTL)
	saved := Success("inv-2")
	if ok, err := st.Resolve(ctx, "acme", "inv-2", &saved); !ok || err != nil {
		t.Fatalf("Resolve as run = %v, %v", ok, err)
	}
	wantReplay(t, st, Key(), "d1", Success("inv-2"))
	if ok, err := st.Resolve(ctx, "acme", "inv-404", nil); ok || err != nil {
		t.Fatalf("Resolve of an invocation with no key = %v, %v", ok, err)
	}
}

// testPeek: Peek answers what Reserve would, for each state of a key, and
// claims nothing — a peeked free key is still free.
func (s *suite) testPeek(t *testing.T) {
	st := s.newStore(t)
	ctx := testCtx(t)
	key := Key()
	peek := func(digest string) (*executor.Saved, error) {
		t.Helper()
		return st.Peek(ctx, key, digest)
	}
	if saved, err := peek("d1"); saved != nil || err != nil {
		t.Fatalf("Peek of a free key = (%+v, %v), want (nil, nil)", saved, err)
	}
	mustReserve(t, st, key, "d1", TTL) // the peek claimed nothing
	if _, err := peek("d1"); !errors.Is(err, executor.ErrInFlight) {
		t.Fatalf("Peek of a key in flight: %v, want ErrInFlight", err)
	}
	if _, err := peek("d2"); !errors.Is(err, executor.ErrKeyReused) {
		t.Fatalf("Peek with another digest: %v, want ErrKeyReused", err)
	}
	mustFinish(t, st, executor.Finish{Key: &key, Saved: Success("inv-1")})
	saved, err := peek("d1")
	if err != nil || saved == nil || !sameSaved(*saved, Success("inv-1")) {
		t.Fatalf("Peek of a finished key = (%+v, %v), want its saved response", saved, err)
	}
	wantReplay(t, st, key, "d1", Success("inv-1")) // and it is still there

	leased := executor.IdemKey{Tenant: "acme", User: "alice", Command: "ticket.refund", Key: "leased"}
	if _, err := st.Reserve(ctx, leased, executor.Reservation{Digest: "d1", InvocationID: "inv-dead", TTL: TTL, Lease: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(expiryWait)
	var abandoned *executor.AbandonedError
	if _, err := st.Peek(ctx, leased, "d1"); !errors.As(err, &abandoned) || abandoned.InvocationID != "inv-dead" {
		t.Fatalf("Peek of a key whose lease lapsed: %v, want an AbandonedError naming inv-dead", err)
	}
	if _, err := st.Peek(ctx, executor.IdemKey{Tenant: "acme"}, "d1"); err == nil {
		t.Fatal("Peek of an incomplete key: no error")
	}
}

// testRenew: renewing a claim keeps it in flight past its first lease,
// for its own invocation only; a finished, released or taken-over claim
// is not renewed (false), and renewing says so without changing it.
func (s *suite) testRenew(t *testing.T) {
	st := s.newStore(t)
	ctx := testCtx(t)
	const lease = 300 * time.Millisecond
	key := Key()
	reserveFor(t, st, key, "d1", "inv-1", lease)
	for range 3 {
		time.Sleep(lease / 2)
		if ok, err := st.Renew(ctx, key, "inv-1", lease); !ok || err != nil {
			t.Fatalf("Renew by its holder = (%v, %v), want (true, nil)", ok, err)
		}
	}
	// Held for 1.5 leases, renewed: still in flight, not abandoned.
	wantRefused(t, st, key, "d1", executor.ErrInFlight)
	if ok, err := st.Renew(ctx, key, "inv-other", lease); ok || err != nil {
		t.Fatalf("Renew by another invocation = (%v, %v), want (false, nil)", ok, err)
	}
	// Once it stops renewing, the claim lapses.
	time.Sleep(lease + expiryWait)
	var ab *executor.AbandonedError
	if _, err := st.Reserve(ctx, key, executor.Reservation{Digest: "d1", InvocationID: "inv-2", TTL: TTL}); !errors.As(err, &ab) {
		t.Fatalf("Reserve after the renewals stopped = %v, want AbandonedError", err)
	}
	// Taken over by a retry: the old holder's renewal is refused.
	if ok, err := st.Reclaim(ctx, key, "inv-1", executor.Reservation{Digest: "d1", InvocationID: "inv-2", TTL: TTL, Lease: lease}); !ok || err != nil {
		t.Fatalf("Reclaim = (%v, %v)", ok, err)
	}
	if ok, err := st.Renew(ctx, key, "inv-1", lease); ok || err != nil {
		t.Fatalf("Renew by the holder it was taken from = (%v, %v), want (false, nil)", ok, err)
	}
	if ok, err := st.Renew(ctx, key, "inv-2", lease); !ok || err != nil {
		t.Fatalf("Renew by the new holder = (%v, %v), want (true, nil)", ok, err)
	}
	// Finished: nothing to renew, and the saved response stays.
	mustFinish(t, st, executor.Finish{Key: &key, Saved: Success("inv-2")})
	if ok, err := st.Renew(ctx, key, "inv-2", lease); ok || err != nil {
		t.Fatalf("Renew of a finished claim = (%v, %v), want (false, nil)", ok, err)
	}
	wantReplay(t, st, key, "d1", Success("inv-2"))
	// Released: nothing to renew.
	gone := Key()
	gone.Key = "released"
	reserveFor(t, st, gone, "d1", "inv-3", lease)
	if err := st.Release(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.Renew(ctx, gone, "inv-3", lease); ok || err != nil {
		t.Fatalf("Renew of a released claim = (%v, %v), want (false, nil)", ok, err)
	}
	if _, err := st.Renew(ctx, key, "inv-2", 0); err == nil {
		t.Fatal("Renew with no lease: no error")
	}
}

// item is a use of bucket: amount against max, in a window that does not lapse during a test.
func item(bucket string, amount, max int64) executor.SpendItem {
	return executor.SpendItem{Bucket: bucket, Amount: amount, Max: max, Window: TTL}
}

// spending is a use of items in acme.
func spending(items ...executor.SpendItem) executor.Spending {
	return executor.Spending{Tenant: "acme", Items: items}
}

// keyed is a use of items in acme by the call holding key.
func keyed(key executor.IdemKey, items ...executor.SpendItem) executor.Spending {
	return executor.Spending{Tenant: "acme", Key: &key, Items: items}
}

// mustSpend spends sp and returns one balance per item; a recorded item says when it lapses:
// its window after now, rounded up by at most the window's grain.
func mustSpend(t *testing.T, st executor.Store, sp executor.Spending) []executor.Balance {
	t.Helper()
	before := time.Now()
	bs, err := st.Spend(testCtx(t), sp)
	if err != nil {
		t.Fatalf("Spend(%+v): %v", sp, err)
	}
	if len(bs) != len(sp.Items) {
		t.Fatalf("Spend(%+v) = %d balances, want one per item (%d)", sp, len(bs), len(sp.Items))
	}
	for i, b := range bs {
		it := sp.Items[i]
		recorded := !sp.DryRun && it.Amount > 0 && (sp.Force || allFit(bs))
		switch {
		case recorded && b.Lapses.IsZero():
			t.Fatalf("Spend(%+v): item %d recorded without Lapses", sp, i)
		case !recorded && !b.Lapses.IsZero():
			t.Fatalf("Spend(%+v): item %d not recorded, yet Lapses %s", sp, i, b.Lapses)
		case recorded:
			// The store's clock (the database's) may be a little off the test's.
			lo, hi := before.Add(it.Window-time.Second), time.Now().Add(it.Window+executor.SpendGrain(it.Window)+time.Second)
			if b.Lapses.Before(lo) || b.Lapses.After(hi) {
				t.Fatalf("Spend(%+v): item %d lapses at %s, want within [%s, %s]", sp, i, b.Lapses, lo, hi)
			}
		}
	}
	return bs
}

// allFit reports whether every balance fits.
func allFit(bs []executor.Balance) bool {
	for _, b := range bs {
		if !b.Fits {
			return false
		}
	}
	return true
}

// used is what tenant's bucket holds, as a dry run with window (the window the bucket's spends
// were made with) reads it.
func used(t *testing.T, st executor.Store, tenant, bucket string, window time.Duration) int64 {
	t.Helper()
	sp := executor.Spending{Tenant: tenant, DryRun: true,
		Items: []executor.SpendItem{{Bucket: bucket, Amount: 0, Max: 1, Window: window}}}
	return mustSpend(t, st, sp)[0].Used
}

// wantBalance asserts a balance's Used and Fits, and that RetryAfter is 0 when it fits and
// within (0, window + its grain] when it does not (the amount alone being at most the
// ceiling): a spend counts for its window rounded up to the grain.
func wantBalance(t *testing.T, what string, got executor.Balance, used int64, fits bool, window time.Duration) {
	t.Helper()
	if got.Used != used || got.Fits != fits {
		t.Fatalf("%s: balance %+v, want Used %d, Fits %v", what, got, used, fits)
	}
	if fits && got.RetryAfter != 0 {
		t.Fatalf("%s: fits with RetryAfter %s, want 0", what, got.RetryAfter)
	}
	if limit := window + executor.SpendGrain(window); !fits && (got.RetryAfter <= 0 || got.RetryAfter > limit) {
		t.Fatalf("%s: RetryAfter %s, want within (0, %s]", what, got.RetryAfter, limit)
	}
}

// testSpend: what fits is recorded and counts for every later call; the balances come in the
// order of the items; an empty spending spends nothing.
func (s *suite) testSpend(t *testing.T) {
	st := s.newStore(t)
	bs := mustSpend(t, st, spending(item("a", 3, 5), item("b", 1, 2)))
	wantBalance(t, "first a", bs[0], 0, true, TTL)
	wantBalance(t, "first b", bs[1], 0, true, TTL)
	if ua, ub := used(t, st, "acme", "a", TTL), used(t, st, "acme", "b", TTL); ua != 3 || ub != 1 {
		t.Fatalf("used a %d, b %d; want 3 and 1", ua, ub)
	}
	bs = mustSpend(t, st, spending(item("b", 1, 2), item("a", 2, 5)))
	wantBalance(t, "second b", bs[0], 1, true, TTL)
	wantBalance(t, "second a", bs[1], 3, true, TTL)
	// a is full: the next unit does not fit, and waits for a spend to lapse.
	bs = mustSpend(t, st, spending(item("a", 1, 5)))
	wantBalance(t, "a full", bs[0], 5, false, TTL)
	// Nothing spent still fits a full bucket, and records nothing.
	bs = mustSpend(t, st, spending(item("a", 0, 5)))
	wantBalance(t, "a, nothing", bs[0], 5, true, TTL)
	if ua := used(t, st, "acme", "a", TTL); ua != 5 {
		t.Fatalf("used a %d after a refusal and a zero spend, want 5", ua)
	}
	bs, err := st.Spend(testCtx(t), spending())
	if err != nil || len(bs) != 0 {
		t.Fatalf("Spend of no items = (%+v, %v), want no balances", bs, err)
	}
}

// testSpendAllOrNone: when one item does not fit, none is recorded.
func (s *suite) testSpendAllOrNone(t *testing.T) {
	st := s.newStore(t)
	mustSpend(t, st, spending(item("b", 2, 2)))
	mustSpend(t, st, spending(item("c", 1, 5)))
	for _, items := range [][]executor.SpendItem{
		{item("a", 1, 5), item("b", 1, 2), item("c", 2, 5)},
		{item("b", 1, 2), item("c", 2, 5), item("a", 1, 5)},
	} {
		bs := mustSpend(t, st, spending(items...))
		for i, it := range items {
			switch it.Bucket {
			case "a":
				wantBalance(t, "a", bs[i], 0, true, TTL)
			case "b":
				wantBalance(t, "b", bs[i], 2, false, TTL)
			case "c":
				wantBalance(t, "c", bs[i], 1, true, TTL)
			}
		}
		if ua, ub, uc := used(t, st, "acme", "a", TTL), used(t, st, "acme", "b", TTL), used(t, st, "acme", "c", TTL); ua != 0 || ub != 2 || uc != 1 {
			t.Fatalf("after a refused spending: used a %d, b %d, c %d; want 0, 2, 1 (nothing recorded)", ua, ub, uc)
		}
	}
}

// testSpendKeyed: a spend made with its call's idempotency key is noted on the key's record,
// and Reclaim, handing the key to a retry because that call never ran (its lease lapsed and
// its backend fenced it), gives it back — so the retry's own spend counts once; so does
// Resolve of the call as never run. A Reclaim that does not hand the key over gives nothing
// back, nor does one of a key whose spending did not fit (nothing was recorded).
func (s *suite) testSpendKeyed(t *testing.T) {
	st := s.newStore(t)
	ctx := testCtx(t)
	const lease = 100 * time.Millisecond
	key, other, unfit := Key(), Key(), Key()
	other.Key, unfit.Key = "other", "unfit"
	reserveFor(t, st, key, "d1", "inv-1", lease)
	reserveFor(t, st, other, "d1", "inv-9", lease)
	reserveFor(t, st, unfit, "d1", "inv-5", lease)
	mustSpend(t, st, keyed(key, item("a", 2, 5), item("b", 1, 5)))
	mustSpend(t, st, keyed(other, item("a", 1, 5)))
	if bs := mustSpend(t, st, keyed(unfit, item("a", 3, 5), item("b", 1, 5))); bs[0].Fits {
		t.Fatalf("unfit's spending fits: %+v", bs)
	}
	if ua, ub := used(t, st, "acme", "a", TTL), used(t, st, "acme", "b", TTL); ua != 3 || ub != 1 {
		t.Fatalf("used a %d, b %d; want 3 and 1", ua, ub)
	}
	time.Sleep(lease + expiryWait) // the holders' executors died: their leases lapsed
	retry := executor.Reservation{Digest: "d1", InvocationID: "inv-2", TTL: TTL, Lease: time.Minute}
	if ok, err := st.Reclaim(ctx, key, "inv-1", retry); !ok || err != nil {
		t.Fatalf("Reclaim = (%v, %v), want (true, nil)", ok, err)
	}
	if ua, ub := used(t, st, "acme", "a", TTL), used(t, st, "acme", "b", TTL); ua != 1 || ub != 0 {
		t.Fatalf("after the Reclaim: used a %d, b %d; want 1 (other's) and 0", ua, ub)
	}
	mustSpend(t, st, keyed(key, item("a", 2, 5)))
	// Not handed over (the key is inv-2's now): nothing given back.
	if ok, err := st.Reclaim(ctx, key, "inv-1", executor.Reservation{Digest: "d1", InvocationID: "inv-3", TTL: TTL}); ok || err != nil {
		t.Fatalf("a stale Reclaim = (%v, %v), want (false, nil)", ok, err)
	}
	if ok, err := st.Reclaim(ctx, unfit, "inv-5", executor.Reservation{Digest: "d1", InvocationID: "inv-6", TTL: TTL}); !ok || err != nil {
		t.Fatalf("Reclaim of unfit = (%v, %v), want (true, nil)", ok, err)
	}
	if ua := used(t, st, "acme", "a", TTL); ua != 3 {
		t.Fatalf("used a %d; want 3 (other's 1, the retry's 2)", ua)
	}
	// An operator's verdict that a call never ran gives its spend back too.
	resolved := Key()
	resolved.Key = "resolved"
	reserveFor(t, st, resolved, "d1", "inv-7", time.Minute)
	mustSpend(t, st, keyed(resolved, item("a", 1, 5)))
	if ua := used(t, st, "acme", "a", TTL); ua != 4 {
		t.Fatalf("used a %d; want 4", ua)
	}
	if ok, err := st.Resolve(ctx, "acme", "inv-7", nil); !ok || err != nil {
		t.Fatalf("Resolve as never run = (%v, %v), want (true, nil)", ok, err)
	}
	if ua := used(t, st, "acme", "a", TTL); ua != 3 {
		t.Fatalf("used a %d after the call was resolved as never run; want 3", ua)
	}
	// A spend with a key that has no record is counted all the same.
	gone := Key()
	gone.Key = "never-reserved"
	mustSpend(t, st, keyed(gone, item("a", 1, 5)))
	if ua := used(t, st, "acme", "a", TTL); ua != 4 {
		t.Fatalf("used a %d; want 4", ua)
	}
}

// testRefund: a refund gives back what the receipt says was spent, and only that.
func (s *suite) testRefund(t *testing.T) {
	st := s.newStore(t)
	ctx := testCtx(t)
	sp := spending(item("a", 2, 5), item("b", 1, 5))
	receipt := executor.ReceiptOf(sp, mustSpend(t, st, sp))
	if len(receipt) != 2 {
		t.Fatalf("receipt %+v, want two items", receipt)
	}
	mustSpend(t, st, spending(item("a", 1, 5)))
	mustSpend(t, st, executor.Spending{Tenant: "globex", Items: []executor.SpendItem{item("a", 4, 5)}})
	if err := st.Refund(ctx, "acme", receipt); err != nil {
		t.Fatalf("Refund: %v", err)
	}
	if ua, ub, ug := used(t, st, "acme", "a", TTL), used(t, st, "acme", "b", TTL), used(t, st, "globex", "a", TTL); ua != 1 || ub != 0 || ug != 4 {
		t.Fatalf("after the refund: used acme a %d, b %d, globex a %d; want 1, 0, 4", ua, ub, ug)
	}
	if err := st.Refund(ctx, "acme", nil); err != nil {
		t.Fatalf("Refund of an empty receipt: %v", err)
	}
	if err := st.Refund(ctx, "initech", receipt); err != nil {
		t.Fatalf("Refund in an unknown tenant: %v", err)
	}
	// A receipt of an instant the bucket holds nothing at gives nothing back.
	stale := []executor.Spent{{Bucket: "a", Amount: 1, Lapses: receipt[0].Lapses.Add(-time.Minute)}}
	if err := st.Refund(ctx, "acme", stale); err != nil {
		t.Fatalf("Refund of a stale receipt: %v", err)
	}
	bs := mustSpend(t, st, spending(item("a", 4, 5)))
	wantBalance(t, "after the refund", bs[0], 1, true, TTL)
}

// testSpendForce: a forced spending is recorded whole, past the ceiling, and says what did not
// fit; a forced dry run records nothing.
func (s *suite) testSpendForce(t *testing.T) {
	st := s.newStore(t)
	mustSpend(t, st, spending(item("a", 5, 5)))
	sp := spending(item("b", 1, 5), item("a", 2, 5))
	sp.Force = true
	bs := mustSpend(t, st, sp)
	wantBalance(t, "forced b", bs[0], 0, true, TTL)
	wantBalance(t, "forced a", bs[1], 5, false, TTL)
	if ua, ub := used(t, st, "acme", "a", TTL), used(t, st, "acme", "b", TTL); ua != 7 || ub != 1 {
		t.Fatalf("after a forced spending: used a %d, b %d; want 7, 1", ua, ub)
	}
	bs = mustSpend(t, st, spending(item("a", 1, 5)))
	wantBalance(t, "past the ceiling", bs[0], 7, false, TTL)
	bs = mustSpend(t, st, spending(item("a", 0, 5)))
	if bs[0].Used != 7 || bs[0].Fits {
		t.Fatalf("nothing spent past the ceiling: %+v, want Used 7 and not fitting", bs[0])
	}
	sp = spending(item("a", 3, 5))
	sp.Force, sp.DryRun = true, true
	mustSpend(t, st, sp)
	if ua := used(t, st, "acme", "a", TTL); ua != 7 {
		t.Fatalf("after a forced dry run: used a %d, want 7", ua)
	}
}

// testSpendDryRun: a dry run reads the balances and records nothing, whether it fits or not.
func (s *suite) testSpendDryRun(t *testing.T) {
	st := s.newStore(t)
	dry := func(items ...executor.SpendItem) []executor.Balance {
		sp := spending(items...)
		sp.DryRun = true
		return mustSpend(t, st, sp)
	}
	bs := dry(item("a", 2, 5))
	wantBalance(t, "dry", bs[0], 0, true, TTL)
	if u := used(t, st, "acme", "a", TTL); u != 0 {
		t.Fatalf("used %d after a dry run, want 0", u)
	}
	mustSpend(t, st, spending(item("a", 2, 5)))
	bs = dry(item("a", 3, 5))
	wantBalance(t, "dry, just fits", bs[0], 2, true, TTL)
	bs = dry(item("a", 4, 5))
	wantBalance(t, "dry, too much", bs[0], 2, false, TTL)
	if u := used(t, st, "acme", "a", TTL); u != 2 {
		t.Fatalf("used %d after dry runs, want 2", u)
	}
}

// testSpendWindow: a spend counts for its window (rounded up to the grain), then lapses;
// RetryAfter says when enough has lapsed, and is 0 for an amount that never fits.
func (s *suite) testSpendWindow(t *testing.T) {
	const window = 300 * time.Millisecond
	in := func(bucket string, amount, max int64) executor.SpendItem {
		return executor.SpendItem{Bucket: bucket, Amount: amount, Max: max, Window: window}
	}
	st := s.newStore(t)
	mustSpend(t, st, spending(in("a", 1, 1)))
	bs := mustSpend(t, st, spending(in("a", 1, 1)))
	wantBalance(t, "within the window", bs[0], 1, false, window)
	if bs := mustSpend(t, st, spending(in("a", 2, 1))); bs[0].Fits || bs[0].RetryAfter != 0 {
		t.Fatalf("an amount over the ceiling: %+v, want no fit and RetryAfter 0", bs[0])
	}
	time.Sleep(bs[0].RetryAfter + expiryWait)
	bs = mustSpend(t, st, spending(in("a", 1, 1)))
	wantBalance(t, "after RetryAfter", bs[0], 0, true, window)
	if u := used(t, st, "acme", "a", window); u != 1 {
		t.Fatalf("used %d, want the second spend's 1 (the first lapsed)", u)
	}

	// Spends lapse in order: one unit is free once the oldest lapses, all three once the
	// newest does.
	mustSpend(t, st, spending(in("b", 1, 3)))
	time.Sleep(window / 3)
	mustSpend(t, st, spending(in("b", 2, 3)))
	one := mustSpend(t, st, executor.Spending{Tenant: "acme", DryRun: true, Items: []executor.SpendItem{in("b", 1, 3)}})[0]
	all := mustSpend(t, st, executor.Spending{Tenant: "acme", DryRun: true, Items: []executor.SpendItem{in("b", 3, 3)}})[0]
	wantBalance(t, "one unit", one, 3, false, window)
	wantBalance(t, "three units", all, 3, false, window)
	if all.RetryAfter <= one.RetryAfter {
		t.Fatalf("RetryAfter for 3 units %s, for 1 unit %s; want it longer for 3 (the newest spend lapses last)", all.RetryAfter, one.RetryAfter)
	}
	time.Sleep(window + executor.SpendGrain(window) + expiryWait)
	if u := used(t, st, "acme", "b", window); u != 0 {
		t.Fatalf("used %d after the window, want 0", u)
	}
}

// testSpendGrain: spends whose windows end within one grain share one entry (a bucket holds
// about 65 entries per window however many calls spend), and a spend never counts for less
// than its window.
func (s *suite) testSpendGrain(t *testing.T) {
	st := s.newStore(t)
	const window = time.Hour
	grain := executor.SpendGrain(window)
	if grain != window/64 {
		t.Fatalf("SpendGrain(%s) = %s, want %s", window, grain, window/64)
	}
	var lapses []time.Time
	for range 5 {
		sp := spending(executor.SpendItem{Bucket: "g", Amount: 1, Max: 100, Window: window})
		before := time.Now()
		b := mustSpend(t, st, sp)[0]
		if b.Lapses.Before(before.Add(window).Add(-time.Second)) || b.Lapses.UnixMicro()%grain.Microseconds() != 0 {
			t.Fatalf("lapses at %s: want at least the window after the call, on the grain", b.Lapses)
		}
		lapses = append(lapses, b.Lapses)
	}
	distinct := map[int64]bool{}
	for _, l := range lapses {
		distinct[l.UnixMicro()] = true
	}
	if len(distinct) > 2 { // five calls within a second fall in at most two grains of a minute
		t.Fatalf("five spends within a second lapse at %d instants, want at most 2", len(distinct))
	}
	if u := used(t, st, "acme", "g", window); u != 5 {
		t.Fatalf("used %d, want 5", u)
	}
}

// testSpendScopes: tenants and buckets are independent.
func (s *suite) testSpendScopes(t *testing.T) {
	st := s.newStore(t)
	mustSpend(t, st, spending(item("a", 5, 5)))
	bs := mustSpend(t, st, executor.Spending{Tenant: "globex", Items: []executor.SpendItem{item("a", 5, 5)}})
	wantBalance(t, "other tenant", bs[0], 0, true, TTL)
	bs = mustSpend(t, st, spending(item("a2", 5, 5)))
	wantBalance(t, "other bucket", bs[0], 0, true, TTL)
	bs = mustSpend(t, st, spending(item("a", 1, 5)))
	wantBalance(t, "the full bucket", bs[0], 5, false, TTL)
	if u := used(t, st, "acme", "a", TTL); u != 5 {
		t.Fatalf("acme's bucket a holds %d, want 5", u)
	}
}

// testSpendInvalid: a spending the store refuses matches ErrSpendInvalid and records nothing.
func (s *suite) testSpendInvalid(t *testing.T) {
	valid := func() executor.Spending {
		return spending(item("a", 1, 5), item("b", 1, 5))
	}
	tests := []struct {
		name   string
		mutate func(*executor.Spending)
	}{
		{"no tenant", func(sp *executor.Spending) { sp.Tenant = "" }},
		{"no bucket", func(sp *executor.Spending) { sp.Items[1].Bucket = "" }},
		{"a bucket twice", func(sp *executor.Spending) { sp.Items[1].Bucket = "a" }},
		{"negative amount", func(sp *executor.Spending) { sp.Items[1].Amount = -1 }},
		{"zero ceiling", func(sp *executor.Spending) { sp.Items[1].Max = 0 }},
		{"negative ceiling", func(sp *executor.Spending) { sp.Items[1].Max = -5 }},
		{"zero window", func(sp *executor.Spending) { sp.Items[1].Window = 0 }},
		{"negative window", func(sp *executor.Spending) { sp.Items[1].Window = -time.Second }},
		{"forced", func(sp *executor.Spending) { sp.Items[1].Max, sp.Force = 0, true }},
		{"no tenant and no items", func(sp *executor.Spending) { sp.Tenant, sp.Items = "", nil }},
	}
	st := s.newStore(t) // shared: no case may record anything
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp := valid()
			tt.mutate(&sp)
			bs, err := st.Spend(testCtx(t), sp)
			if !errors.Is(err, executor.ErrSpendInvalid) || bs != nil {
				t.Fatalf("Spend = (%+v, %v), want ErrSpendInvalid", bs, err)
			}
			if errors.Is(err, executor.ErrUnavailable) {
				t.Fatalf("err = %v, matches ErrUnavailable", err)
			}
			if ua := used(t, st, "acme", "a", TTL); ua != 0 {
				t.Fatalf("the valid item was recorded: used %d", ua)
			}
		})
	}
}

// testPurgeSpends: Purge drops the spends whose window has passed, and counts them; what still
// counts is kept, and a purged bucket counts nothing.
func (s *suite) testPurgeSpends(t *testing.T) {
	st := s.newStore(t)
	short := func(bucket string, amount int64) executor.SpendItem {
		return executor.SpendItem{Bucket: bucket, Amount: amount, Max: 5, Window: shortTTL}
	}
	mustSpend(t, st, spending(short("a", 2), short("b", 0))) // b: nothing recorded
	// Another bucket: a store may also drop a bucket's lapsed spends when it is spent in again.
	mustSpend(t, st, spending(item("c", 3, 5)))
	time.Sleep(expiryWait)
	policy := executor.PurgePolicy{Now: time.Now(), KeepEvents: TTL}
	if n := mustPurge(t, st, policy); n != (executor.Purged{Spends: 1}) {
		t.Fatalf("Purge = %+v, want 1 spend", n)
	}
	if n := mustPurge(t, st, policy); n != (executor.Purged{}) {
		t.Fatalf("second Purge = %+v, want nothing", n)
	}
	if u := used(t, st, "acme", "c", TTL); u != 3 {
		t.Fatalf("used %d after the purge, want the long spend's 3 kept", u)
	}
	if u := used(t, st, "acme", "a", TTL); u != 0 {
		t.Fatalf("used %d of the purged bucket, want 0", u)
	}
	// A purge at a later instant takes what lapses by then.
	if n := mustPurge(t, st, executor.PurgePolicy{Now: time.Now().Add(2 * TTL), KeepEvents: TTL}); n != (executor.Purged{Spends: 1}) {
		t.Fatalf("Purge an hour on = %+v, want 1 spend", n)
	}
}

// testSpendConcurrent: spendings racing for one bucket never take more than it holds.
func (s *suite) testSpendConcurrent(t *testing.T) {
	const n = 64
	race := func(t *testing.T, st executor.Store, items func(i int) []executor.SpendItem) (fit []bool) {
		t.Helper()
		ctx := testCtx(t)
		fit = make([]bool, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				bs, err := st.Spend(ctx, spending(items(i)...))
				if err != nil {
					t.Errorf("Spend %d: %v", i, err)
					return
				}
				fit[i] = len(bs) > 0
				for _, b := range bs {
					fit[i] = fit[i] && b.Fits
				}
				if fit[i] != bs[0].Fits {
					t.Errorf("Spend %d: balances %+v disagree on two buckets spent together", i, bs)
				}
			})
		}
		close(start)
		wg.Wait()
		return fit
	}
	count := func(fit []bool) int {
		k := 0
		for _, f := range fit {
			if f {
				k++
			}
		}
		return k
	}
	t.Run("units", func(t *testing.T) {
		st := s.newStore(t)
		fit := race(t, st, func(int) []executor.SpendItem { return []executor.SpendItem{item("a", 1, 10)} })
		if k, u := count(fit), used(t, st, "acme", "a", TTL); k != 10 || u != 10 {
			t.Fatalf("%d spendings fit, used %d; want 10 and 10", k, u)
		}
	})
	t.Run("amounts", func(t *testing.T) {
		st := s.newStore(t)
		const ceiling = 25
		amount := func(i int) int64 { return int64(1 + i%4) }
		fit := race(t, st, func(i int) []executor.SpendItem { return []executor.SpendItem{item("a", amount(i), ceiling)} })
		var sum int64
		for i, f := range fit {
			if f {
				sum += amount(i)
			}
		}
		u := used(t, st, "acme", "a", TTL)
		if sum > ceiling || u != sum {
			t.Fatalf("the fitting spendings sum to %d, used %d; want at most %d, and equal", sum, u, ceiling)
		}
		// What is left only shrinks: every refusal was needed.
		for i, f := range fit {
			if !f && amount(i) <= ceiling-u {
				t.Fatalf("spending %d of %d was refused with %d left", i, amount(i), ceiling-u)
			}
		}
	})
	t.Run("two buckets in either order", func(t *testing.T) {
		st := s.newStore(t)
		fit := race(t, st, func(i int) []executor.SpendItem {
			if i%2 == 0 {
				return []executor.SpendItem{item("a", 1, 10), item("b", 1, 10)}
			}
			return []executor.SpendItem{item("b", 1, 10), item("a", 1, 10)}
		})
		if k, ua, ub := count(fit), used(t, st, "acme", "a", TTL), used(t, st, "acme", "b", TTL); k != 10 || ua != 10 || ub != 10 {
			t.Fatalf("%d spendings fit, used a %d, b %d; want 10, 10, 10", k, ua, ub)
		}
	})
}
