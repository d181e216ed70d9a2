package postgres_test

import (
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/storage/pgtest"
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
