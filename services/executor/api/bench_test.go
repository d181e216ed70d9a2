package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	genmanifest "github.com/mandate-dev/mandate/gen/manifest"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/audit"
)

// BenchmarkGovernedVsDirect compares a governed call (helpdesk client
// pointed at the executor: the whole pipeline with an intent and an outcome
// row in Postgres) with a direct call to the backend, at 1 and 32
// concurrent callers, in one run. It reports p50/p99 latency and
// throughput; the "audit-commit" case is one acknowledged intent append,
// the commit a governed call waits for and the unit the target is stated
// in; "governed-spaced" pauses between calls so each runs on its own.
//
//	go test ./services/executor/api -run '^$' -bench GovernedVsDirect -benchtime 2000x
func BenchmarkGovernedVsDirect(b *testing.B) {
	e := start(b, postgresStores)
	tok := token(b, "acme", "alice", "support-bot")
	req := &helpdeskv1.GetTicketRequest{TicketId: "T-1001"}
	governed := helpdeskv1.NewHelpdeskServiceClient(e.conn)
	direct := helpdeskv1.NewHelpdeskServiceClient(e.backend)
	cases := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"direct", func(context.Context) error {
			// The backend only serves Mandate services: call it as the
			// executor does, with the service token forwarding alice's.
			_, err := direct.GetTicket(identity.WithRawToken(context.Background(), tok), req)
			return err
		}},
		{"governed", func(context.Context) error {
			_, err := governed.GetTicket(as(tok), req)
			return err
		}},
		{"governed-spaced", func(context.Context) error {
			// Like governed, but the previous call's outcome row has had
			// time to commit: the latency of one call on its own (the
			// pause is outside the measured time).
			time.Sleep(10 * time.Millisecond)
			t0 := time.Now()
			_, err := governed.GetTicket(as(tok), req)
			spacedExtra.Store(int64(time.Since(t0)))
			return err
		}},
		{"audit-commit", func(ctx context.Context) error {
			// The commit on a governed call's path: an intent row.
			_, err := e.writer.Append(ctx, audit.Record{
				InvocationID: executorID(), Phase: audit.PhaseIntent, Tenant: "acme", Channel: audit.ChannelGRPC,
				Command: "ticket.get", Risk: "L0", UserID: "alice", ActorKind: audit.ActorAgent, AgentID: "support-bot",
				Outcome: audit.OutcomePending, Subject: "T-1001", Arguments: []byte(`{"ticket_id":"T-1001"}`),
			})
			return err
		}},
	}
	for _, conc := range []int{1, 32} {
		for _, c := range cases {
			if c.name == "governed-spaced" && conc != 1 {
				continue
			}
			b.Run(fmt.Sprintf("%s/callers=%d", c.name, conc), func(b *testing.B) {
				lat := make([]time.Duration, 0, b.N)
				var mu sync.Mutex
				var wg sync.WaitGroup
				next := make(chan struct{}, b.N)
				for range b.N {
					next <- struct{}{}
				}
				close(next)
				b.ResetTimer()
				start := time.Now()
				for range conc {
					wg.Go(func() {
						for range next {
							t0 := time.Now()
							if err := c.call(context.Background()); err != nil {
								b.Error(err)
								return
							}
							d := time.Since(t0)
							if c.name == "governed-spaced" {
								d = time.Duration(spacedExtra.Load())
							}
							mu.Lock()
							lat = append(lat, d)
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				slices.Sort(lat)
				if len(lat) == 0 {
					return
				}
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
				b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "calls/s")
			})
		}
	}
}

var spacedExtra atomic.Int64

var benchSeq struct {
	sync.Mutex
	n int
}

func executorID() string {
	benchSeq.Lock()
	defer benchSeq.Unlock()
	benchSeq.n++
	return fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), benchSeq.n)
}

var _ grpc.ClientConnInterface = (*grpc.ClientConn)(nil)

