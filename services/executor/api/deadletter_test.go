package api_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/executor"
)

// refusingTrail passes appends to the trail, except that it refuses
// outright (InvalidArgument, not unavailability) every append carrying an
// outcome row of a command in refuse.
type refusingTrail struct {
	executor.AuditClient
	mu     sync.Mutex
	refuse map[string]bool
	// refused are the invocations of the rows refused, in order.
	refused []string
}

func (r *refusingTrail) Append(ctx context.Context, req *mandatev1.AppendRequest, opts ...grpc.CallOption) (*mandatev1.AppendResponse, error) {
	r.mu.Lock()
	for _, rec := range req.GetRecords() {
		if rec.GetPhase() == "outcome" && r.refuse[rec.GetCommand()] {
			r.refused = append(r.refused, rec.GetInvocationId())
			r.mu.Unlock()
			return nil, status.Error(codes.InvalidArgument, "the trail refuses this row")
		}
	}
	r.mu.Unlock()
	return r.AuditClient.Append(ctx, req, opts...)
}

func (r *refusingTrail) set(command string, refuse bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refuse[command] = refuse
}

// TestARefusedRowIsKeptInTheDeadLetter (issue 31 item 3): a row the
// trail refuses outright is never dropped. It is spooled, tried again at
// every flush and, after the last try, moved to the executor's dead
// letter, logged and counted (mandate.executor.audit.dead_lettered);
// ListDeadLetters shows it to an operator (audit.resolve and audit.read),
// refusing an agent, a user without audit.resolve and one with only
// audit.read (authorization.permission_denied); another tenant's
// operator sees nothing and re-drives nothing; RedriveDeadLetters puts
// it back in the spool and, the trail now taking it, the next flush
// appends it: the trail holds the row, the dead letter is empty.
func TestARefusedRowIsKeptInTheDeadLetter(t *testing.T) {
	eachStore(t, testARefusedRowIsKeptInTheDeadLetter)
}

