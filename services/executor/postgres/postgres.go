package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/internal/storage/migrate"
	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/services/executor"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations creates the executor schema; migrator.Run (`mandate migrate`) applies it before New.
var Migrations = migrate.Set{Service: "executor", FS: mustSub(migrationFiles, "migrations")}

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // the directory is embedded above; this cannot fail
	}
	return sub
}

// Options tunes a Store. Zero fields take the documented defaults.
type Options struct {
	// Now is the clock that reservations, their expiry and default event times are measured
	// with. Default time.Now.
	Now func() time.Time
	// MaxEvents caps one Events page; a limit <= 0 or above it means MaxEvents. Default 1000.
	MaxEvents int
	// TxAttempts is how many times Finish runs its transaction when it fails with a
	// serialization failure or a deadlock. Default 5.
	TxAttempts int
	// ReserveRounds bounds how often Reserve tries again when the record it lost to vanished
	// or expired before it could read it (a concurrent Release or purge); after that it
	// answers executor.ErrInFlight. Default 5.
	ReserveRounds int
}

func (o Options) withDefaults() Options {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxEvents <= 0 {
		o.MaxEvents = 1000
	}
	if o.TxAttempts <= 0 {
		o.TxAttempts = 5
	}
	if o.ReserveRounds <= 0 {
		o.ReserveRounds = 5
	}
	return o
}

// Store is the PostgreSQL executor.Store. It does not own the pool.
type Store struct {
	pool *pgxpool.Pool
	opts Options
}

var _ executor.Store = (*Store)(nil)

// New returns a Store on pool, whose database must have [Migrations] applied.
func New(pool *pgxpool.Pool, opts Options) *Store {
	return &Store{pool: pool, opts: opts.withDefaults()}
}

// now returns the clock's time at the database's precision, so that what Reserve compares
// in Go and what it stored compare the same way.
func (s *Store) now() time.Time { return s.opts.Now().UTC().Truncate(time.Microsecond) }

// lazily runs queue's statements in one implicit transaction (one round trip, the batch's
// statements behind a single Sync) that commits without waiting for its WAL flush.
//
// A claim on a key (Reserve, ReserveSpending) and its release are committed this way. The
// claim need not survive a crash of the database server until its call is dispatched, and the
// executor dispatches a call only once its intent has committed durably in this same
// database: that commit flushes the WAL up to its own record, which comes after the claim's,
// so a dispatched call's claim is as durable as its intent. A claim lost with the server
// belongs to a call that never left — its retry finds the key free, as after a refusal. A
// release lost brings back a claim whose call did not run; its lease lapses and a retry takes
// the key over from the backend's receipt (Reclaim), which says so.
func (s *Store) lazily(ctx context.Context, queue func(*pgx.Batch)) error {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 2)}
	b.Queue(sqlAsyncCommit)
	queue(b)
	return s.pool.SendBatch(ctx, b).Close()
}

// Reserve implements executor.Store. A record whose expiry is at or before now is treated as
// absent and replaced. The claim commits without waiting for its WAL flush (lazily says why).
func (s *Store) Reserve(ctx context.Context, key executor.IdemKey, r executor.Reservation) (*executor.Saved, error) {
	const op = "executor: reserve"
	if err := validKey(key); err != nil {
		return nil, invalid(op, err)
	}
	if r.TTL <= 0 {
		return nil, invalid(op, errBadTTL)
	}
	// The database keeps microseconds: a shorter ttl would expire as it is stored.
	ttl := max(r.TTL, time.Microsecond)
	for range s.opts.ReserveRounds {
		now := s.now()
		expires := now.Add(ttl).Truncate(time.Microsecond)
		var won bool
		err := s.lazily(ctx, func(b *pgx.Batch) {
			b.Queue(sqlReserve, key.Tenant, key.User, key.Command, key.Key, r.Digest, now, expires,
				nullString(r.InvocationID), leaseEnd(now, r.Lease)).QueryRow(func(row pgx.Row) error { return row.Scan(&won) })
		})
		if err == nil {
			return nil, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, mapErr(ctx, op, err)
		}
		// Another record is live: answer from it.
		var (
			recDigest                    string
			finished, expired, abandoned bool
			saved                        executor.Saved
		)
		err = s.pool.QueryRow(ctx, sqlReadRecord, key.Tenant, key.User, key.Command, key.Key, s.now()).Scan(
			&recDigest, &finished, &expired, &abandoned, &saved.InvocationID, &saved.Output, &saved.Status, &saved.AuditID)
		switch {
		case errors.Is(err, pgx.ErrNoRows), err == nil && expired:
			continue // released or expired since: claim it again
		case err != nil:
			return nil, mapErr(ctx, op, err)
		case recDigest != r.Digest:
			return nil, executor.ErrKeyReused
		case abandoned:
			return nil, &executor.AbandonedError{InvocationID: saved.InvocationID}
		case !finished:
			return nil, executor.ErrInFlight
		}
		return &saved, nil
	}
	return nil, executor.ErrInFlight
}

