package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/audittest"
	"github.com/mandate-dev/mandate/services/audit/postgres"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

var quiet = slog.New(slog.DiscardHandler)

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newStore(t testing.TB, pool *pgxpool.Pool) *postgres.Store {
	t.Helper()
	s := postgres.New(pool, postgres.Options{Logger: quiet, WatchPoll: 200 * time.Millisecond})
	t.Cleanup(s.Close)
	return s
}

func newWriter(t testing.TB, st audit.Store, opts audit.WriterOptions) *audit.Writer {
	t.Helper()
	opts.Logger = quiet
	w := audit.NewWriter(st, opts)
	t.Cleanup(func() { _ = w.Close() })
	return w
}

func TestConformance(t *testing.T) {
	audittest.Run(t, func(t *testing.T) audit.Store {
		return newStore(t, pgtest.New(t, postgres.Migrations))
	})
}

// seedChain appends five invocations (intent + outcome each) to acme and one to globex.
func seedChain(t *testing.T, w *audit.Writer) []audit.Stored {
	t.Helper()
	var out []audit.Stored
	for i := range 5 {
		inv := fmt.Sprintf("inv-%d", i)
		rows, err := w.Append(ctxFor(t), audittest.Rec("acme", inv, audit.PhaseIntent), audittest.Rec("acme", inv, audit.PhaseOutcome))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rows...)
	}
	if _, err := w.Append(ctxFor(t), audittest.Rec("globex", "g", audit.PhaseIntent)); err != nil {
		t.Fatal(err)
	}
	return out
}

