package postgres_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/audittest"
	"github.com/mandate-dev/mandate/services/audit/postgres"
)

// BenchmarkAppend measures acknowledged appends per second (an append counts once Append has
// returned, i.e. after its COMMIT) with group commit and with one transaction per append
// (WriterOptions.Unbatched), at 1, 16 and 64 concurrent writers. Each append is one realistic
// intent row (audittest.Rec: 35 columns, JSON arguments); the writers spread over 4 tenants, or
// all write to one tenant (the worst case: one hash chain). Every sub-benchmark starts from an
// empty database.
//
//	go test -run '^$' -bench BenchmarkAppend -benchtime 10s ./services/audit/postgres/
func BenchmarkAppend(b *testing.B) {
	for _, mode := range []struct {
		name    string
		tenants int
		opts    audit.WriterOptions
	}{
		{"group_commit", 4, audit.WriterOptions{}},
		{"tx_per_append", 4, audit.WriterOptions{Unbatched: true}},
		{"group_commit_1tenant", 1, audit.WriterOptions{}},
		{"tx_per_append_1tenant", 1, audit.WriterOptions{Unbatched: true}},
	} {
		for _, writers := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/writers=%d", mode.name, writers), func(b *testing.B) {
				_, dsn := pgtest.NewURL(b, postgres.Migrations)
				pool, err := pg.Open(context.Background(), dsn, pg.Options{MaxConns: 32})
				if err != nil {
					b.Fatal(err)
				}
				defer pool.Close()
				st := postgres.New(pool, postgres.Options{Logger: quiet})
				defer st.Close()
				opts := mode.opts
				opts.Logger = quiet
				w := audit.NewWriter(st, opts)
				defer func() { _ = w.Close() }()

				recs := make([]audit.Record, b.N)
				for i := range recs {
					recs[i] = audittest.Rec("tenant-"+strconv.Itoa(i%mode.tenants), "inv-"+strconv.Itoa(i), audit.PhaseIntent)
				}
				var next atomic.Int64
				var wg sync.WaitGroup
				ctx := context.Background()
				b.ResetTimer()
				start := time.Now()
				for range writers {
					wg.Go(func() {
						for {
							i := next.Add(1) - 1
							if i >= int64(b.N) {
								return
							}
							if _, err := w.Append(ctx, recs[i]); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "appends/s")
				if s := w.Stats(); s.Batches > 0 {
					b.ReportMetric(float64(s.Records)/float64(s.Batches), "records/tx")
				}
				b.ReportMetric(0, "ns/op") // per-op latency is not the point here; see appends/s
			})
		}
	}
}

// seedRows is the size of the compliance benchmark's trail.
const seedRows = 1_000_000