// ReserveSpending implements executor.ReserveSpender: the bucket locks, the reservation
// and the spend go in one batch, one implicit transaction and one commit. The spend is
// recorded only when the reservation claimed the key; when it did not, the batch wrote
// nothing but the locks it held, and Reserve's own answer (replay, in flight, reused,
// abandoned, or a claim won in a later round) follows with no balances.
func (s *Store) ReserveSpending(ctx context.Context, key executor.IdemKey, r executor.Reservation, sp executor.Spending) (*executor.Saved, []executor.Balance, error) {
	const op = "executor: reserve and spend"
	if err := validKey(key); err != nil {
		return nil, nil, invalid(op, err)
	}
	if r.TTL <= 0 {
		return nil, nil, invalid(op, errBadTTL)
	}
	if err := executor.ValidSpending(sp); err != nil {
		return nil, nil, err
	}
	if len(sp.Items) == 0 || sp.DryRun || r.InvocationID == "" {
		saved, err := s.Reserve(ctx, key, r)
		return saved, nil, err
	}
	buckets, amounts, maxes, windows := spendArgs(sp)
	ttl := max(r.TTL, time.Microsecond)
	var (
		won bool
		out []executor.Balance
	)
	err := s.retry(ctx, func() error {
		now := s.now()
		expires := now.Add(ttl).Truncate(time.Microsecond)
		collect := func(rows pgx.Rows) (err error) {
			won, out, err = collectReserveSpend(rows, sp.Items)
			return err
		}
		// Lazily, as Reserve: the spend is given back with the claim if the call never leaves.
		return s.lazily(ctx, func(b *pgx.Batch) {
			if len(sp.Items) == 1 {
				it := sp.Items[0]
				b.Queue(sqlSpendOne, key.Tenant, it.Bucket, it.Amount, it.Max, micros(it.Window), sp.Force, false,
					true, key.User, key.Command, key.Key, r.Digest, now, expires, r.InvocationID, leaseEnd(now, r.Lease)).Query(collect)
				return
			}
			b.Queue(sqlReserveSpend, key.Tenant, key.User, key.Command, key.Key, r.Digest,
				now, expires, r.InvocationID, leaseEnd(now, r.Lease), buckets, amounts, maxes, windows, sp.Force).Query(collect)
		})
	})
	if err != nil {
		return nil, nil, mapErr(ctx, op, err)
	}
	if won {
		return nil, out, nil
	}
	saved, err := s.Reserve(ctx, key, r)
	return saved, nil, err
}

// Peek implements executor.Store with one read.
func (s *Store) Peek(ctx context.Context, key executor.IdemKey, digest string) (*executor.Saved, error) {
	const op = "executor: peek"
	if err := validKey(key); err != nil {
		return nil, invalid(op, err)
	}
	var (
		recDigest                    string
		finished, expired, abandoned bool
		saved                        executor.Saved
	)
	err := s.pool.QueryRow(ctx, sqlReadRecord, key.Tenant, key.User, key.Command, key.Key, s.now()).Scan(
		&recDigest, &finished, &expired, &abandoned, &saved.InvocationID, &saved.Output, &saved.Status, &saved.AuditID)
	switch {
	case errors.Is(err, pgx.ErrNoRows), err == nil && expired:
		return nil, nil
	case err != nil:
		return nil, mapErr(ctx, op, err)
	case recDigest != digest:
		return nil, executor.ErrKeyReused
	case abandoned:
		return nil, &executor.AbandonedError{InvocationID: saved.InvocationID}
	case !finished:
		return nil, executor.ErrInFlight
	}
	return &saved, nil
}