// tamper runs SQL as the database owner would, around the append-only trigger.
func tamper(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	ctx := ctxFor(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	for _, q := range []string{
		"ALTER TABLE audit.records DISABLE TRIGGER records_append_only",
		"ALTER TABLE audit.records DISABLE TRIGGER records_no_truncate",
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	tag, err := tx.Exec(ctx, sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if tag.RowsAffected() == 0 {
		t.Fatalf("%s changed no row", sql)
	}
	for _, q := range []string{
		"ALTER TABLE audit.records ENABLE TRIGGER records_append_only",
		"ALTER TABLE audit.records ENABLE TRIGGER records_no_truncate",
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyDetectsTampering(t *testing.T) {
	// forge edits row 5 and recomputes its hash, as an attacker who knows the scheme would.
	forge := func(rows []audit.Stored) []any {
		r := rows[4]
		r.Message = "forged"
		return []any{audit.ComputeHash(r.PrevHash, r.Seq, &r.Record)}
	}
	tests := []struct {
		name    string
		sqls    []string
		args    func(rows []audit.Stored) []any // arguments of the last statement
		wantSeq int64
		problem audit.Problem
		named   bool // the break names the invocation and phase of rows[wantSeq-1]
	}{
		{"update a content column of a middle row", []string{"UPDATE audit.records SET message = 'nothing to see' WHERE tenant = 'acme' AND seq = 5"}, nil, 5, audit.ProblemHashMismatch, true},
		{"update the approver of a middle row", []string{"UPDATE audit.records SET approver = 'mallory' WHERE tenant = 'acme' AND seq = 4"}, nil, 4, audit.ProblemHashMismatch, true},
		{"update the time of a middle row", []string{"UPDATE audit.records SET time = time - interval '1 day' WHERE tenant = 'acme' AND seq = 3"}, nil, 3, audit.ProblemHashMismatch, true},
		{"update the arguments of a middle row", []string{`UPDATE audit.records SET arguments = '{"amount": 1}' WHERE tenant = 'acme' AND seq = 6`}, nil, 6, audit.ProblemHashMismatch, true},
		{"update the side effects of a middle row", []string{`UPDATE audit.records SET side_effects = '{}' WHERE tenant = 'acme' AND seq = 2`}, nil, 2, audit.ProblemHashMismatch, true},
		{"edit the hash of a middle row", []string{"UPDATE audit.records SET hash = sha256(hash) WHERE tenant = 'acme' AND seq = 5"}, nil, 5, audit.ProblemHashMismatch, true},
		{"edit a middle row and recompute its hash", []string{"UPDATE audit.records SET message = 'forged', hash = $1 WHERE tenant = 'acme' AND seq = 5"}, forge, 6, audit.ProblemPrevHashMismatch, true},
		{"delete a middle row", []string{"DELETE FROM audit.records WHERE tenant = 'acme' AND seq = 5"}, nil, 5, audit.ProblemGap, false},
		{"delete the first row", []string{"DELETE FROM audit.records WHERE tenant = 'acme' AND seq = 1"}, nil, 1, audit.ProblemGap, false},
		{"delete the last row", []string{"DELETE FROM audit.records WHERE tenant = 'acme' AND seq = 10"}, nil, 10, audit.ProblemHeadMismatch, false},
		{"delete the last two rows", []string{"DELETE FROM audit.records WHERE tenant = 'acme' AND seq >= 9"}, nil, 9, audit.ProblemHeadMismatch, false},
		{"delete a row and renumber the next to close the gap", []string{
			"DELETE FROM audit.records WHERE tenant = 'acme' AND seq = 9",
			"UPDATE audit.records SET seq = 9 WHERE tenant = 'acme' AND seq = 10",
		}, nil, 9, audit.ProblemPrevHashMismatch, false},
		{"delete the last row and move the head back", []string{
			"DELETE FROM audit.records WHERE tenant = 'acme' AND seq = 10",
			"UPDATE audit.heads SET seq = 9 WHERE tenant = 'acme'",
		}, nil, 9, audit.ProblemHeadMismatch, true},
		{"edit the head hash", []string{"UPDATE audit.heads SET hash = sha256(hash) WHERE tenant = 'acme'"}, nil, 10, audit.ProblemHeadMismatch, true},
		{"move a row to another tenant", []string{"UPDATE audit.records SET tenant = 'globex', seq = 2 WHERE tenant = 'acme' AND seq = 7"}, nil, 7, audit.ProblemGap, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := pgtest.New(t, postgres.Migrations)
			st := newStore(t, pool)
			w := newWriter(t, st, audit.WriterOptions{})
			rows := seedChain(t, w)
			if rep, err := st.Verify(ctxFor(t), "acme"); err != nil || !rep.OK || rep.Rows != 10 {
				t.Fatalf("before tampering: %+v, %v", rep, err)
			}
			for i, sql := range tt.sqls {
				var args []any
				if tt.args != nil && i == len(tt.sqls)-1 {
					args = tt.args(rows)
				}
				tamper(t, pool, sql, args...)
			}
			rep, err := st.Verify(ctxFor(t), "acme")
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK || rep.Break == nil {
				t.Fatalf("Verify passed after tampering: %+v", rep)
			}
			b := rep.Break
			if b.Seq != tt.wantSeq || b.Problem != tt.problem {
				t.Fatalf("break = seq %d %s (%s), want seq %d %s", b.Seq, b.Problem, b.Detail, tt.wantSeq, tt.problem)
			}
			if tt.named {
				want := rows[tt.wantSeq-1]
				if b.InvocationID != want.InvocationID || b.Phase != want.Phase {
					t.Fatalf("break names %s/%s, want %s/%s", b.InvocationID, b.Phase, want.InvocationID, want.Phase)
				}
			}
			if err := rep.Err(); !errors.Is(err, audit.ErrChainBroken) || !strings.Contains(err.Error(), fmt.Sprintf("seq %d", tt.wantSeq)) {
				t.Fatalf("Report.Err() = %v", err)
			}
			t.Logf("%s at seq %d: %s", b.Problem, b.Seq, b.Detail)
			// The other tenant's chain is untouched (except where the case moved a row into it).
			if !strings.Contains(tt.name, "another tenant") {
				if rep, err := st.Verify(ctxFor(t), "globex"); err != nil || !rep.OK {
					t.Fatalf("globex: %+v, %v", rep, err)
				}
			}
		})
	}
}

func TestAppendOnlyTrigger(t *testing.T) {
	pool := pgtest.New(t, postgres.Migrations)
	st := newStore(t, pool)
	w := newWriter(t, st, audit.WriterOptions{})
	seedChain(t, w)
	for _, sql := range []string{
		"UPDATE audit.records SET message = 'x' WHERE tenant = 'acme' AND seq = 1",
		"DELETE FROM audit.records WHERE tenant = 'acme' AND seq = 10",
		"TRUNCATE audit.records",
	} {
		if _, err := pool.Exec(ctxFor(t), sql); err == nil {
			t.Fatalf("%s succeeded", sql)
		}
	}
	if rep, err := st.Verify(ctxFor(t), "acme"); err != nil || !rep.OK || rep.Rows != 10 {
		t.Fatalf("after refused changes: %+v, %v", rep, err)
	}
}

// TestReplicas runs two stores with their own pools on one database, as two processes would,
// appending concurrently to the same tenants with overlapping keys, with each writer mode: the
// chains must stay intact and every key must be stored once.
func TestReplicas(t *testing.T) {
	modes := []struct {
		name string
		opts audit.WriterOptions
	}{
		{"group commit", audit.WriterOptions{MaxBatch: 32}},
		{"two batches in flight", audit.WriterOptions{MaxBatch: 16, MaxInFlight: 2}},
		{"four batches in flight", audit.WriterOptions{MaxBatch: 8, MaxInFlight: 4}},
		{"unbatched", audit.WriterOptions{Unbatched: true}},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) { testReplicas(t, mode.opts) })
	}
}

func testReplicas(t *testing.T, opts audit.WriterOptions) {
	_, dsn := pgtest.NewURL(t, postgres.Migrations)
	open := func() (*postgres.Store, *audit.Writer) {
		pool, err := pg.Open(ctxFor(t), dsn, pg.Options{MaxConns: 8})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		st := newStore(t, pool)
		o := opts
		o.RetryBackoff = 5 * time.Millisecond
		o.Attempts = 5
		return st, newWriter(t, st, o)
	}
	stA, wA := open()
	stB, wB := open()

	// A watcher on replica B hears what replica A commits.
	wctx, cancel := context.WithCancel(ctxFor(t))
	defer cancel()
	watch, err := stB.Watch(wctx, "acme", 0)
	if err != nil {
		t.Fatal(err)
	}

	const writers, each = 16, 20
	var wg sync.WaitGroup
	for g := range writers {
		w := []*audit.Writer{wA, wB}[g%2]
		wg.Go(func() {
			for i := range each {
				// Writers g and g^1 (one on each replica) append the same keys; some appends
				// span both tenants.
				inv := fmt.Sprintf("inv-%d-%d", g/2, i)
				recs := []audit.Record{audittest.Rec([]string{"acme", "globex"}[i%2], inv, audit.PhaseIntent)}
				if i%5 == 0 {
					recs = append(recs, audittest.Rec([]string{"globex", "acme"}[i%2], inv, audit.PhaseIntent))
				}
				if _, err := w.Append(ctxFor(t), recs...); err != nil {
					t.Errorf("append: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Per writer pair: 20 appends, 10 per tenant, plus 4 extra records (i%5==0) split 2/2.
	want := int64(writers / 2 * (each/2 + 2))
	for _, tenant := range []string{"acme", "globex"} {
		for _, st := range []*postgres.Store{stA, stB} {
			rep, err := st.Verify(ctxFor(t), tenant)
			if err != nil || !rep.OK || rep.Rows != want {
				if rep.Break != nil {
					t.Logf("break: %+v", *rep.Break)
				}
				t.Fatalf("%s: %+v, %v; want an intact chain of %d rows (each key once)", tenant, rep, err, want)
			}
		}
	}
	for seq := int64(1); seq <= want; seq++ {
		select {
		case r := <-watch:
			if r.Seq != seq || r.Tenant != "acme" {
				t.Fatalf("watch on B delivered %s seq %d, want acme seq %d", r.Tenant, r.Seq, seq)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("watch on B: no seq %d", seq)
		}
	}
}

// TestWatchSurvivesListenerLoss kills the listener's connection; rows committed meanwhile
// still reach the watcher (through the reconnect wake-up or the poll).
func TestWatchSurvivesListenerLoss(t *testing.T) {
	_, dsn := pgtest.NewURL(t, postgres.Migrations)
	open := func() *pgxpool.Pool {
		pool, err := pg.Open(ctxFor(t), dsn, pg.Options{MaxConns: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	poolA, poolB := open(), open()
	stB := postgres.New(poolB, postgres.Options{Logger: quiet, WatchPoll: time.Hour, ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond})
	t.Cleanup(stB.Close)
	wA := newWriter(t, newStore(t, poolA), audit.WriterOptions{})

	ctx, cancel := context.WithCancel(ctxFor(t))
	defer cancel()
	ch, err := stB.Watch(ctx, "acme", 0)
	if err != nil {
		t.Fatal(err)
	}
	var killed int
	if err := poolA.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()`, postgres.ListenerApplicationName).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d listeners (%v), want 1", killed, err)
	}
	if _, err := wA.Append(ctx, audittest.Rec("acme", "during-outage", audit.PhaseIntent)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		if r.InvocationID != "during-outage" {
			t.Fatalf("got %s", r.InvocationID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the row appended while the listener was down never arrived (poll is an hour)")
	}
}

func TestStoreClosed(t *testing.T) {
	st := postgres.New(pgtest.New(t, postgres.Migrations), postgres.Options{Logger: quiet})
	ctx := ctxFor(t)
	ch, err := st.Watch(ctx, "acme", 0)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if _, ok := <-ch; ok {
		t.Fatal("watch delivered a row on an empty store")
	}
	rec := audittest.Rec("acme", "x", audit.PhaseIntent).Normalize(time.Now())
	if _, err := st.AppendBatch(ctx, []audit.Record{rec}); !errors.Is(err, audit.ErrClosed) {
		t.Fatalf("AppendBatch after Close: %v", err)
	}
	if _, err := st.Query(ctx, audit.Filter{Tenant: "acme"}); !errors.Is(err, audit.ErrClosed) {
		t.Fatalf("Query after Close: %v", err)
	}
}

// TestAppendIsAllOrNothing makes the last statement of a fast-path append fail (a trigger on the
// pending bookkeeping that only the test adds refuses to clear one entry): the head moves, rows
// and pending entries written before it in the same round trip must be gone with it, and the
// chains must continue where they were.
func TestAppendIsAllOrNothing(t *testing.T) {
	pool := pgtest.New(t, postgres.Migrations)
	st := newStore(t, pool)
	ctx := ctxFor(t)
	batch := func(recs ...audit.Record) []audit.Record {
		for i := range recs {
			recs[i] = recs[i].Normalize(audittest.Base)
		}
		return recs
	}
	count := func(sql string) int64 {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The first append of a tenant takes the locking path; the next ones the fast path.
	if _, err := st.AppendBatch(ctx, batch(audittest.Rec("acme", "inv-1", audit.PhaseIntent), audittest.Rec("globex", "poison", audit.PhaseIntent))); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`CREATE FUNCTION audit.refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF OLD.invocation_id = 'poison' THEN RAISE EXCEPTION 'poison'; END IF;
			RETURN OLD;
		END $$`,
		"CREATE TRIGGER refuse_poison BEFORE DELETE ON audit.pending FOR EACH ROW EXECUTE FUNCTION audit.refuse_poison()",
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	_, err := st.AppendBatch(ctx, batch(
		audittest.Rec("acme", "inv-1", audit.PhaseOutcome), audittest.Rec("acme", "inv-2", audit.PhaseIntent),
		audittest.Rec("globex", "inv-3", audit.PhaseIntent), audittest.Rec("globex", "poison", audit.PhaseOutcome)))
	if err == nil {
		t.Fatal("the append succeeded despite the failing pending bookkeeping")
	}
	if rows, heads, pending := count("SELECT count(*) FROM audit.records"), count("SELECT sum(seq) FROM audit.heads"),
		count("SELECT count(*) FROM audit.pending"); rows != 2 || heads != 2 || pending != 2 {
		t.Fatalf("after the failed append: %d rows, heads sum to %d, %d pending; want 2, 2, 2 as before", rows, heads, pending)
	}
	if _, err := pool.Exec(ctx, "DROP TRIGGER refuse_poison ON audit.pending"); err != nil {
		t.Fatal(err)
	}
	out, err := st.AppendBatch(ctx, batch(audittest.Rec("acme", "inv-1", audit.PhaseOutcome), audittest.Rec("globex", "poison", audit.PhaseOutcome)))
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Seq != 2 || out[1].Seq != 2 {
		t.Fatalf("seqs after the failed append = %d, %d; want 2, 2", out[0].Seq, out[1].Seq)
	}
	for _, tenant := range []string{"acme", "globex"} {
		if rep, err := st.Verify(ctx, tenant); err != nil || !rep.OK || rep.Rows != 2 {
			t.Fatalf("Verify(%s) = %+v, %v", tenant, rep, err)
		}
	}
	if pending := count("SELECT count(*) FROM audit.pending"); pending != 0 {
		t.Fatalf("%d pending entries after both outcomes, want 0", pending)
	}
}

// TestSideEffectsRoundTrip stores side effects with the characters that the array literal they
// travel in must escape.
func TestSideEffectsRoundTrip(t *testing.T) {
	st := newStore(t, pgtest.New(t, postgres.Migrations))
	w := newWriter(t, st, audit.WriterOptions{})
	odd := []string{`a"b`, `c\d`, `e,f`, `{g}`, `NULL`, ` h `, `i\"`}
	for i, inv := range []string{"first", "second"} { // the locking path, then the fast path
		rec := audittest.Rec("acme", inv, audit.PhaseIntent)
		rec.SideEffects = odd
		stored := mustAppendOne(t, w, rec)
		rows, err := st.Get(ctxFor(t), "acme", inv)
		if err != nil || len(rows) != 1 {
			t.Fatalf("Get(%s) = %d rows, %v", inv, len(rows), err)
		}
		if !slices.Equal(rows[0].SideEffects, stored.SideEffects) || len(rows[0].SideEffects) != len(odd) {
			t.Fatalf("side effects = %q, want %q", rows[0].SideEffects, stored.SideEffects)
		}
		if rep, err := st.Verify(ctxFor(t), "acme"); err != nil || !rep.OK || rep.Rows != int64(i+1) {
			t.Fatalf("Verify = %+v, %v", rep, err)
		}
	}
}

func mustAppendOne(t *testing.T, w *audit.Writer, rec audit.Record) audit.Stored {
	t.Helper()
	out, err := w.Append(ctxFor(t), rec)
	if err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// TestQueryExecModes appends through pools in each of pgx's query exec modes: the append
// statements encode their arrays one way when the server describes the parameters (the
// default) and the plain way otherwise, and both must store the same rows.
func TestQueryExecModes(t *testing.T) {
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			_, dsn := pgtest.NewURL(t, postgres.Migrations)
			sep := "?"
			if strings.Contains(dsn, "?") {
				sep = "&"
			}
			pool, err := pgxpool.New(ctxFor(t), dsn+sep+"default_query_exec_mode="+mode)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			w := newWriter(t, newStore(t, pool), audit.WriterOptions{})
			intent := audittest.Rec("acme", "inv-1", audit.PhaseIntent)
			intent.SideEffects, intent.Arguments = nil, nil
			outcome := audittest.Rec("acme", "inv-1", audit.PhaseOutcome)
			outcome.SideEffects = []string{`quote"d`, `back\slash`, "plain"}
			outcome.Message = "it's done, \"really\""
			plain := audittest.Rec("acme", "inv-2", audit.PhaseOutcome)
			plain.Approval.DecidedAt = time.Time{}
			// Two appends: the first takes the locking path, the second the fast one.
			appended, err := w.Append(ctxFor(t), intent)
			if err != nil {
				t.Fatal(err)
			}
			more, err := w.Append(ctxFor(t), outcome, plain)
			if err != nil {
				t.Fatal(err)
			}
			appended = append(appended, more...)
			for _, want := range appended {
				rows, err := w.Store().Get(ctxFor(t), "acme", want.InvocationID)
				if err != nil {
					t.Fatal(err)
				}
				i := slices.IndexFunc(rows, func(r audit.Stored) bool { return r.Phase == want.Phase })
				if i < 0 {
					t.Fatalf("%s %s not stored", want.InvocationID, want.Phase)
				}
				got := rows[i]
				if got.Seq != want.Seq || !bytes.Equal(got.Hash, want.Hash) || !bytes.Equal(got.PrevHash, want.PrevHash) ||
					!bytes.Equal(audit.CanonicalEncoding(got.Seq, &got.Record), audit.CanonicalEncoding(want.Seq, &want.Record)) {
					t.Errorf("stored row differs from the appended one:\n got %+v\nwant %+v", got, want)
				}
			}
			rep, err := w.Store().Verify(ctxFor(t), "acme")
			if err != nil || !rep.OK || rep.Rows != 3 {
				t.Fatalf("Verify = %+v, %v; want 3 rows, OK", rep, err)
			}
		})
	}
}
