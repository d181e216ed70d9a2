package directory

import (
	"context"
	"sync"
)

// Notifier fans changes out to the channels handed out by Watch. Store implementations use it
// to implement [Store.Watch]; its zero value is ready to use.
type Notifier struct {
	mu       sync.Mutex
	watchers map[*watcher]struct{}
}

type watcher struct {
	ctx context.Context
	ch  chan Change

	mu     sync.Mutex // serialises sends with the close in Watch's AfterFunc
	closed bool
}

// Watch registers a watcher; its channel is closed once ctx ends.
func (n *Notifier) Watch(ctx context.Context) <-chan Change {
	w := &watcher{ctx: ctx, ch: make(chan Change)}
	n.mu.Lock()
	if n.watchers == nil {
		n.watchers = map[*watcher]struct{}{}
	}
	n.watchers[w] = struct{}{}
	n.mu.Unlock()
	context.AfterFunc(ctx, func() {
		n.mu.Lock()
		delete(n.watchers, w)
		n.mu.Unlock()
		w.mu.Lock()
		w.closed = true
		close(w.ch)
		w.mu.Unlock()
	})
	return w.ch
}

// Publish delivers a Change for each tenant to every watcher and waits until each watcher has
// acknowledged it (or its context ended). It gives up when ctx ends. Call it after the change
// is committed and without holding locks that a watcher might need.
func (n *Notifier) Publish(ctx context.Context, tenants ...string) {
	n.mu.Lock()
	ws := make([]*watcher, 0, len(n.watchers))
	for w := range n.watchers {
		ws = append(ws, w)
	}
	n.mu.Unlock()
	for _, w := range ws {
		for _, tenant := range tenants {
			if !w.deliver(ctx, tenant) {
				break
			}
		}
	}
}

// deliver sends one change and waits for its ack; false when the watcher or ctx is done.
func (w *watcher) deliver(ctx context.Context, tenant string) bool {
	acked := make(chan struct{})
	var once sync.Once
	c := Change{Tenant: tenant, ack: func() { once.Do(func() { close(acked) }) }}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return false
	}
	select {
	case w.ch <- c:
	case <-w.ctx.Done():
		w.mu.Unlock()
		return false
	case <-ctx.Done():
		w.mu.Unlock()
		return false
	}
	w.mu.Unlock()
	select {
	case <-acked:
		return true
	case <-w.ctx.Done():
	case <-ctx.Done():
	}
	return false
}
