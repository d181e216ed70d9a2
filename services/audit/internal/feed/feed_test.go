package feed_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/internal/feed"
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
	var h feed.Hub
	a, b := h.Wait("a"), h.Wait("b")
	if a != h.Wait("a") {
		t.Fatal("two waits on one key before a notify got different channels")
	}
	h.Notify("a")
	if !closed(a) || closed(b) {
		t.Fatalf("after Notify(a): a closed=%v b closed=%v", closed(a), closed(b))
	}
	if a2 := h.Wait("a"); closed(a2) {
		t.Fatal("a wait after the notify is already closed")
	}
	h.Notify("nobody") // no waiters: no effect, no panic
	h.NotifyAll()
	if !closed(b) {
		t.Fatal("NotifyAll did not wake b")
	}
}

// log is a growing list of rows guarded by a mutex, with a hub to wake the tail.
type log struct {
	mu   sync.Mutex
	rows []audit.Stored
	hub  feed.Hub
	fail int // fail this many fetches
}

func (l *log) add(n int) {
	l.mu.Lock()
	for range n {
		l.rows = append(l.rows, audit.Stored{Seq: int64(len(l.rows) + 1)})
	}
	l.mu.Unlock()
	l.hub.Notify("t")
}

func (l *log) fetch(_ context.Context, after int64, limit int) ([]audit.Stored, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail > 0 {
		l.fail--
		return nil, errors.New("store down")
	}
	if after >= int64(len(l.rows)) {
		return nil, nil
	}
	return append([]audit.Stored(nil), l.rows[after:min(int64(len(l.rows)), after+int64(limit))]...), nil
}

func TestTail(t *testing.T) {
	tests := []struct {
		name  string
		after int64
		fail  int
		poll  time.Duration
	}{
		{"from the start", 0, 0, 0},
		{"after a seq", 5, 0, 0},
		{"survives failing fetches", 0, 3, 0},
		{"with polling", 2, 0, 10 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &log{fail: tt.fail}
			l.add(10)
			ctx, cancel := context.WithCancel(context.Background())
			out := make(chan audit.Stored)
			done := make(chan struct{})
			go func() {
				feed.Tail(ctx, nil, out, tt.after, l.fetch, func() <-chan struct{} { return l.hub.Wait("t") },
					feed.TailOptions{Batch: 3, Poll: tt.poll, RetryMin: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
				close(done)
			}()
			want := tt.after + 1
			recv := func(until int64) {
				for ; want <= until; want++ {
					select {
					case r := <-out:
						if r.Seq != want {
							t.Fatalf("got seq %d, want %d", r.Seq, want)
						}
					case <-time.After(5 * time.Second):
						t.Fatalf("no seq %d", want)
					}
				}
			}
			recv(10)
			l.add(7) // live rows wake the tail
			recv(17)
			cancel()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Tail did not return after its context ended")
			}
			if _, ok := <-out; ok {
				t.Fatal("out not closed")
			}
		})
	}
	t.Run("done channel ends it", func(t *testing.T) {
		l := &log{}
		stop := make(chan struct{})
		out := make(chan audit.Stored)
		finished := make(chan struct{})
		go func() {
			feed.Tail(context.Background(), stop, out, 0, l.fetch, func() <-chan struct{} { return l.hub.Wait("t") }, feed.TailOptions{})
			close(finished)
		}()
		close(stop)
		select {
		case <-finished:
		case <-time.After(5 * time.Second):
			t.Fatal("Tail did not return after done closed")
		}
	})
}