// seed fills audit.records with seedRows rows over 4 tenants and one year, in one INSERT …
// SELECT generate_series. The mix: actor kinds 50% agent / 30% user / 20% service; risks L0 40%,
// L1 25%, L2 20%, L3 10%, L4 5%; side effects 25% {ledger,payment-gateway}, 15% {email}, the
// rest none; half intents, half outcomes; L3/L4 outcomes approved. So about 1% of the rows
// (0.5 × 0.15 × 0.25 × 0.5) answer the compliance question over the whole year. Hashes are
// placeholders: this data exercises queries, not Verify.
func seed(b *testing.B, pool *pgxpool.Pool, now time.Time) {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	const q = `
	INSERT INTO audit.records
	SELECT 'tenant-' || (g % 4), g / 4 + 1, 'inv-' || g, ph,
	       $1::timestamptz - make_interval(secs => (($2 - g)::float8 * 31536000 / $2)),
	       'mcp', CASE WHEN rk >= 'L3' THEN 'ticket.refund' ELSE 'ticket.search' END, rk,
	       CASE WHEN r3 < 0.25 THEN '{ledger,payment-gateway}'::text[] WHEN r3 < 0.40 THEN '{email}'::text[] ELSE '{}'::text[] END,
	       true, false, 'ticket/' || g, 'user-' || (g % 500), ak,
	       CASE WHEN ak = 'agent' THEN 'bot-' || (g % 20) ELSE '' END,
	       CASE WHEN ak = 'agent' THEN 'model-' || (g % 3) ELSE '' END,
	       CASE WHEN ak = 'agent' THEN '1' ELSE '' END,
	       'conv-' || (g / 10), '',
	       CASE WHEN ap THEN 'ch-' || g END, CASE WHEN ap THEN 'approver-' || (g % 7) END,
	       CASE WHEN ap THEN 'approval_page' END, NULL,
	       CASE WHEN ph = 'intent' THEN 'pending' WHEN r5 < 0.8 THEN 'executed' WHEN r5 < 0.95 THEN 'refused' ELSE 'failed' END,
	       CASE WHEN ph = 'intent' OR r5 < 0.8 THEN '' WHEN r5 < 0.95 THEN 'permission_check' ELSE 'dispatch' END,
	       CASE WHEN ph = 'intent' OR r5 < 0.8 THEN '' WHEN r5 < 0.95 THEN 'authorization.permission_denied' ELSE 'handler.failed' END,
	       '', ('{"ticket_id":"' || g || '","amount":1250}')::json, 'sha256:args', '', 1500000000, md5(g::text), 'sha256:manifest',
	       sha256(int8send(g - 1)), sha256(int8send(g))
	FROM (
	  SELECT g, rk, ak, ph, r3, r5, (ph = 'outcome' AND rk >= 'L3') AS ap
	  FROM (
	    SELECT g,
	           CASE WHEN r1 < 0.40 THEN 'L0' WHEN r1 < 0.65 THEN 'L1' WHEN r1 < 0.85 THEN 'L2' WHEN r1 < 0.95 THEN 'L3' ELSE 'L4' END AS rk,
	           CASE WHEN r2 < 0.5 THEN 'agent' WHEN r2 < 0.8 THEN 'user' ELSE 'service' END AS ak,
	           CASE WHEN r4 < 0.5 THEN 'intent' ELSE 'outcome' END AS ph,
	           r3, r5
	    FROM (SELECT g, random() r1, random() r2, random() r3, random() r4, random() r5
	          FROM generate_series(0, $2 - 1) g) x
	  ) y
	) z`
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	for _, s := range []string{
		"SELECT setseed(0.42)",
		"ALTER TABLE audit.records DISABLE TRIGGER records_append_only",
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, q, now, seedRows); err != nil {
		b.Fatalf("seeding: %v", err)
	}
	for _, s := range []string{
		"ALTER TABLE audit.records ENABLE TRIGGER records_append_only",
		`INSERT INTO audit.heads SELECT tenant, max(seq), sha256(int8send(max(seq))) FROM audit.records GROUP BY tenant`,
		"VACUUM (ANALYZE) audit.records",
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
	var size string
	_ = conn.QueryRow(ctx, "SELECT pg_size_pretty(pg_total_relation_size('audit.records'))").Scan(&size)
	b.Logf("seeded %d rows in %v (table + indexes: %s)", seedRows, time.Since(start).Round(time.Millisecond), size)
}

// BenchmarkComplianceQuery measures "which L3/L4 commands did agents run that touched the
// ledger, and who approved them" (first page of 50, newest first) over 1,000,000 seeded rows,
// and logs EXPLAIN ANALYZE of exactly the SQL Query runs.
//
//	go test -run '^$' -bench BenchmarkComplianceQuery -v ./services/audit/postgres/
func BenchmarkComplianceQuery(b *testing.B) {
	_, dsn := pgtest.NewURL(b, postgres.Migrations)
	pool, err := pg.Open(context.Background(), dsn, pg.Options{MaxConns: 4})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	now := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	seed(b, pool, now)
	st := postgres.New(pool, postgres.Options{Logger: quiet})
	defer st.Close()

	compliance := func(from, to time.Time) audit.Filter {
		return audit.Filter{
			Tenant:     "tenant-1",
			ActorKinds: []audit.ActorKind{audit.ActorAgent},
			Risks:      []audit.Risk{audit.RiskL3, audit.RiskL4},
			SideEffect: "ledger",
			Phase:      audit.PhaseOutcome,
			From:       from, To: to,
		}
	}
	cases := []struct {
		name string
		f    audit.Filter
	}{
		{"last_quarter", compliance(now.AddDate(0, -3, 0), now)},
		{"whole_year", compliance(now.AddDate(-1, 0, 0), now)},
		{"quarter_a_year_ago", compliance(now.AddDate(-1, 0, 0), now.AddDate(0, -9, 0))},
		{"last_quarter_page_3", compliance(now.AddDate(0, -3, 0), now)},
	}
	ctx := context.Background()
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			f := c.f
			if strings.HasSuffix(c.name, "page_3") {
				for range 2 {
					p, err := st.Query(ctx, f)
					if err != nil || p.NextPageToken == "" {
						b.Fatalf("paging: %v", err)
					}
					f.PageToken = p.NextPageToken
				}
			}
			page, err := st.Query(ctx, f)
			if err != nil {
				b.Fatal(err)
			}
			explain(b, pool, f)
			var matching int64
			cf := f
			cf.PageToken = ""
			sql, args, _ := postgres.BuildQuery(cf)
			countSQL := "SELECT count(*) FROM (" + strings.Split(sql, " ORDER BY ")[0] + ") q"
			if err := pool.QueryRow(ctx, countSQL, args[:len(args)-1]...).Scan(&matching); err != nil {
				b.Fatal(err)
			}
			b.Logf("%d rows of tenant-1 match (%.2f%% of its %d rows); the page holds %d", matching, 100*float64(matching)/(seedRows/4), seedRows/4, len(page.Records))
			for _, r := range page.Records {
				if r.Approval == nil || r.ActorKind != audit.ActorAgent || r.Risk < audit.RiskL3 {
					b.Fatalf("unexpected row %+v", r.Record)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				if _, err := st.Query(ctx, f); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/query")
		})
	}
}

func explain(b *testing.B, pool *pgxpool.Pool, f audit.Filter) {
	b.Helper()
	sql, args, err := postgres.BuildQuery(f)
	if err != nil {
		b.Fatal(err)
	}
	rows, err := pool.Query(context.Background(), "EXPLAIN (ANALYZE, BUFFERS) "+sql, append([]any{pgx.QueryExecModeCacheDescribe}, args...)...)
	if err != nil {
		b.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("EXPLAIN ANALYZE:\n%s", strings.Join(lines, "\n"))
}
