package pg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// Beginner starts transactions; *pgxpool.Pool, *pgxpool.Conn and *pgx.Conn satisfy it.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// TxOption adjusts how [InTx] runs a transaction.
type TxOption func(*txConfig)

type txConfig struct {
	opts     pgx.TxOptions
	attempts int
	backoff  time.Duration
}

// WithIsolation sets the isolation level (default: the server default, read committed).
func WithIsolation(level pgx.TxIsoLevel) TxOption {
	return func(c *txConfig) { c.opts.IsoLevel = level }
}

// ReadOnly marks the transaction read-only.
func ReadOnly() TxOption {
	return func(c *txConfig) { c.opts.AccessMode = pgx.ReadOnly }
}

// WithRetry lets InTx run fn up to attempts times in total when the transaction fails with a
// serialization failure or a deadlock (both mean "nothing happened, try again"). fn must then be
// safe to re-run: it must not have side effects outside the transaction. Default 1 (no retry).
func WithRetry(attempts int) TxOption {
	return func(c *txConfig) {
		if attempts > 0 {
			c.attempts = attempts
		}
	}
}

// ErrRetriesExhausted is joined to the last error when every attempt allowed by WithRetry failed
// with a retryable error.
var ErrRetriesExhausted = errors.New("transaction retries exhausted")

// InTx runs fn inside a transaction on db: it commits when fn returns nil and rolls back when fn
// returns an error or panics (the panic is re-raised after the rollback). Errors returned by fn
// come back unchanged, so domain errors survive; failures to begin or commit are wrapped with
// [Wrap]. With [WithRetry], retryable failures re-run fn in a fresh transaction after a short
// jittered backoff.
func InTx(ctx context.Context, db Beginner, fn func(pgx.Tx) error, opts ...TxOption) error {
	cfg := txConfig{attempts: 1, backoff: 5 * time.Millisecond}
	for _, o := range opts {
		o(&cfg)
	}
	return retry(ctx, cfg, func() error { return runTx(ctx, db, cfg.opts, fn) })
}

// Batcher sends batches; *pgxpool.Pool, *pgxpool.Conn and *pgx.Conn satisfy it.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// InBatch runs the statements queue puts in a batch as one transaction, in one round trip:
// the batch ends in a single Sync, so the server runs its statements in one implicit
// transaction — all take effect or none does — and commits it as soon as the last one ran.
// A transaction [InTx] runs costs three round trips (BEGIN, the work, COMMIT), and holds its
// locks across the last two; a batch holds them only while the server runs it. Only
// [WithRetry] applies: the batch runs at the server's default isolation, read-write. queue is
// called once per attempt, with an empty batch. The first error of the batch comes back
// unchanged.
func InBatch(ctx context.Context, db Batcher, queue func(*pgx.Batch), opts ...TxOption) error {
	cfg := txConfig{attempts: 1, backoff: 5 * time.Millisecond}
	for _, o := range opts {
		o(&cfg)
	}
	return retry(ctx, cfg, func() error {
		b := &pgx.Batch{}
		queue(b)
		return db.SendBatch(ctx, b).Close()
	})
}

// retry runs attempt until it succeeds, fails with an error that is not retryable, or has run
// cfg.attempts times, with a jittered exponential backoff between attempts.
func retry(ctx context.Context, cfg txConfig, attempt func() error) error {
	var err error
	for n := 1; ; n++ {
		err = attempt()
		if err == nil || !Classify(err).Retryable() {
			return err
		}
		if n >= cfg.attempts {
			break
		}
		// Exponential backoff with full jitter keeps competing retries from colliding again.
		d := cfg.backoff << (n - 1)
		t := time.NewTimer(rand.N(d) + time.Millisecond) //nolint:gosec // jitter needs no cryptographic randomness
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, Wrap("pg: transaction", ctx.Err()))
		case <-t.C:
		}
	}
	if cfg.attempts > 1 {
		return fmt.Errorf("%w after %d attempts: %w", ErrRetriesExhausted, cfg.attempts, err)
	}
	return err
}

func runTx(ctx context.Context, db Beginner, opts pgx.TxOptions, fn func(pgx.Tx) error) (err error) {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return Wrap("pg: begin", err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		// Roll back even when ctx is already canceled; a failed rollback closes the connection,
		// which the server treats as a rollback too.
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rbCtx)
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return Wrap("pg: commit", err)
	}
	committed = true
	return nil
}
