package api_test

import (
	"context"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/services/executor"
)

// slowDispatcher delays every dispatch before handing it on.
type slowDispatcher struct {
	executor.Dispatcher
	delay time.Duration
}

func (s slowDispatcher) Dispatch(ctx context.Context, d executor.Dispatch) (executor.Reply, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return executor.Reply{}, ctx.Err()
	}
	return s.Dispatcher.Dispatch(ctx, d)
}

// TestALiveCallKeepsItsKey: a keyed call that runs four times as long as
// the idempotency lease keeps its key — the executor renews the claim —
// so a retry while it runs is told it is in flight (it neither takes the
// key over nor asks the receipt, which would fence the running call), and
// the retry after it replays its one effect.
func TestALiveCallKeepsItsKey(t *testing.T) { eachStore(t, testALiveCallKeepsItsKey) }

func testALiveCallKeepsItsKey(t *testing.T, st stores) {
	const lease = 300 * time.Millisecond
	e := start(t, st, func(c *executor.Config) {
		c.Lease = lease
		c.Dispatcher = slowDispatcher{Dispatcher: c.Dispatcher, delay: 4 * lease}
	})
	alice := as(token(t, "acme", "alice", ""))
	type answer struct {
		report string
		err    error
	}
	first := make(chan answer, 1)
	go func() {
		res, err := e.execute(t, alice, "expense.report.create", createInput, withKey("long-call"))
		first <- answer{res.GetResult().GetFields()["report_id"].GetStringValue(), err}
	}()
	time.Sleep(2 * lease) // the claim's first lease has run out; renewed, it holds
	_, err := e.execute(t, alice, "expense.report.create", createInput, withKey("long-call"))
	if ce := refusal(err); ce.GetCode() != "idempotency.in_flight" {
		t.Fatalf("a retry while the call runs: %v (%v), want idempotency.in_flight", err, ce)
	}
	done := <-first
	if done.err != nil || done.report == "" {
		t.Fatalf("the long call: %v (%v)", done.err, refusal(done.err))
	}
	res, err := e.execute(t, alice, "expense.report.create", createInput, withKey("long-call"))
	if err != nil || !res.GetReplayed() || res.GetResult().GetFields()["report_id"].GetStringValue() != done.report {
		t.Fatalf("the retry after the call: %v (replayed %v, %v), want the replay of %s", err, res.GetReplayed(), res.GetResult(), done.report)
	}
}
