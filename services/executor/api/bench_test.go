package api_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
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
// throughput; the "audit-commit" case is one acknowledged audit append, the
// unit the target is stated in.
//
//	go test ./services/executor/api -run '^$' -bench GovernedVsDirect -benchtime 2000x
func BenchmarkGovernedVsDirect(b *testing.B) {
	e := start(b)
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
		{"audit-commit", func(ctx context.Context) error {
			_, err := e.writer.Append(ctx, audit.Record{
				InvocationID: executorID(), Phase: audit.PhaseOutcome, Tenant: "acme", Channel: audit.ChannelGRPC,
				Command: "ticket.get", Risk: "L0", UserID: "alice", ActorKind: audit.ActorUser, Outcome: audit.OutcomeExecuted,
			})
			return err
		}},
	}
	for _, conc := range []int{1, 32} {
		for _, c := range cases {
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
