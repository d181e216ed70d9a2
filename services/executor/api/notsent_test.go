package api_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/executor"
)

// lateDispatcher holds each dispatch until its caller has gone (as an
// executor frozen mid-call resumes after the client's deadline), then hands
// it on with the dead context.
type lateDispatcher struct {
	executor.Dispatcher
	dispatched chan string
	// onTime hands dispatches on at once.
	onTime atomic.Bool
}

func (l *lateDispatcher) Dispatch(ctx context.Context, d executor.Dispatch) (executor.Reply, error) {
	if l.onTime.Load() {
		return l.Dispatcher.Dispatch(ctx, d)
	}
	<-ctx.Done()
	reply, err := l.Dispatcher.Dispatch(ctx, d)
	l.dispatched <- d.InvocationID
	return reply, err
}

// TestACallCancelledBeforeItWasSentIsNotExecuted (issue 31, item 6): a
// keyed call whose caller's deadline passed before it was dispatched is
// never sent — the executor knows it did not run — so its outcome is
// failed with handler.not_sent, its key is given back, and the retry with
// the same key runs, once; not a 500 handler.failed replayed for the key's
// life.
func TestACallCancelledBeforeItWasSentIsNotExecuted(t *testing.T) {
	eachStore(t, testACallCancelledBeforeItWasSentIsNotExecuted)
}

func testACallCancelledBeforeItWasSentIsNotExecuted(t *testing.T, st stores) {
	late := &lateDispatcher{dispatched: make(chan string, 1)}
	e := start(t, st, func(c *executor.Config) {
		late.Dispatcher = c.Dispatcher
		c.Dispatcher = late
	})
	ctx, cancel := context.WithTimeout(as(token(t, "acme", "alice", "")), 300*time.Millisecond)
	defer cancel()
	_, err := e.execute(t, ctx, "expense.report.create", createInput, withKey("gone-before-sent"))
	// The caller's own deadline usually fires first; on a loaded machine
	// the executor's answer — not sent, nothing run — can arrive before
	// the client's timer does. Either says the same.
	if status.Code(err) != codes.DeadlineExceeded && refusal(err).GetCode() != "handler.not_sent" {
		t.Fatalf("the caller whose deadline passed: %v (%v)", err, refusal(err))
	}
	inv := <-late.dispatched
	rows := e.rows(t, "acme", inv, 2)
	if last := rows[len(rows)-1]; last.Phase != audit.PhaseOutcome || last.Outcome != audit.OutcomeFailed || last.Code != "handler.not_sent" {
		t.Fatalf("the outcome of the call never sent: %s %s %s", last.Phase, last.Outcome, last.Code)
	}

	// The key was given back: the retry, on time, runs.
	late.onTime.Store(true)
	res, err := e.execute(t, as(token(t, "acme", "alice", "")), "expense.report.create", createInput, withKey("gone-before-sent"))
	if err != nil || res.GetReplayed() {
		t.Fatalf("the retry: %v (%v), replayed %v; want it to run", err, refusal(err), res.GetReplayed())
	}
}