// Renew implements executor.Store in one statement.
func (s *Store) Renew(ctx context.Context, key executor.IdemKey, invocation string, lease time.Duration) (bool, error) {
	const op = "executor: renew"
	if err := validKey(key); err != nil {
		return false, invalid(op, err)
	}
	if lease <= 0 || invocation == "" {
		return false, invalid(op, errBadLease)
	}
	now := s.now()
	tag, err := s.pool.Exec(ctx, sqlRenew, key.Tenant, key.User, key.Command, key.Key, invocation, now, now.Add(lease))
	if err != nil {
		return false, mapErr(ctx, op, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Reclaim implements executor.Store in one statement.
func (s *Store) Reclaim(ctx context.Context, key executor.IdemKey, previous string, r executor.Reservation) (bool, error) {
	const op = "executor: reclaim"
	if err := validKey(key); err != nil {
		return false, invalid(op, err)
	}
	if r.TTL <= 0 {
		return false, invalid(op, errBadTTL)
	}
	if previous == "" {
		return false, ctx.Err()
	}
	now := s.now()
	expires := now.Add(max(r.TTL, time.Microsecond)).Truncate(time.Microsecond)
	var won, refunded bool
	err := s.pool.QueryRow(ctx, sqlReclaim, key.Tenant, key.User, key.Command, key.Key, previous, now, expires,
		nullString(r.InvocationID), leaseEnd(now, r.Lease), r.Digest).Scan(&won, &refunded)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, mapErr(ctx, op, err)
	}
	return won, nil
}

// Settle implements executor.Store.
func (s *Store) Settle(ctx context.Context, key executor.IdemKey, saved executor.Saved) error {
	if saved.InvocationID == "" {
		return ctx.Err()
	}
	_, err := s.pool.Exec(ctx, sqlSettle, key.Tenant, key.User, key.Command, key.Key, s.now(),
		saved.InvocationID, saved.Output, saved.Status, saved.AuditID)
	return mapErr(ctx, "executor: settle", err)
}

// leaseEnd is the end of a lease that starts now, or NULL for none.
func leaseEnd(now time.Time, lease time.Duration) any {
	if lease <= 0 {
		return nil
	}
	return now.Add(lease)
}

// nullString stores "" as NULL.
func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Release implements executor.Store. It drops the key only while it is in flight: a finished
// record keeps its response, and releasing an unknown key does nothing.
func (s *Store) Release(ctx context.Context, key executor.IdemKey) error {
	// Lazily: a release lost with the server is a claim whose call did not run (lazily).
	if err := s.lazily(ctx, func(b *pgx.Batch) { b.Queue(sqlRelease, key.Tenant, key.User, key.Command, key.Key) }); err != nil {
		return mapErr(ctx, "executor: release", err)
	}
	return nil
}

// Finish implements executor.Store in one transaction. The response completes the key's
// reservation only while it is in flight; when there is none (released, or expired and taken
// by another call) the execution and the event are still recorded, since the call did run. A
// repeated Finish for the same invocation adds no second execution or event.
func (s *Store) Finish(ctx context.Context, f executor.Finish) error {
	const op = "executor: finish"
	if err := validFinish(f); err != nil {
		return invalid(op, err)
	}
	if f.Key == nil && f.Execution == nil && f.Event == nil {
		return ctx.Err()
	}
	now := s.now()
	// One round trip, one implicit transaction (pg.InBatch): the tenant's event head is
	// locked only while the server runs the batch and commits it, not across round trips,
	// so concurrent writers of a tenant queue behind one commit each, not three exchanges.
	err := pg.InBatch(ctx, s.pool, func(b *pgx.Batch) {
		if k := f.Key; k != nil {
			b.Queue(sqlComplete, k.Tenant, k.User, k.Command, k.Key, now,
				f.Saved.InvocationID, f.Saved.Output, f.Saved.Status, f.Saved.AuditID)
		}
		if e := f.Execution; e != nil {
			b.Queue(sqlInsertExecution, e.Tenant, e.InvocationID, e.User, e.Command, e.Subject, orNow(e.Time, now))
		}
		if e := f.Event; e != nil {
			b.Queue(sqlLockHead, e.Tenant)
			b.Queue(sqlAppendEvent, e.Tenant, e.InvocationID, e.Command, e.Subject, e.UserID, e.AgentID, e.Result, orNow(e.Time, now))
		}
	}, pg.WithRetry(s.opts.TxAttempts))
	return mapErr(ctx, op, err)
}

// Executed implements executor.Store.
func (s *Store) Executed(ctx context.Context, tenant, user string, commands []string, subject string) (bool, error) {
	if len(commands) == 0 {
		return false, ctx.Err()
	}
	var ok bool
	if err := s.pool.QueryRow(ctx, sqlExecuted, tenant, user, subject, commands).Scan(&ok); err != nil {
		return false, mapErr(ctx, "executor: executed", err)
	}
	return ok, nil
}

// Events implements executor.Store. A limit <= 0 or above Options.MaxEvents returns at most
// MaxEvents events.
func (s *Store) Events(ctx context.Context, tenant string, afterSeq int64, limit int) ([]executor.Event, error) {
	const op = "executor: events"
	if limit <= 0 || limit > s.opts.MaxEvents {
		limit = s.opts.MaxEvents
	}
	rows, err := s.pool.Query(ctx, sqlEvents, tenant, max(afterSeq, 0), limit)
	if err != nil {
		return nil, mapErr(ctx, op, err)
	}
	evs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (executor.Event, error) {
		var e executor.Event
		err := row.Scan(&e.Seq, &e.Tenant, &e.Command, &e.Subject, &e.InvocationID, &e.UserID, &e.AgentID, &e.Result, &e.Time)
		e.Time = e.Time.UTC()
		return e, err
	})
	if err != nil {
		return nil, mapErr(ctx, op, err)
	}
	return evs, nil
}

// Backlog implements executor.Store.
func (s *Store) Backlog(ctx context.Context) ([]executor.Cursor, error) {
	const op = "executor: backlog"
	rows, err := s.pool.Query(ctx, sqlBacklog)
	if err != nil {
		return nil, mapErr(ctx, op, err)
	}
	cs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (executor.Cursor, error) {
		var c executor.Cursor
		err := row.Scan(&c.Tenant, &c.Delivered, &c.Head)
		return c, err
	})
	if err != nil {
		return nil, mapErr(ctx, op, err)
	}
	return cs, nil
}