// BenchmarkLimitCost is what the refund's declared budget costs a governed
// call (issue 29: the conditions and budget stages cost at most 5 % of
// one). Two topologies on Postgres run side by side, call for call
// alternately: the sample's manifest, whose ticket.refund declares
// agent-daily-refunds (budget_check spends in the executor's store), and
// the same manifest without the limit. finance-bot refunds 0.01 EUR with a
// fresh idempotency key each time: no human is asked (below 1.00), every
// stage runs, and the budget never runs out within 1000 calls. It reports
// each side's p50 and mean and their ratio. MANDATE_BENCH_CALLERS=16 runs
// 16 callers at once, each alternating the two.
//
//	go test ./services/executor/api -run '^$' -bench LimitCost -benchtime 1000x
func BenchmarkLimitCost(b *testing.B) {
	var m manifest.Manifest
	if err := json.Unmarshal(genmanifest.Manifest, &m); err != nil {
		b.Fatal(err)
	}
	for _, c := range m.Commands {
		c.Limits = nil
	}
	raw, err := manifest.Encode(&m)
	if err != nil {
		b.Fatal(err)
	}
	bare, err := manifest.Load(raw, genmanifest.DescriptorSet)
	if err != nil {
		b.Fatal(err)
	}
	withBacking, withoutBacking := postgresBacking(b, context.Background()), postgresBacking(b, context.Background())
	with := startOn(b, withBacking, set(b))
	without := startOn(b, withoutBacking, bare)
	bot := as(token(b, "acme", "carol", "finance-bot"))
	const input = `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"1"},"reason":"Goodwill gesture","cardholder_reference":"CH4242424242"}`
	call := func(e *env, key string) time.Duration {
		t0 := time.Now()
		_, err := mandatev1.NewExecutorServiceClient(e.conn).Execute(bot, &mandatev1.ExecuteRequest{
			Code: "ticket.refund", InputJson: []byte(input), IdempotencyKey: key})
		if err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	// Warm both: connections, prepared statements.
	for i := range 20 {
		call(with, fmt.Sprintf("warm-with-%d", i))
		call(without, fmt.Sprintf("warm-without-%d", i))
	}
	var (
		lw, lo []time.Duration
		mu     sync.Mutex
		seq    atomic.Int64
	)
	callers := 1
	if s := os.Getenv("MANDATE_BENCH_CALLERS"); s != "" {
		callers, _ = strconv.Atoi(s)
	}
	// CPU, besides latency: each topology's Postgres backends (found by
	// their database in the process title) and this process, which runs
	// both topologies' Go side.
	pgWith0, pgWithout0, self0 := backendCPU(b, withBacking.database), backendCPU(b, withoutBacking.database), selfCPU(b)
	work := make(chan struct{}, b.N)
	for range b.N {
		work <- struct{}{}
	}
	close(work)
	b.ResetTimer()
	var wg sync.WaitGroup
	for range max(callers, 1) {
		wg.Go(func() {
			for range work {
				i := seq.Add(1)
				var dw, do time.Duration
				if i%2 == 0 {
					dw = call(with, fmt.Sprintf("with-%d", i))
					do = call(without, fmt.Sprintf("without-%d", i))
				} else {
					do = call(without, fmt.Sprintf("without-%d", i))
					dw = call(with, fmt.Sprintf("with-%d", i))
				}
				mu.Lock()
				lw, lo = append(lw, dw), append(lo, do)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	n := float64(b.N)
	pgWith := float64((backendCPU(b, withBacking.database) - pgWith0).Microseconds()) / n
	pgWithout := float64((backendCPU(b, withoutBacking.database) - pgWithout0).Microseconds()) / n
	goBoth := float64((selfCPU(b) - self0).Microseconds()) / n
	b.ReportMetric(pgWith, "pg-cpu-with-µs")
	b.ReportMetric(pgWithout, "pg-cpu-without-µs")
	b.ReportMetric(goBoth/2, "go-cpu-per-call-µs")
	// What the limit adds in Postgres, against the CPU of a governed call
	// without it: half this process's CPU (it ran one call of each) and
	// that call's Postgres CPU. The Go side of the budget stage is left in
	// the halves (BenchmarkStageBudget measures it alone).
	b.ReportMetric((pgWith-pgWithout)/(goBoth/2+pgWithout), "pg-cpu-added-share")
	mean := func(l []time.Duration) float64 {
		var s time.Duration
		for _, d := range l {
			s += d
		}
		return float64(s.Microseconds()) / float64(len(l))
	}
	slices.Sort(lw)
	slices.Sort(lo)
	b.ReportMetric(float64(lw[len(lw)/2].Microseconds()), "with-p50-µs")
	b.ReportMetric(float64(lo[len(lo)/2].Microseconds()), "without-p50-µs")
	b.ReportMetric(mean(lw), "with-mean-µs")
	b.ReportMetric(mean(lo), "without-mean-µs")
	b.ReportMetric(mean(lw)/mean(lo), "mean-ratio")
}

// set is the embedded manifest, with its limits.
func set(b *testing.B) *manifest.Set {
	s, err := manifest.Embedded()
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// backendCPU is the CPU time the Postgres backends serving database have
// used so far (user and system, from /proc: Linux only; the benchmark
// skips elsewhere).
func backendCPU(b *testing.B, database string) time.Duration {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		b.Skipf("no /proc: %v", err)
	}
	var total time.Duration
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		title, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil || !strings.HasPrefix(string(title), "postgres: ") || !strings.Contains(string(title), " "+database+" ") {
			continue
		}
		total += procCPU("/proc/" + d.Name() + "/stat")
	}
	return total
}

// selfCPU is this process's CPU time so far.
func selfCPU(b *testing.B) time.Duration {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		b.Skipf("no /proc: %v", err)
	}
	return procCPU("/proc/self/stat")
}

// procCPU reads utime and stime (fields 14 and 15, in clock ticks of
// 1/100 s) from a /proc stat file; 0 when it cannot.
func procCPU(path string) time.Duration {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	// The command in field 2 may hold spaces; it ends at the last ')'.
	rest := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	if len(rest) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(rest[11], 10, 64)
	st, _ := strconv.ParseInt(rest[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}
