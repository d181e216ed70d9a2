package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestMain lets the test binary stand in for mandate-bench: run re-executes its own binary as
// the servers it measures.
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && (os.Args[1] == childMode || os.Args[1] == referenceMode) {
		main()
		return
	}
	os.Exit(m.Run())
}

// TestBenchPrintsTheRatios runs the whole benchmark with a handful of calls and checks that
// one run prints what the README quotes: the ratio table for every shape and, with Postgres and
// pgbench at hand, the audit comparison. It measures nothing.
func TestBenchPrintsTheRatios(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dozen servers")
	}
	got, cfg := runBench(t, 3*time.Minute, "-calls-1", "3", "-calls-16", "32", "-rounds", "2", "-protocols", "2026-07-28", "-audit", "1s", "-timeline", "5")
	want := []string{"| mandate dev ", "governed / ungoverned", "allocs per call", "the median of 2 rounds",
		"### ticket.search\n", "### expense.report.create\n", "a fresh idempotency key per call",
		"Targets of issue #28, ticket.search (MCP 2026-07-28", "Targets of issue #28, expense.report.create (MCP 2026-07-28",
		"| `mandate dev` vs the in-memory reference, calls/s, c=16 | ≥ 0.95× | "}
	if postgresAnswers(context.Background(), cfg.databaseURL) {
		want = append(want, "| separate processes + Postgres ", "CPU/allocs per call by process",
			"against the same backend ungoverned", "| ungoverned over the service / in-memory reference",
			"ungoverned over the service, 2026-07-28, callers 16 — CPU/allocs per call by process: reference-over-service ",
			"One call at a time, traced", "median of 5 calls", "| mcpbridge server tools/call ticket.search | 0.00 ms |",
			"| executor server mandate.v1.ExecutorService/Execute |", "| executor internal audit |",
			"| helpdesk server examples.helpdesk.v1.HelpdeskService/SearchTickets |",
			"expense.report.create, separate processes + Postgres against the same backend ungoverned",
			"| mcpbridge server tools/call expense.report.create | 0.00 ms |",
			"| helpdesk server examples.helpdesk.v1.HelpdeskService/CreateExpenseReport |",
			"| separate processes + Postgres vs the reference over the service, calls/s, c=16 | ≥ 0.75× | ",
			"| Postgres CPU per governed call, c=16 | ≤ 0.35 ms | ",
			"| separate processes + Postgres, one caller, p50 | ≤ ref + one commit (")
		if _, err := exec.LookPath("pgbench"); err == nil {
			want = append(want, "Audit appends vs pgbench", "same database, 2 rounds", "| group commit (")
		}
	}
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("output lacks %q", w)
		}
	}
}

// TestBenchWrites: a short run of the write alone completes — every call
// of it, on every target, created a report under a key of its own — and
// prints the write's section and targets, not the search's. Without the
// topology, its targets are n/a and say why.
func TestBenchWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dozen servers")
	}
	for _, c := range []struct {
		name  string
		flags []string
	}{
		{"topology auto", nil},
		{"topology off", []string{"-topology", "off"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, cfg := runBench(t, 2*time.Minute, append([]string{"-commands", "write", "-calls-1", "3", "-calls-16", "32", "-rounds", "1",
				"-protocols", "2026-07-28", "-audit", "0", "-timeline", "5"}, c.flags...)...)
			want := []string{"### expense.report.create\n", "| mandate dev ", "Targets of issue #28, expense.report.create (MCP 2026-07-28",
				"| `mandate dev` vs the in-memory reference, calls/s, c=16 | ≥ 0.95× | "}
			switch {
			case c.flags != nil:
				want = append(want, "| Postgres CPU per governed call, c=16 | ≤ 0.35 ms | n/a (-topology off) | n/a |",
					"| separate processes + Postgres, one caller, p50 | ≤ ref + one commit + 0.50 ms | n/a (-topology off) | n/a |")
			case postgresAnswers(context.Background(), cfg.databaseURL):
				want = append(want, "| separate processes + Postgres ",
					"expense.report.create, separate processes + Postgres against the same backend ungoverned",
					"| helpdesk server examples.helpdesk.v1.HelpdeskService/CreateExpenseReport |",
					"| separate processes + Postgres, one caller, p50 | ≤ ref + one commit (")
			}
			for _, w := range want {
				if !strings.Contains(got, w) {
					t.Errorf("output lacks %q", w)
				}
			}
			for _, not := range []string{"ticket.search", "n/a (not measured)"} {
				if strings.Contains(got, not) {
					t.Errorf("output has %q", not)
				}
			}
		})
	}
}