// MarkDelivered implements executor.Store. The cursor does not move past the head.
func (s *Store) MarkDelivered(ctx context.Context, tenant string, seq int64) error {
	const op = "executor: mark delivered"
	if tenant == "" {
		return invalid(op, errors.New("no tenant"))
	}
	if _, err := s.pool.Exec(ctx, sqlMarkDelivered, tenant, max(seq, 0), s.now()); err != nil {
		return mapErr(ctx, op, err)
	}
	return nil
}

// Purge implements executor.Store, in one transaction: expired idempotency records, old
// events, lapsed limit spends and expired parked calls. Run it from one replica now and then; concurrent purges are
// harmless.
func (s *Store) Purge(ctx context.Context, p executor.PurgePolicy) (executor.Purged, error) {
	const op = "executor: purge"
	var n executor.Purged
	if p.KeepEvents < 0 {
		return n, invalid(op, errors.New("negative KeepEvents"))
	}
	now := p.Now.UTC().Truncate(time.Microsecond)
	// The cutoff is taken before truncating, so that it is the same instant in every store.
	cutoff := p.Now.Add(-p.KeepEvents).UTC().Truncate(time.Microsecond)
	err := pg.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sqlPurgeExpired, now)
		if err != nil {
			return err
		}
		n.IdempotencyKeys = tag.RowsAffected()
		tag, err = tx.Exec(ctx, sqlPurgeEvents, cutoff, p.Undelivered)
		if err != nil {
			return err
		}
		n.Events = tag.RowsAffected()
		if n.Spends, err = purgeSpends(ctx, tx, now); err != nil {
			return err
		}
		tag, err = tx.Exec(ctx, sqlPurgeParked, now)
		n.Parked = tag.RowsAffected()
		return err
	}, pg.WithRetry(s.opts.TxAttempts))
	if err != nil {
		return executor.Purged{}, mapErr(ctx, op, err)
	}
	return n, nil
}

// PurgeExpired deletes the idempotency records that have expired and returns how many it
// deleted. Reserve replaces an expired record anyway; purging only bounds the table. Run it
// from one replica now and then.
func (s *Store) PurgeExpired(ctx context.Context) (int64, error) {
	tag, err := s.pool.Exec(ctx, sqlPurgeExpired, s.now())
	if err != nil {
		return 0, mapErr(ctx, "executor: purge expired", err)
	}
	return tag.RowsAffected(), nil
}

func orNow(t, now time.Time) time.Time {
	if t.IsZero() {
		return now
	}
	return t
}

// storeError is what the Store returns for database failures. Its message names the
// operation and a generic cause only, never driver text (which may quote SQL, data or
// addresses); Unwrap reaches the executor sentinel, the pg sentinel and the driver error, for
// errors.Is/As and logs.
type storeError struct {
	op    string
	cause string
	errs  []error
}

func (e *storeError) Error() string   { return e.op + ": " + e.cause }
func (e *storeError) Unwrap() []error { return e.errs }

