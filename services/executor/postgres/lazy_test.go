package postgres_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/executor"
	"github.com/mandate-dev/mandate/services/executor/postgres"
)

// sqlTracer records the statements of every exchange a pool makes: a batch's as one entry.
type sqlTracer struct {
	mu    sync.Mutex
	sents [][]string
}

func (t *sqlTracer) add(sqls []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sents = append(t.sents, sqls)
}

func (t *sqlTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.add([]string{d.SQL})
	return ctx
}
func (t *sqlTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (t *sqlTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	sqls := make([]string, len(d.Batch.QueuedQueries))
	for i, q := range d.Batch.QueuedQueries {
		sqls[i] = q.SQL
	}
	t.add(sqls)
	return ctx
}
func (t *sqlTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (t *sqlTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// since runs fn and returns the exchanges it made.
func (t *sqlTracer) since(fn func()) [][]string {
	t.mu.Lock()
	n := len(t.sents)
	t.mu.Unlock()
	fn()
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.sents[n:])
}

// lazy reports whether an exchange commits without waiting for its WAL flush.
func lazy(sqls []string) bool {
	return len(sqls) > 1 && strings.Contains(sqls[0], "set_config('synchronous_commit', 'off'")
}

// TestAClaimDoesNotWaitForTheFlush pins what the write path commits durably and what it does
// not (Store.lazily): a key's claim — alone or with its spending — and its release commit
// without waiting for the WAL flush, each still one exchange; the intent a call is dispatched
// after (a spooled batch that is not lazy) waits for it, and so flushes the claim before it
// (the WAL is one sequence). So a call never leaves without a durable claim, and a claim costs
// no flush of its own.
func TestAClaimDoesNotWaitForTheFlush(t *testing.T) {
	_, dsn := pgtest.NewURL(t, postgres.Migrations)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	tracer := &sqlTracer{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctxFor(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st := postgres.New(pool, postgres.Options{})
	ctx := ctxFor(t)
	key := executor.IdemKey{Tenant: "acme", User: "alice", Command: "expense.report.create", Key: "k-1"}
	claim := executor.Reservation{Digest: "d1", InvocationID: "inv-1", TTL: time.Hour, Lease: time.Minute}
	one := func(what string, sent [][]string, wantLazy bool) {
		t.Helper()
		if len(sent) != 1 || lazy(sent[0]) != wantLazy {
			t.Fatalf("%s: exchanges %q, want one, lazy %v", what, sent, wantLazy)
		}
	}

	one("a claim", tracer.since(func() {
		if saved, err := st.Reserve(ctx, key, claim); err != nil || saved != nil {
			t.Fatalf("reserve: %v %v", saved, err)
		}
	}), true)
	// The claim is there for any other caller at once (visibility does not wait for a flush).
	if _, err := st.Reserve(ctx, key, executor.Reservation{Digest: "d1", InvocationID: "inv-2", TTL: time.Hour, Lease: time.Minute}); !errors.Is(err, executor.ErrInFlight) {
		t.Fatalf("a second claim of the key: %v, want in flight", err)
	}
	one("a release", tracer.since(func() {
		if err := st.Release(ctx, key); err != nil {
			t.Fatal(err)
		}
	}), true)
	one("a claim with its spending", tracer.since(func() {
		sp := executor.Spending{Tenant: "acme", Key: &key, Items: []executor.SpendItem{{Bucket: "b", Amount: 1, Max: 5, Window: time.Hour}}}
		saved, bal, err := st.ReserveSpending(ctx, key, claim, sp)
		if err != nil || saved != nil || len(bal) != 1 || !bal[0].Fits {
			t.Fatalf("reserve and spend: %v %v %v", saved, bal, err)
		}
	}), true)
	one("an intent", tracer.since(func() {
		ids, err := st.SpoolRows(ctx, []executor.SpooledRow{{Tenant: "acme", InvocationID: "inv-1", Record: []byte{0x0a, 0x01, 'x'}, Time: time.Now()}}, false)
		if err != nil || len(ids) != 1 {
			t.Fatalf("spool: %v %v", ids, err)
		}
	}), false)
}