func testARefusedRowIsKeptInTheDeadLetter(t *testing.T, st stores) {
	reader := metric.NewManualReader()
	trail := &refusingTrail{refuse: map[string]bool{}}
	e := start(t, st, func(c *executor.Config) {
		trail.AuditClient = c.Audit
		c.Audit = trail
		c.SpoolInterval = time.Hour // the test flushes
		c.MeterProvider = metric.NewMeterProvider(metric.WithReader(reader))
	})
	ctx := context.Background()
	if _, err := directory.Apply(ctx, e.dir, []byte(operatorPolicy)); err != nil {
		t.Fatal(err)
	}
	client := mandatev1.NewExecutorServiceClient(e.conn)

	// A search whose outcome row the trail refuses: it waits in the spool
	// (the executor's outbox, which its intent left for the trail). The
	// relay, woken by the row, tried it once already; such tries do not
	// count towards the dead letter, the flushes below (the ticks) do.
	trail.set("ticket.search", true)
	searched, err := e.execute(t, as(token(t, "acme", "alice", "")), "ticket.search", `{"query":"charged twice"}`)
	if err != nil {
		t.Fatal(err)
	}
	inv := searched.GetInvocationId()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		trail.mu.Lock()
		tried := slices.Contains(trail.refused, inv)
		trail.mu.Unlock()
		if tried {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the relay never offered the outcome row to the trail")
		}
	}
	if rows := e.rows(t, "acme", inv, 1); len(rows) != 1 || rows[0].Phase != audit.PhaseIntent {
		t.Fatalf("rows of %s: %+v, want its intent, relayed", inv, rows)
	}
	for i := range executor.DeadLetterAfter {
		if _, err := e.pipeline.FlushSpool(ctx); err != nil {
			t.Fatalf("flush %d: %v", i+1, err)
		}
		spooled, _ := e.execStore.Spooled(ctx, 10)
		dead, _ := e.execStore.DeadLetters(ctx, "acme", 10)
		if i+1 < executor.DeadLetterAfter && (len(spooled) != 1 || len(dead) != 0) {
			t.Fatalf("after %d refused flushes: %d spooled, %d dead; want the row still spooled", i+1, len(spooled), len(dead))
		}
		if i+1 == executor.DeadLetterAfter && (len(spooled) != 0 || len(dead) != 1) {
			t.Fatalf("after the last try: %d spooled, %d dead; want it in the dead letter", len(spooled), len(dead))
		}
	}
	if n := deadLettered(t, reader); n != 1 {
		t.Fatalf("%s = %d, want 1", executor.MetricDeadLettered, n)
	}

	list := func(user, agent string) (*mandatev1.ListDeadLettersResponse, error) {
		return client.ListDeadLetters(as(token(t, "acme", user, agent)), &mandatev1.ListDeadLettersRequest{})
	}
	for _, who := range []struct{ user, agent string }{{"carol", "finance-bot"}, {"carol", ""}, {"owen", ""}} {
		if _, err := list(who.user, who.agent); refusal(err).GetCode() != "authorization.permission_denied" {
			t.Fatalf("%s/%s listed the dead letter: %v", who.user, who.agent, err)
		}
		_, err := client.RedriveDeadLetters(as(token(t, "acme", who.user, who.agent)), &mandatev1.RedriveDeadLettersRequest{All: true, Reason: "fixed"})
		if refusal(err).GetCode() != "authorization.permission_denied" {
			t.Fatalf("%s/%s re-drove the dead letter: %v", who.user, who.agent, err)
		}
	}
	resp, err := list("olive", "")
	if err != nil || len(resp.GetDeadLetters()) != 1 {
		t.Fatalf("the operator's listing: %v, %v", resp, err)
	}
	d := resp.GetDeadLetters()[0]
	if d.GetInvocationId() != inv || d.GetRecord().GetCommand() != "ticket.search" || d.GetRecord().GetOutcome() != "executed" || !strings.Contains(d.GetReason(), "the trail refuses this row") ||
		d.GetDeadAt() == nil || d.GetSpooledAt() == nil {
		t.Fatalf("dead letter %v", d)
	}
	for _, r := range e.rows(t, "acme", inv, 0) {
		if r.Phase == "outcome" {
			t.Fatalf("the refused row is in the trail: %+v", r)
		}
	}

	// Bad re-drives: neither ids nor all, both, a reason with a newline.
	for _, req := range []*mandatev1.RedriveDeadLettersRequest{
		{Reason: "fixed"}, {Ids: []int64{d.GetId()}, All: true, Reason: "fixed"}, {All: true, Reason: "fixed\nby: admin"},
	} {
		if _, err := client.RedriveDeadLetters(as(token(t, "acme", "olive", "")), req); refusal(err).GetCode() != "schema.invalid" {
			t.Fatalf("re-drive %v: %v, want schema.invalid", req, err)
		}
	}
	// globex's operator sees none of acme's rows and re-drives none.
	if _, err := directory.Apply(ctx, e.dir, []byte(operatorPolicy+`
  - id: initech
    features: [refunds]
    roles:
      ops: [audit.read, audit.resolve]
    users:
      - {id: ivan, org: ops, roles: [ops]}
`)); err != nil {
		t.Fatal(err)
	}
	other, err := client.ListDeadLetters(as(token(t, "initech", "ivan", "")), &mandatev1.ListDeadLettersRequest{})
	if err != nil || len(other.GetDeadLetters()) != 0 {
		t.Fatalf("another tenant's operator listed %v, %v", other, err)
	}
	if r, err := client.RedriveDeadLetters(as(token(t, "initech", "ivan", "")), &mandatev1.RedriveDeadLettersRequest{Ids: []int64{d.GetId()}, Reason: "mine now"}); err != nil || r.GetRedriven() != 0 {
		t.Fatalf("another tenant's operator re-drove acme's row: %v, %v", r, err)
	}

	// Fixed: the operator re-drives it and the next flush appends it.
	trail.set("ticket.search", false)
	r, err := client.RedriveDeadLetters(as(token(t, "acme", "olive", "")), &mandatev1.RedriveDeadLettersRequest{Ids: []int64{d.GetId()}, Reason: "the trail's validation was fixed"})
	if err != nil || r.GetRedriven() != 1 {
		t.Fatalf("re-drive: %v, %v", r, err)
	}
	if n, err := e.pipeline.FlushSpool(ctx); err != nil || n != 1 {
		t.Fatalf("the flush after the re-drive: %d, %v", n, err)
	}
	if rows := e.rows(t, "acme", inv, 2); len(rows) != 2 || rows[1].Phase != "outcome" || rows[1].Outcome != "executed" {
		t.Fatalf("the re-driven row in the trail: %+v", rows)
	}
	if resp, err := list("olive", ""); err != nil || len(resp.GetDeadLetters()) != 0 {
		t.Fatalf("the dead letter after the re-drive: %v, %v", resp, err)
	}
}

// deadLettered is the executor's dead-letter counter.
func deadLettered(t *testing.T, reader *metric.ManualReader) int64 {
	return counted(t, reader, executor.MetricDeadLettered, "")
}