// mapErr classifies a database error: connection failures match executor.ErrUnavailable,
// cancellations match the context's error, anything else is a generic database error. nil
// stays nil.
func mapErr(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*storeError](err); ok {
		return err
	}
	werr := pg.Wrap(op, err)
	kind := pg.Classify(err)
	if pe, ok := errors.AsType[*pg.Error](werr); ok {
		kind = pe.Kind
	}
	switch {
	case kind == pg.KindUnavailable:
		return &storeError{op: op, cause: "store unavailable", errs: []error{executor.ErrUnavailable, werr}}
	case kind == pg.KindCanceled, ctx.Err() != nil:
		errs := []error{werr}
		if cerr := ctx.Err(); cerr != nil {
			errs = append(errs, cerr)
		}
		return &storeError{op: op, cause: "canceled", errs: errs}
	case kind.Retryable(), errors.Is(err, pg.ErrRetriesExhausted):
		return &storeError{op: op, cause: "concurrent write conflict", errs: []error{werr}}
	default:
		return &storeError{op: op, cause: "database error", errs: []error{werr}}
	}
}

var errBadTTL = errors.New("ttl must be positive")

var errBadLease = errors.New("a renewal needs a positive lease and its invocation")

// invalidError reports arguments that no store could accept: the caller's bug, not a store
// condition, so it matches none of the executor sentinels.
type invalidError struct {
	op  string
	err error
}

func (e *invalidError) Error() string { return e.op + ": " + e.err.Error() }
func (e *invalidError) Unwrap() error { return e.err }

func invalid(op string, err error) error { return &invalidError{op: op, err: err} }

func validKey(k executor.IdemKey) error {
	switch {
	case k.Tenant == "":
		return errors.New("idempotency key has no tenant")
	case k.User == "":
		return errors.New("idempotency key has no user")
	case k.Command == "":
		return errors.New("idempotency key has no command")
	case k.Key == "":
		return errors.New("idempotency key is empty")
	}
	return nil
}

func validFinish(f executor.Finish) error {
	if f.Key != nil {
		if err := validKey(*f.Key); err != nil {
			return err
		}
	}
	if e := f.Execution; e != nil {
		switch {
		case e.Tenant == "":
			return errors.New("execution has no tenant")
		case e.User == "":
			return errors.New("execution has no user")
		case e.Command == "":
			return errors.New("execution has no command")
		case e.Subject == "":
			return errors.New("execution has no subject")
		case e.InvocationID == "":
			return errors.New("execution has no invocation id")
		}
	}
	if e := f.Event; e != nil {
		switch {
		case e.Tenant == "":
			return errors.New("event has no tenant")
		case e.Command == "":
			return errors.New("event has no command")
		case e.InvocationID == "":
			return errors.New("event has no invocation id")
		}
	}
	return nil
}

// Spool implements executor.Store.
func (s *Store) Spool(ctx context.Context, row executor.SpooledRow) error {
	if len(row.Record) == 0 || row.Tenant == "" {
		return invalid("executor: spool", errors.New("a spooled row needs a tenant and a record"))
	}
	_, err := s.pool.Exec(ctx, sqlSpool, row.Tenant, row.InvocationID, row.Record, orNow(row.Time, s.now()))
	return mapErr(ctx, "executor: spool", err)
}

// SpoolRows implements executor.BatchSpooler: one INSERT of every row, from arrays, in their
// order. The ids come from one sequence, taken row after row in that order within the
// statement, so sorted they are the rows' ids in order, whatever order RETURNING lists them in.
// A lazy batch is committed with synchronous_commit off, in the same round trip.
func (s *Store) SpoolRows(ctx context.Context, rows []executor.SpooledRow, lazy bool) ([]int64, error) {
	if len(rows) == 0 {
		return nil, ctx.Err()
	}
	now := s.now()
	tenants, invocations := make([]string, len(rows)), make([]string, len(rows))
	records, times := make([][]byte, len(rows)), make([]time.Time, len(rows))
	for i, row := range rows {
		if len(row.Record) == 0 || row.Tenant == "" {
			return nil, invalid("executor: spool", errors.New("a spooled row needs a tenant and a record"))
		}
		tenants[i], invocations[i], records[i], times[i] = row.Tenant, row.InvocationID, row.Record, orNow(row.Time, now)
	}
	var ids []int64
	if lazy {
		err := s.lazily(ctx, func(b *pgx.Batch) {
			b.Queue(sqlSpoolRows, tenants, invocations, records, times).Query(func(res pgx.Rows) error {
				var err error
				ids, err = pgx.CollectRows(res, pgx.RowTo[int64])
				return err
			})
		})
		if err != nil {
			return nil, mapErr(ctx, "executor: spool", err)
		}
	} else {
		res, err := s.pool.Query(ctx, sqlSpoolRows, tenants, invocations, records, times)
		if err != nil {
			return nil, mapErr(ctx, "executor: spool", err)
		}
		if ids, err = pgx.CollectRows(res, pgx.RowTo[int64]); err != nil {
			return nil, mapErr(ctx, "executor: spool", err)
		}
	}
	if len(ids) != len(rows) {
		return nil, fmt.Errorf("executor: spool: %d ids for %d rows", len(ids), len(rows))
	}
	slices.Sort(ids)
	return ids, nil
}

