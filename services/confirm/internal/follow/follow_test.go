package follow

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/services/confirm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestHub(t *testing.T) {
	var h Hub
	a, b := h.Subscribe("c1"), h.Subscribe("c1")
	other := h.Subscribe("c2")
	ca, cb, co := a.C(), b.C(), other.C()
	h.Notify("c1")
	if !closed(ca) || !closed(cb) || closed(co) {
		t.Fatalf("Notify(c1): a %v b %v c2 %v", closed(ca), closed(cb), closed(co))
	}
	if closed(a.C()) {
		t.Fatal("the channel after a wake-up is already closed")
	}
	h.Notify("nobody") // no subscriber: nothing to do, nothing kept
	h.NotifyAll()
	if !closed(co) {
		t.Fatal("NotifyAll missed c2")
	}
	a.Close()
	if len(h.topics) != 2 {
		t.Fatalf("topics %d after one of two subscribers left, want 2", len(h.topics))
	}
	b.Close()
	other.Close()
	if len(h.topics) != 0 {
		t.Fatalf("topics %d after everyone left", len(h.topics))
	}
}

// TestRunRetriesAndStopsWhenDecided: a read that fails after a wake-up is
// retried; the loop sends the change and stops when the challenge is
// decided.
func TestRunRetriesAndStopsWhenDecided(t *testing.T) {
	var h Hub
	sub := h.Subscribe("c")
	first := confirm.Challenge{ID: "c", State: confirm.StatePending, ExpiresAt: time.Now().Add(time.Hour)}
	reads := make(chan confirm.Challenge, 4)
	errs := 1
	get := func(context.Context) (confirm.Challenge, error) {
		if errs > 0 {
			errs--
			return confirm.Challenge{}, confirm.Unavailable("test", nil)
		}
		return <-reads, nil
	}
	out := make(chan confirm.Challenge)
	done := make(chan struct{})
	go Run(context.Background(), done, out, first, sub, sub.C(), get, Options{RetryMin: time.Millisecond})
	if c := <-out; c.State != confirm.StatePending {
		t.Fatalf("first %s", c.State)
	}
	decided := first
	decided.State, decided.DecidedBy = confirm.StateApproved, "alice"
	reads <- decided
	h.Notify("c")
	if c := <-out; c.State != confirm.StateApproved {
		t.Fatalf("after the decision: %s", c.State)
	}
	if _, ok := <-out; ok {
		t.Fatal("Run went on after the decision")
	}
	if len(h.topics) != 0 {
		t.Fatal("Run did not close its subscription")
	}
}
