package feed

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/mandate-dev/mandate/services/audit"
)

// Hub wakes waiters per key (tenant). Its zero value is ready to use.
type Hub struct {
	mu    sync.Mutex
	chans map[string]chan struct{}
}

// Wait returns a channel that is closed at the next Notify(key) or NotifyAll. Take it before
// reading, so that a commit between the read and the wait is not missed.
func (h *Hub) Wait(key string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.chans == nil {
		h.chans = map[string]chan struct{}{}
	}
	ch, ok := h.chans[key]
	if !ok {
		ch = make(chan struct{})
		h.chans[key] = ch
	}
	return ch
}

// Notify wakes the waiters of key.
func (h *Hub) Notify(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ch, ok := h.chans[key]; ok {
		close(ch)
		delete(h.chans, key)
	}
}

// NotifyAll wakes every waiter, e.g. after notifications may have been lost.
func (h *Hub) NotifyAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, ch := range h.chans {
		close(ch)
		delete(h.chans, k)
	}
}

// FetchFunc returns up to limit rows of the tenant with Seq > after, in Seq order.
type FetchFunc func(ctx context.Context, after int64, limit int) ([]audit.Stored, error)

// TailOptions tunes [Tail].
type TailOptions struct {
	// Batch is the fetch size. Default 256.
	Batch int
	// Poll is how often the store is read even without a wake-up (a safety net for lost
	// notifications). Zero disables polling.
	Poll time.Duration
	// RetryMin and RetryMax bound the backoff after a failed fetch. Defaults 50ms and 5s.
	RetryMin, RetryMax time.Duration
	// Logger receives fetch failures. Default slog.Default().
	Logger *slog.Logger
}

// Tail sends the rows after afterSeq on out, in order, until ctx or done ends; then it closes
// out. wait must return the Hub channel for the tenant. A failed fetch is retried with backoff:
// a watch survives the store being briefly unavailable.
func Tail(ctx context.Context, done <-chan struct{}, out chan<- audit.Stored, afterSeq int64,
	fetch FetchFunc, wait func() <-chan struct{}, opts TailOptions) {
	defer close(out)
	if opts.Batch <= 0 {
		opts.Batch = 256
	}
	if opts.RetryMin <= 0 {
		opts.RetryMin = 50 * time.Millisecond
	}
	if opts.RetryMax <= 0 {
		opts.RetryMax = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	backoff := opts.RetryMin
	next := afterSeq
	for {
		woken := wait()
		rows, err := fetch(ctx, next, opts.Batch)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			opts.Logger.WarnContext(ctx, "audit watch: reading new rows failed; retrying", "error", err, "retry_in", backoff)
			if !sleep(ctx, done, backoff) {
				return
			}
			backoff = min(2*backoff, opts.RetryMax)
			continue
		}
		backoff = opts.RetryMin
		for _, r := range rows {
			select {
			case out <- r:
				next = r.Seq
			case <-ctx.Done():
				return
			case <-done:
				return
			}
		}
		if len(rows) == opts.Batch {
			continue // more may be waiting
		}
		var poll <-chan time.Time
		var timer *time.Timer
		if opts.Poll > 0 {
			timer = time.NewTimer(opts.Poll)
			poll = timer.C
		}
		stopped := false
		select {
		case <-woken:
		case <-poll:
		case <-ctx.Done():
			stopped = true
		case <-done:
			stopped = true
		}
		if timer != nil {
			timer.Stop()
		}
		if stopped {
			return
		}
	}
}

func sleep(ctx context.Context, done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-done:
		return false
	}
}