// Spooled implements executor.Store.
func (s *Store) Spooled(ctx context.Context, limit int) ([]executor.SpooledRow, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.pool.Query(ctx, sqlSpooled, limit)
	if err != nil {
		return nil, mapErr(ctx, "executor: spooled", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (executor.SpooledRow, error) {
		var sr executor.SpooledRow
		err := r.Scan(&sr.ID, &sr.Tenant, &sr.InvocationID, &sr.Record, &sr.Time)
		return sr, err
	})
	return out, mapErr(ctx, "executor: spooled", err)
}

// Unspool implements executor.Store.
func (s *Store) Unspool(ctx context.Context, ids []int64) error {
	if len(ids) == 0 {
		return ctx.Err()
	}
	// A delete lost with the server's last moments brings rows back, which the relay appends
	// again and the trail stores once: it need not wait for the WAL flush.
	return mapErr(ctx, "executor: unspool", s.lazily(ctx, func(b *pgx.Batch) { b.Queue(sqlUnspool, ids) }))
}

// Spooling implements executor.Store.
func (s *Store) Spooling(ctx context.Context, tenant string, invocationIDs []string) ([]string, error) {
	if len(invocationIDs) == 0 {
		return nil, ctx.Err()
	}
	rows, err := s.pool.Query(ctx, sqlSpooling, tenant, invocationIDs)
	if err != nil {
		return nil, mapErr(ctx, "executor: spooling", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, mapErr(ctx, "executor: spooling", err)
}

// Bury implements executor.Store.
func (s *Store) Bury(ctx context.Context, row executor.DeadLetter) error {
	if len(row.Record) == 0 || row.Tenant == "" {
		return invalid("executor: bury", errors.New("a dead letter needs a tenant and a record"))
	}
	dead := orNow(row.Dead, s.now())
	_, err := s.pool.Exec(ctx, sqlBury, row.Tenant, row.InvocationID, row.Record, orNow(row.Spooled, dead), dead, row.Reason, row.SpoolID)
	return mapErr(ctx, "executor: bury", err)
}

// DeadLetters implements executor.Store.
func (s *Store) DeadLetters(ctx context.Context, tenant string, limit int) ([]executor.DeadLetter, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.pool.Query(ctx, sqlDeadLetters, tenant, limit)
	if err != nil {
		return nil, mapErr(ctx, "executor: dead letters", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (executor.DeadLetter, error) {
		var d executor.DeadLetter
		err := r.Scan(&d.ID, &d.Tenant, &d.InvocationID, &d.Record, &d.Spooled, &d.Dead, &d.Reason)
		return d, err
	})
	return out, mapErr(ctx, "executor: dead letters", err)
}

// Redrive implements executor.Store.
func (s *Store) Redrive(ctx context.Context, tenant string, ids []int64) (int, error) {
	if ids != nil && len(ids) == 0 {
		return 0, ctx.Err()
	}
	tag, err := s.pool.Exec(ctx, sqlRedrive, tenant, ids)
	if err != nil {
		return 0, mapErr(ctx, "executor: redrive", err)
	}
	return int(tag.RowsAffected()), nil
}

// Resolve implements executor.Store.
func (s *Store) Resolve(ctx context.Context, tenant, invocationID string, saved *executor.Saved) (bool, error) {
	const op = "executor: resolve"
	if invocationID == "" {
		return false, ctx.Err()
	}
	if saved == nil {
		var (
			n        int64
			refunded bool
		)
		if err := s.pool.QueryRow(ctx, sqlResolveForget, tenant, invocationID).Scan(&n, &refunded); err != nil {
			return false, mapErr(ctx, op, err)
		}
		return n > 0, nil
	}
	var (
		tag pgconn.CommandTag
		err error
	)
	{
		tag, err = s.pool.Exec(ctx, sqlResolveSettle, tenant, invocationID, s.now(), saved.Output, saved.Status, saved.AuditID)
	}
	if err != nil {
		return false, mapErr(ctx, op, err)
	}
	return tag.RowsAffected() > 0, nil
}

// Spend implements executor.Store in one round trip: one item (the usual case) in one
// statement, limit_spend_one; several in a batch of two statements in one implicit
// transaction, sqlSpendLock (the buckets' advisory locks, in key order) then sqlSpend (sum,
// decide, write and, for an item that does not fit, its bucket's live entries), timed by the
// database's clock. A deadlock (with a concurrent Reclaim or Refund) rolls it back, and it runs
// again, up to Options.TxAttempts times.
func (s *Store) Spend(ctx context.Context, sp executor.Spending) ([]executor.Balance, error) {
	const op = "executor: spend"
	if err := executor.ValidSpending(sp); err != nil {
		return nil, err
	}
	if len(sp.Items) == 0 {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return []executor.Balance{}, nil
	}
	buckets, amounts, maxes, windows := spendArgs(sp)
	var user, command, key *string
	if k := sp.Key; k != nil {
		user, command, key = &k.User, &k.Command, &k.Key
	}
	var out []executor.Balance
	if len(sp.Items) == 1 {
		it := sp.Items[0]
		err := s.retry(ctx, func() error {
			rows, err := s.pool.Query(ctx, sqlSpendOne, sp.Tenant, it.Bucket, it.Amount, it.Max, micros(it.Window), sp.Force, sp.DryRun,
				false, user, command, key, nil, nil, nil, nil, nil)
			if err != nil {
				return err
			}
			out, err = collectBalances(rows, sp.Items, true)
			return err
		})
		if err != nil {
			return nil, mapErr(ctx, op, err)
		}
		return out, nil
	}
	err := s.retry(ctx, func() (err error) {
		b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 2)}
		b.Queue(sqlSpendLock, sp.Tenant, buckets)
		b.Queue(sqlSpend, sp.Tenant, buckets, amounts, maxes, windows, sp.Force, sp.DryRun, user, command, key)
		br := s.pool.SendBatch(ctx, b)
		defer func() { err = errors.Join(err, br.Close()) }() // Close reads how the implicit transaction ended
		if _, err := br.Exec(); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		out, err = collectBalances(rows, sp.Items, false)
		return err
	})
	if err != nil {
		return nil, mapErr(ctx, op, err)
	}
	return out, nil
}

// collectReserveSpend reads sqlReserveSpend's rows: whether the key was claimed and, when it
// was, the balances (as collectBalances).
func collectReserveSpend(rows pgx.Rows, items []executor.SpendItem) (bool, []executor.Balance, error) {
	out, err := collectBalances(rows, items, true)
	if err != nil || out == nil {
		return false, nil, err
	}
	return true, out, nil
}

// collectBalances reads the rows of sqlSpend (or, with claim, sqlReserveSpend, whose rows lead
// with whether the key was claimed: when it was not, there is one row and the balances are
// nil), one per item in their order, and computes the RetryAfter of the items that do not fit
// from their buckets' live entries.
func collectBalances(rows pgx.Rows, items []executor.SpendItem, claim bool) ([]executor.Balance, error) {
	defer rows.Close()
	out := make([]executor.Balance, 0, len(items))
	won := !claim
	for rows.Next() {
		var (
			ok      bool
			used    *int64
			fits    *bool
			now     *time.Time
			lapse   *int64
			amounts []int64
			lapses  []int64
		)
		dest := []any{&used, &fits, &now, &lapse, &amounts, &lapses}
		if claim {
			dest = append([]any{&ok}, dest...)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if claim && !ok {
			continue
		}
		won = true
		if used == nil || fits == nil || now == nil || len(out) == len(items) || len(amounts) != len(lapses) {
			return nil, fmt.Errorf("executor: spend: unexpected balance row %d", len(out))
		}
		bal := executor.Balance{Used: *used, Fits: *fits}
		if lapse != nil {
			bal.Lapses = time.UnixMicro(*lapse)
		}
		if !bal.Fits {
			live := make([]executor.Lapse, len(amounts))
			for j := range amounts {
				live[j] = executor.Lapse{Amount: amounts[j], At: time.UnixMicro(lapses[j])}
			}
			it := items[len(out)]
			bal.RetryAfter = executor.RetryAfterOf(live, it.Amount, it.Max, *now)
		}
		out = append(out, bal)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if !won {
		return nil, nil
	}
	if len(out) != len(items) {
		return nil, fmt.Errorf("executor: spend: %d balances for %d items", len(out), len(items))
	}
	return out, nil
}

// maxPurgeBuckets bounds the buckets one Purge clears of lapsed spends (and so the advisory
// locks it holds at once); the next Purge takes the rest.
const maxPurgeBuckets = 1000

// purgeSpends drops lapsed spends, up to maxPurgeBuckets buckets' worth, and returns how many
// entries it dropped.
func purgeSpends(ctx context.Context, tx pgx.Tx, now time.Time) (int64, error) {
	var n int64
	err := tx.QueryRow(ctx, sqlPurgeSpends, now, maxPurgeBuckets).Scan(&n)
	return n, err
}

// Refund implements executor.Store in one statement.
func (s *Store) Refund(ctx context.Context, tenant string, receipt []executor.Spent) error {
	if tenant == "" || len(receipt) == 0 {
		return ctx.Err() // nothing is ever spent without a tenant
	}
	buckets, amounts, lapses := make([]string, len(receipt)), make([]int64, len(receipt)), make([]int64, len(receipt))
	for i, r := range receipt {
		buckets[i], amounts[i], lapses[i] = r.Bucket, r.Amount, r.Lapses.UnixMicro()
	}
	err := s.retry(ctx, func() error {
		_, err := s.pool.Exec(ctx, sqlRefund, tenant, buckets, amounts, lapses)
		return err
	})
	return mapErr(ctx, "executor: refund", err)
}

// retry runs fn, an atomic unit of work, again while it fails with a serialization failure or
// a deadlock (nothing happened), up to Options.TxAttempts times in all.
func (s *Store) retry(ctx context.Context, fn func() error) error {
	var err error
	for range s.opts.TxAttempts {
		if err = fn(); err == nil || !pg.Classify(err).Retryable() || ctx.Err() != nil {
			return err
		}
	}
	return errors.Join(pg.ErrRetriesExhausted, err)
}

// spendArgs are sp's items as sqlSpend takes them (buckets, amounts, maxes, windows in
// microseconds).
func spendArgs(sp executor.Spending) (buckets []string, amounts, maxes, windows []int64) {
	n := len(sp.Items)
	buckets, amounts, maxes, windows = make([]string, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, it := range sp.Items {
		buckets[i], amounts[i], maxes[i], windows[i] = it.Bucket, it.Amount, it.Max, micros(it.Window)
	}
	return buckets, amounts, maxes, windows
}

// micros is a window in whole microseconds, the database's precision, rounded up: a positive
// window never becomes an empty one.
func micros(d time.Duration) int64 {
	us := int64(d / time.Microsecond)
	if d%time.Microsecond != 0 {
		us++
	}
	return us
}

// Park implements executor.Store in one statement.
func (s *Store) Park(ctx context.Context, p executor.Parked) error {
	const op = "executor: park"
	now := s.now()
	if err := executor.ValidParked(p, now); err != nil {
		return invalid(op, err)
	}
	expires := executor.ParkedUntil(p.Expires, now).UTC().Truncate(time.Microsecond)
	if !expires.After(now) {
		return invalid(op, executor.ErrParkedInvalid)
	}
	if p.Canonical == nil {
		p.Canonical = []byte{} // the empty request: NOT NULL
	}
	withheld := p.Withheld
	if withheld == nil {
		withheld = []string{}
	}
	_, err := s.pool.Exec(ctx, sqlPark, p.Tenant, p.ChallengeID, p.Command, p.DeclarationDigest, p.InputDigest,
		p.Canonical, p.Arguments, withheld, p.ArgumentsDigest, p.InvocationDigest, now, expires)
	return mapErr(ctx, op, err)
}

// Parked implements executor.Store in one read.
func (s *Store) Parked(ctx context.Context, tenant, challenge string) (*executor.Parked, error) {
	p := executor.Parked{Tenant: tenant, ChallengeID: challenge}
	err := s.pool.QueryRow(ctx, sqlParked, tenant, challenge, s.now()).Scan(&p.Command, &p.DeclarationDigest, &p.InputDigest,
		&p.Canonical, &p.Arguments, &p.Withheld, &p.ArgumentsDigest, &p.InvocationDigest, &p.Expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, mapErr(ctx, "executor: parked", err)
	}
	if p.Canonical == nil {
		p.Canonical = []byte{}
	}
	if len(p.Withheld) == 0 {
		p.Withheld = nil
	}
	return &p, nil
}

// Unpark implements executor.Store in one statement.
func (s *Store) Unpark(ctx context.Context, tenant, challenge string) error {
	_, err := s.pool.Exec(ctx, sqlUnpark, tenant, challenge)
	return mapErr(ctx, "executor: unpark", err)
}
