package catalog

import (
	"context"
	"slices"
	"sync"

	"github.com/mandate-dev/mandate/internal/identity"
)

// EventKind says why an Event was sent.
type EventKind int

const (
	// EventSnapshot is the first event of a stream: the set as it is now.
	EventSnapshot EventKind = iota + 1
	// EventChanged says the set differs from the previous event's.
	EventChanged
)

// Event is a principal's tool set at one moment.
type Event struct {
	// Kind is snapshot or change.
	Kind EventKind
	// Set is the whole set.
	Set ToolSet
	// Added and Removed are the tool names that appeared and disappeared
	// since the previous event, sorted; empty for a snapshot.
	Added, Removed []string
}

// Watch calls send with p's current tool set, then again each time a
// directory change of p's tenant alters it, until ctx ends (nil) or send or
// the directory fails (that error). Changes are coalesced: a burst of
// directory writes yields at most one event per difference observed, and
// the set sent is always read after the last change that woke the stream.
// send runs on the caller's goroutine and may block; it never holds up the
// directory's writers.
func (c *Catalog) Watch(ctx context.Context, p identity.Principal, send func(Event) error) error {
	// Subscribed before the snapshot is read, so that no change falls
	// between the two.
	wake, unsubscribe := c.hub.subscribe(p.Tenant)
	defer unsubscribe()
	cur, err := c.Tools(ctx, p)
	if err != nil {
		return err
	}
	if err := send(Event{Kind: EventSnapshot, Set: cur}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		}
		next, err := c.Tools(ctx, p)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		added, removed := diff(cur.Names(), next.Names())
		if len(added) == 0 && len(removed) == 0 {
			continue
		}
		if err := send(Event{Kind: EventChanged, Set: next, Added: added, Removed: removed}); err != nil {
			return err
		}
		cur = next
	}
}

// diff returns the names only in next (added) and only in prev (removed);
// both inputs are sorted.
func diff(prev, next []string) (added, removed []string) {
	for _, n := range next {
		if _, found := slices.BinarySearch(prev, n); !found {
			added = append(added, n)
		}
	}
	for _, n := range prev {
		if _, found := slices.BinarySearch(next, n); !found {
			removed = append(removed, n)
		}
	}
	return added, removed
}

// hub wakes the Watch streams of a tenant. A stream's channel holds at most
// one pending wake-up, so notify never blocks: it runs on the directory
// cache's watching goroutine, right after the tenant's entries were dropped.
type hub struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{} // by tenant
}

func newHub() *hub { return &hub{subs: map[string]map[chan struct{}]struct{}{}} }

func (h *hub) subscribe(tenant string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.subs[tenant] == nil {
		h.subs[tenant] = map[chan struct{}]struct{}{}
	}
	h.subs[tenant][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs[tenant], ch)
		if len(h.subs[tenant]) == 0 {
			delete(h.subs, tenant)
		}
		h.mu.Unlock()
	}
}

// notify wakes the streams of tenant, or every stream for "" (the directory
// could not say what changed).
func (h *hub) notify(tenant string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for t, subs := range h.subs {
		if tenant != "" && t != tenant {
			continue
		}
		for ch := range subs {
			select {
			case ch <- struct{}{}:
			default: // a wake-up is already pending
			}
		}
	}
}
