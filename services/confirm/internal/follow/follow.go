// Package follow is the watch machinery shared by the confirm stores: a
// [Hub] that wakes the watchers of a challenge when it changed, and [Run],
// the loop that re-reads a challenge on every wake-up (and at its expiry)
// and sends it until it is no longer pending. Watchers receive only a
// wake-up through the Hub and read the challenge from the store, so a lost
// or duplicated wake-up costs at most a poll interval or a read.
package follow

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/mandate-dev/mandate/services/confirm"
)

// Hub wakes waiters per key (challenge id). Its zero value is ready to use.
type Hub struct {
	mu    sync.Mutex
	chans map[string]chan struct{}
}

// Wait returns a channel that is closed at the next Notify(key) or
// NotifyAll. Take it before reading, so that a change between the read and
// the wait is not missed.
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

// NotifyAll wakes every waiter, e.g. after notifications may have been
// lost.
func (h *Hub) NotifyAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, ch := range h.chans {
		close(ch)
		delete(h.chans, k)
	}
}

// Options tunes [Run].
type Options struct {
	// Poll re-reads the challenge this often even without a wake-up, a
	// safety net for lost notifications. Zero disables polling.
	Poll time.Duration
	// Now is the clock the expiry timer is set by. Default time.Now.
	Now func() time.Time
	// RetryMin and RetryMax bound the backoff after a failed read. Defaults
	// 50ms and 5s.
	RetryMin, RetryMax time.Duration
	// Logger receives read failures. Default slog.Default().
	Logger *slog.Logger
}

// minWake keeps a challenge that is due to expire but not yet expired by
// the store's clock (a clock a little behind ours) from spinning.
const minWake = 20 * time.Millisecond

// Run sends first, then the challenge again whenever a read after a
// wake-up (wait), a poll or its expiry shows it changed, until it is no
// longer pending or ctx or done end; then it closes out. woken is the Hub
// channel taken before first was read.
func Run(ctx context.Context, done <-chan struct{}, out chan<- confirm.Challenge, first confirm.Challenge,
	woken <-chan struct{}, get func(context.Context) (confirm.Challenge, error), wait func() <-chan struct{}, opts Options) {
	defer close(out)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.RetryMin <= 0 {
		opts.RetryMin = 50 * time.Millisecond
	}
	if opts.RetryMax <= 0 {
		opts.RetryMax = 5 * time.Second
	}
	send := func(c confirm.Challenge) bool {
		select {
		case out <- c:
			return true
		case <-ctx.Done():
		case <-done:
		}
		return false
	}
	last := first
	if !send(last) || last.State != confirm.StatePending {
		return
	}
	backoff := time.Duration(0)
	for {
		d := max(last.ExpiresAt.Sub(opts.Now()), minWake)
		if opts.Poll > 0 && opts.Poll < d {
			d = opts.Poll
		}
		if backoff > 0 {
			d = min(d, backoff)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-done:
			t.Stop()
			return
		case <-woken:
			t.Stop()
		case <-t.C:
		}
		woken = wait()
		c, err := get(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, confirm.ErrNotFound) {
				return
			}
			backoff = min(max(2*backoff, opts.RetryMin), opts.RetryMax)
			opts.Logger.WarnContext(ctx, "confirm watch: reading the challenge failed; retrying",
				"challenge_id", last.ID, "error", err.Error(), "retry_in", backoff)
			continue
		}
		backoff = 0
		if changed(&c, &last) {
			if !send(c) {
				return
			}
			last = c
		}
		if last.State != confirm.StatePending {
			return
		}
	}
}

func changed(a, b *confirm.Challenge) bool {
	return a.State != b.State || a.DecidedBy != b.DecidedBy || a.DecisionChannel != b.DecisionChannel ||
		!a.DecidedAt.Equal(b.DecidedAt) || !a.RedeemedAt.Equal(b.RedeemedAt)
}
