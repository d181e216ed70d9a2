package postgres

import (
	"context"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandate-dev/mandate/services/executor"
)

// The relay lease (executor.RelayLeaser) is a session advisory lock on relayLeaseKey, taken
// with pg_try_advisory_lock on a connection of the pool that the holder keeps for its round,
// and given back with pg_advisory_unlock before the connection returns to the pool. Advisory
// locks are per database, and the executor's tables have a fixed schema, so the key is one
// per store. A lock goes with its session: a holder killed mid-round (its process, or its
// connection) gives it up as soon as the server sees its connection end (at once for a
// process that dies on the server's host or closes its socket; across a network partition,
// when TCP keepalive gives up). It needs a connection that is its own session: through a
// pooler in transaction mode (PgBouncer), the lock would stay with the server connection.

// relayLeaseKey is the advisory lock key of the relay lease: a 64-bit hash of the spool's
// table, so that it meets no other lock of this database by chance.
var relayLeaseKey = func() int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("mandate:executor.audit_spool:relay-lease")) // a hash's Write never fails
	return int64(h.Sum64())
}()

// relayUnlockTimeout bounds giving the lease back; a connection that does not answer within
// it is closed instead, which gives it back too.
const relayUnlockTimeout = 2 * time.Second

const (
	sqlTryRelayLease = `SELECT pg_try_advisory_lock($1)`
	sqlRelayUnlock   = `SELECT pg_advisory_unlock($1)`
	// sqlStillSpooled lists those of $1 still spooled, in id order, and the oldest spooled id
	// (0: none), both from the primary key's index.
	sqlStillSpooled = `SELECT ARRAY(SELECT id FROM executor.audit_spool WHERE id = ANY($1::bigint[]) ORDER BY id),
		COALESCE((SELECT min(id) FROM executor.audit_spool), 0)`
)

var _ executor.RelayLeaser = (*Store)(nil)

// TryRelayLease implements executor.RelayLeaser, in one round trip: a batch that takes the
// lock and then reads which of own are still spooled and the oldest spooled id. The batch is
// one implicit transaction, which a session lock outlives; in it, the read runs after the lock
// was taken, with a snapshot of its own (read committed), so it sees every unspooling that the
// lease's previous holder committed before it gave the lease back. The holder keeps the
// connection until Release, which unlocks whatever the round's context has become (a
// cancelled round gives the lease back too); when the unlock fails or does not say the lock
// was held, the connection is closed rather than returned to the pool, so that no pooled
// connection keeps the lock. Likewise when taking it fails midway (the context ended while
// the server may have granted it).
func (s *Store) TryRelayLease(ctx context.Context, own []int64) (*executor.RelayLease, error) {
	const op = "executor: relay lease"
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, mapErr(ctx, op, err)
	}
	var (
		ok     bool
		left   []int64
		oldest int64
	)
	b := &pgx.Batch{}
	b.Queue(sqlTryRelayLease, relayLeaseKey).QueryRow(func(row pgx.Row) error { return row.Scan(&ok) })
	b.Queue(sqlStillSpooled, own).QueryRow(func(row pgx.Row) error { return row.Scan(&left, &oldest) })
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		// The server may have granted the lock before the answer was lost: the session
		// goes, and the lock with it.
		closeConn(conn.Conn())
		conn.Release()
		return nil, mapErr(ctx, op, err)
	}
	if !ok {
		conn.Release()
		return nil, nil
	}
	unlocked := func(ok bool, err error) {
		if err != nil || !ok {
			closeConn(conn.Conn())
		}
		conn.Release() // a closed connection is destroyed, not pooled
	}
	release := func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), relayUnlockTimeout)
		defer cancel()
		var ok bool
		err := conn.QueryRow(uctx, sqlRelayUnlock, relayLeaseKey).Scan(&ok)
		unlocked(ok, err)
	}
	// The round's rows are dropped and the lock given back in one batch: an implicit
	// transaction, its commit not waiting for the WAL flush (as Unspool's); a batch that fails
	// leaves the rows (appended again, stored once) and closes the connection, which unlocks.
	unspool := func(ctx context.Context, ids []int64) error {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), relayUnlockTimeout)
		defer cancel()
		var ok bool
		b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 3)}
		b.Queue(sqlAsyncCommit)
		b.Queue(sqlUnspool, ids)
		b.Queue(sqlRelayUnlock, relayLeaseKey).QueryRow(func(row pgx.Row) error { return row.Scan(&ok) })
		err := conn.SendBatch(uctx, b).Close()
		unlocked(ok, err)
		return mapErr(ctx, "executor: unspool", err)
	}
	return executor.NewRelayLease(release, left, oldest).WithUnspool(unspool), nil
}

// closeConn closes c, within relayUnlockTimeout.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), relayUnlockTimeout)
	defer cancel()
	_ = c.Close(ctx) // closed either way: Close gives up on the socket when ctx ends
}
