package api_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/internal/identity"
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
