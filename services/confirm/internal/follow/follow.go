package follow

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/mandate-dev/mandate/services/confirm"
)

// Hub wakes the subscribers of a key (a challenge id). Its zero value is
// ready to use. Keys without subscribers cost nothing: notifications for
// them are dropped, and a key's state goes when its last subscriber leaves.
type Hub struct {
	mu     sync.Mutex
	topics map[string]*topic
}

type topic struct {
	ch   chan struct{} // closed and replaced by Notify
	subs int
}

// Sub is one subscription to a key.
type Sub struct {
	hub *Hub
	key string
	t   *topic
}

// Subscribe starts a subscription; Close ends it.
func (h *Hub) Subscribe(key string) *Sub {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.topics == nil {
		h.topics = map[string]*topic{}
	}
	t, ok := h.topics[key]
	if !ok {
		t = &topic{ch: make(chan struct{})}
		h.topics[key] = t
	}
	t.subs++
	return &Sub{hub: h, key: key, t: t}
}

// C returns a channel that is closed at the next Notify of the key (or
// NotifyAll). Take it before reading, so that a change between the read and
// the wait is not missed.
func (s *Sub) C() <-chan struct{} {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return s.t.ch
}

// Close ends the subscription.
func (s *Sub) Close() {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	s.t.subs--
	if s.t.subs == 0 && s.hub.topics[s.key] == s.t {
		delete(s.hub.topics, s.key)
	}
}

// Notify wakes the subscribers of key.
func (h *Hub) Notify(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if t, ok := h.topics[key]; ok {
		close(t.ch)
		t.ch = make(chan struct{})
	}
}

// NotifyAll wakes every subscriber, e.g. after notifications may have been
// lost.
func (h *Hub) NotifyAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range h.topics {
		close(t.ch)
		t.ch = make(chan struct{})
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
// wake-up of sub, a poll or its expiry shows it changed, until it is no
// longer pending or ctx or done end; then it closes out and sub. woken is
// sub's channel as taken before first was read.
func Run(ctx context.Context, done <-chan struct{}, out chan<- confirm.Challenge, first confirm.Challenge,
	sub *Sub, woken <-chan struct{}, get func(context.Context) (confirm.Challenge, error), opts Options) {
	defer close(out)
	defer sub.Close()
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
		woken = sub.C()
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
