package postgres_test

import (
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/executor"
	"github.com/mandate-dev/mandate/services/executor/executortest"
	"github.com/mandate-dev/mandate/services/executor/postgres"
)

// TestRelayLeaseGoesWithItsConnection: a holder of the relay lease whose connection dies
// (its executor killed mid-round: here its backend is terminated) does not keep it: another
// gets it once the server has ended the session, without the holder's release; the dead
// holder's release, when it comes, neither fails nor takes the lease from the new holder.
// And a released lease leaves no advisory lock with the pool's connections.
func TestRelayLeaseGoesWithItsConnection(t *testing.T) {
	pool := pgtest.New(t, postgres.Migrations)
	st := postgres.New(pool, postgres.Options{})
	ctx := ctxFor(t)
	granted := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
			WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	lease, err := st.TryRelayLease(ctx, nil)
	if err != nil || lease == nil {
		t.Fatalf("TryRelayLease = %v, %v", lease, err)
	}
	release := lease.Release
	if n := granted(); n != 1 {
		t.Fatalf("%d advisory locks held with the lease, want 1", n)
	}
	release()
	if n := granted(); n != 0 {
		t.Fatalf("%d advisory locks held after the release, want none: a pooled connection kept the lease", n)
	}

	deadLease, err := st.TryRelayLease(ctx, nil)
	if err != nil || deadLease == nil {
		t.Fatalf("TryRelayLease = %v, %v", deadLease, err)
	}
	dead := deadLease.Release
	var killed int
	if err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
		WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d holders, %v; want the one", killed, err)
	}
	var next func()
	for deadline := time.Now().Add(10 * time.Second); next == nil; time.Sleep(5 * time.Millisecond) {
		r, err := st.TryRelayLease(ctx, nil)
		switch {
		case err != nil:
			t.Fatal(err)
		case r != nil:
			next = r.Release
		case time.Now().After(deadline):
			t.Fatal("after 10s the lease of a holder whose connection died is still held")
		}
	}
	dead() // the unlock fails on the dead connection, which is dropped from the pool
	if r, err := st.TryRelayLease(ctx, nil); err != nil || r != nil {
		if r != nil {
			r.Release()
		}
		t.Fatalf("TryRelayLease after the dead holder's release = %v, %v; want it refused, the new holder holding it", r, err)
	}
	next()
	if n := granted(); n != 0 {
		t.Fatalf("%d advisory locks held after the release, want none", n)
	}
}

// TestRelayLeaseUnspoolsAndUnlocksAtOnce: a round's rows are dropped and its lease given back
// in one exchange (RelayLease.UnspoolAndRelease); no advisory lock stays, the connection goes
// back to the pool, the rows are gone, and the next holder gets the lease at once.
func TestRelayLeaseUnspoolsAndUnlocksAtOnce(t *testing.T) {
	ctx := ctxFor(t)
	pool := pgtest.New(t, postgres.Migrations)
	st := postgres.New(pool, postgres.Options{})
	for _, inv := range []string{"inv-1", "inv-2"} {
		if err := st.Spool(ctx, executor.SpooledRow{Tenant: "acme", InvocationID: inv, Record: []byte(`{}`), Time: executortest.Base}); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := st.Spooled(ctx, 10)
	if err != nil || len(rows) != 2 {
		t.Fatalf("Spooled = %v, %v", rows, err)
	}
	ids := []int64{rows[0].ID, rows[1].ID}
	lease, err := st.TryRelayLease(ctx, ids)
	if err != nil || lease == nil || len(lease.Left) != 2 || lease.Oldest != ids[0] {
		t.Fatalf("TryRelayLease = %+v, %v; want the lease, both rows still spooled", lease, err)
	}
	if err := lease.UnspoolAndRelease(ctx, st, ids); err != nil {
		t.Fatal(err)
	}
	lease.Release() // already given back: a no-op
	var locks int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
		WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()`).Scan(&locks); err != nil || locks != 0 {
		t.Fatalf("%d advisory locks held after UnspoolAndRelease (%v), want none", locks, err)
	}
	if left, err := st.Spooled(ctx, 10); err != nil || len(left) != 0 {
		t.Fatalf("still spooled: %v, %v", left, err)
	}
	next, err := st.TryRelayLease(ctx, nil)
	if err != nil || next == nil {
		t.Fatalf("the next holder: %v, %v", next, err)
	}
	next.Release()
}