func postgresAnswers(ctx context.Context, url string) bool {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, url)
	if err != nil {
		return false
	}
	_ = conn.Close(cctx)
	return true
}

// TestRoundsAddUp: rounds of one target add their calls, time, CPU and
// allocations, and the p50 is the median of every call of every round; the
// ratio printed is the median round's, with the range beside it.
func TestRoundsAddUp(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var d []time.Duration
		for _, v := range n {
			d = append(d, time.Duration(v)*time.Millisecond)
		}
		return d
	}
	a := measurement{calls: 3, elapsed: time.Second, cpu: 30 * time.Millisecond, mallocs: 300,
		byProc: []procCost{{name: "x", cpu: 30 * time.Millisecond, mallocs: 300}}, latency: ms(1, 2, 9)}
	b := measurement{calls: 2, elapsed: time.Second, cpu: 20 * time.Millisecond, mallocs: 100,
		byProc: []procCost{{name: "x", cpu: 20 * time.Millisecond, mallocs: 100}}, latency: ms(3, 4)}
	m := measurement{}.merge(a).merge(b)
	if m.calls != 5 || m.elapsed != 2*time.Second || m.cpu != 50*time.Millisecond || m.mallocs != 400 {
		t.Errorf("merged %+v", m)
	}
	if m.p50 != 3*time.Millisecond {
		t.Errorf("p50 %v, want 3ms (the median of 1,2,3,4,9)", m.p50)
	}
	if m.byProc[0].mallocs != 400 || a.byProc[0].mallocs != 300 {
		t.Errorf("by process: merged %d (want 400), first round now %d (want 300)", m.byProc[0].mallocs, a.byProc[0].mallocs)
	}
	for _, c := range []struct {
		ratios []float64
		want   string
	}{
		{[]float64{0.8}, "0.80"},
		{[]float64{0.9, 0.7, 0.8}, "0.80 (0.70–0.90)"},
		{[]float64{0.9, 0.7}, "0.80 (0.70–0.90)"},
	} {
		r := row{ratios: map[string][]float64{shapeDev: c.ratios}}
		if got := r.ratio(shapeDev); got != c.want {
			t.Errorf("ratio of %v: %q, want %q", c.ratios, got, c.want)
		}
	}
}

// TestTimelineOf: spans are placed relative to each call's first span, the
// median offset and duration are over the calls, rows come in the order
// the spans start, a second span of the same name is told apart, and a span
// seen in fewer than half of the calls is left out.
func TestTimelineOf(t *testing.T) {
	at := func(base time.Time, from, to int) (time.Time, time.Time) {
		return base.Add(time.Duration(from) * time.Millisecond), base.Add(time.Duration(to) * time.Millisecond)
	}
	call := func(base time.Time, auditFrom int, extra bool) []span {
		var out []span
		add := func(service, kind, name string, from, to int) {
			s, e := at(base, from, to)
			out = append(out, span{service: service, kind: kind, name: name, start: s, end: e})
		}
		// Out of order, as the sink receives them.
		add("mandate-audit", "server", "Append", auditFrom, auditFrom+2)
		add("mandate-mcpbridge", "server", "tools/call", 0, 10)
		add("mandate-audit", "server", "Append", 12, 13)
		if extra {
			add("mandate-executor", "internal", "retry", 5, 6)
		}
		return out
	}
	base := time.Unix(1_700_000_000, 0)
	rows := timelineOf([][]span{
		call(base, 1, true),
		call(base.Add(time.Second), 3, false),
		call(base.Add(2*time.Second), 2, false),
	})
	want := []timelineRow{
		{label: "mcpbridge server tools/call", seen: 3, offset: 0, lasts: 10 * time.Millisecond},
		{label: "audit server Append", seen: 3, offset: 2 * time.Millisecond, lasts: 2 * time.Millisecond},
		{label: "audit server Append (#2)", seen: 3, offset: 12 * time.Millisecond, lasts: time.Millisecond},
	}
	if !slices.Equal(rows, want) {
		t.Fatalf("timeline:\n got %+v\nwant %+v", rows, want)
	}
}

// runBench runs the benchmark with args within timeout and returns what it
// printed, and its configuration.
func runBench(t *testing.T, timeout time.Duration, args ...string) (string, config) {
	t.Helper()
	cfg, err := parseFlags(args)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, cfg, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	t.Log(out.String())
	return out.String(), cfg
}
