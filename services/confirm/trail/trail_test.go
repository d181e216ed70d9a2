package trail_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/trail"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// audit is an audit service that refuses appends while down, and keeps
// the rows it took, once each (appends are idempotent on the attempt id).
type audit struct {
	mandatev1.AuditServiceClient
	mu      sync.Mutex
	down    bool
	rows    []*mandatev1.AuditRecord
	seen    map[string]bool
	relayed bool
}

func newAudit() *audit { return &audit{seen: map[string]bool{}} }

func (a *audit) Append(ctx context.Context, in *mandatev1.AppendRequest, _ ...grpc.CallOption) (*mandatev1.AppendResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := identity.RawTokenFromContext(ctx); ok {
		a.relayed = true
	}
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(identity.OnBehalfOfHeader)) > 0 {
		a.relayed = true
	}
	if a.down {
		return nil, errors.New("audit unavailable")
	}
	for _, r := range in.GetRecords() {
		if !a.seen[r.GetInvocationId()] {
			a.seen[r.GetInvocationId()] = true
			a.rows = append(a.rows, r)
		}
	}
	return &mandatev1.AppendResponse{}, nil
}

func (a *audit) setDown(down bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.down = down
}

func (a *audit) ids() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, r := range a.rows {
		out = append(out, r.GetSubject())
	}
	return out
}

func attempt(challenge string) confirm.Attempt {
	return confirm.Attempt{
		ID: confirm.NewID(), Time: time.Now(), ChallengeID: challenge, Verdict: confirm.VerdictApprove, Channel: confirm.ChannelAPI,
		Decider: identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "alice"},
		Code:    "confirmation.approver_not_allowed", Message: "four eyes",
	}
}

func counts(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != trail.MetricRows {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := dp.Attributes.Value("result")
				out[v.AsString()] += dp.Value
			}
		}
	}
	return out
}

// A row the audit service does not take is held, and appended by Run, in
// order with the rows that came after it, once the service is back; the
// caller's token is never relayed (the rows go on the confirm service's own
// authority).
func TestHeldRowsAreRetriedInOrder(t *testing.T) {
	a := newAudit()
	reader := sdkmetric.NewManualReader()
	tr := trail.New(trail.Options{Audit: a, RetryInterval: 10 * time.Millisecond, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	caller := identity.WithRawToken(context.Background(), "the-deciders-token")

	tr.Record(caller, attempt("c1"))
	a.setDown(true)
	tr.Record(caller, attempt("c2"))
	a.setDown(false)
	tr.Record(caller, attempt("c3")) // queued behind c2, not appended before it
	if got := tr.Held(); got != 2 {
		t.Fatalf("held %d rows, want 2", got)
	}
	if got := a.ids(); len(got) != 1 || got[0] != "c1" {
		t.Fatalf("appended %v before Run, want [c1]", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- tr.Run(ctx) }()
	// Run drops rows from its hold after their append returns: wait for
	// the hold to empty, not for a number of appends (one append may take
	// both rows, and be counted before they leave the hold).
	for deadline := time.Now().Add(10 * time.Second); tr.Held() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still held 10 s after the trail came back", tr.Held())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := a.ids(); len(got) != 3 || got[1] != "c2" || got[2] != "c3" {
		t.Fatalf("appended %v, want [c1 c2 c3]", got)
	}
	if a.relayed {
		t.Fatal("the decider's token was relayed to the audit service")
	}
	if got := counts(t, reader); got[trail.ResultAppended] != 1 || got[trail.ResultHeld] != 2 || got[trail.ResultRetried] != 2 || got[trail.ResultDropped] != 0 {
		t.Fatalf("%s = %v, want appended 1, held 2, retried 2", trail.MetricRows, got)
	}
}

// The hold is bounded: a row that finds it full is dropped (logged, and
// counted), and so are the rows still held when Run ends with the audit
// service still down.
func TestTheHoldIsBounded(t *testing.T) {
	a := newAudit()
	a.setDown(true)
	reader := sdkmetric.NewManualReader()
	tr := trail.New(trail.Options{Audit: a, MaxHeld: 2, AppendTimeout: time.Second, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	for _, c := range []string{"c1", "c2", "c3"} {
		tr.Record(context.Background(), attempt(c))
	}
	if got := tr.Held(); got != 2 {
		t.Fatalf("held %d rows, want 2 (the bound)", got)
	}
	if got := counts(t, reader); got[trail.ResultHeld] != 2 || got[trail.ResultDropped] != 1 {
		t.Fatalf("%s = %v, want held 2, dropped 1", trail.MetricRows, got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tr.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if got := counts(t, reader); got[trail.ResultDropped] != 3 || tr.Held() != 0 {
		t.Fatalf("%s = %v, held %d after Run; want the two held rows dropped too", trail.MetricRows, got, tr.Held())
	}
}
