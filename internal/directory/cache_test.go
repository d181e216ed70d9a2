package directory_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/directory/directorytest"
	"github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

var ctx = context.Background()

func seeded(t testing.TB) *memory.Store {
	t.Helper()
	st := memory.New()
	if _, err := directory.Apply(ctx, st, []byte(directorytest.Seed)); err != nil {
		t.Fatal(err)
	}
	return st
}

// countingStore counts lookups and can hold one lookup until released.
type countingStore struct {
	directory.Store
	lookups atomic.Int32
	hold    chan chan struct{} // when non-nil, each Lookup hands over a release channel first
}

func (c *countingStore) Lookup(ctx context.Context, tenant, user, agent string) (directory.Facts, error) {
	c.lookups.Add(1)
	f, err := c.Store.Lookup(ctx, tenant, user, agent)
	if c.hold != nil {
		release := make(chan struct{})
		c.hold <- release
		<-release
	}
	return f, err
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestCacheServesFromMemoryUntilTTL(t *testing.T) {
	st := &countingStore{Store: seeded(t)}
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	c := directory.NewCache(st, directory.CacheOptions{TTL: time.Minute, Now: clock.Now})
	defer c.Close()

	for range 3 {
		if r, err := c.Resolve(ctx, "acme", "alice", "support-bot"); err != nil || !r.Active {
			t.Fatalf("%+v, %v", r, err)
		}
	}
	if n := st.lookups.Load(); n != 1 {
		t.Fatalf("%d lookups for three calls, want 1", n)
	}
	clock.Add(59 * time.Second)
	_, _ = c.Resolve(ctx, "acme", "alice", "support-bot")
	if n := st.lookups.Load(); n != 1 {
		t.Fatalf("%d lookups before the TTL, want 1", n)
	}
	clock.Add(2 * time.Second)
	_, _ = c.Resolve(ctx, "acme", "alice", "support-bot")
	if n := st.lookups.Load(); n != 2 {
		t.Fatalf("%d lookups after the TTL, want 2", n)
	}
	if s := c.Stats(); s.Hits != 3 || s.Misses != 2 {
		t.Fatalf("stats = %+v, want 3 hits and 2 misses", s)
	}
}

func TestCacheDropsOnlyTheChangedTenant(t *testing.T) {
	mem := seeded(t)
	st := &countingStore{Store: mem}
	var invalidated []string
	var mu sync.Mutex
	c := directory.NewCache(st, directory.CacheOptions{TTL: time.Hour, OnInvalidate: func(tenant string) {
		mu.Lock()
		invalidated = append(invalidated, tenant)
		mu.Unlock()
	}})
	defer c.Close()
	_, _ = c.Resolve(ctx, "acme", "alice", "")
	_, _ = c.Resolve(ctx, "globex", "alice", "")
	if err := directory.SetUserDisabled(ctx, mem, "globex", "alice", true); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := invalidated
	mu.Unlock()
	if len(got) != 1 || got[0] != "globex" {
		t.Fatalf("invalidated %v by the time Update returned, want [globex]", got)
	}
	before := st.lookups.Load()
	if r, _ := c.Resolve(ctx, "acme", "alice", ""); !r.Active {
		t.Fatal("acme/alice inactive")
	}
	if r, _ := c.Resolve(ctx, "globex", "alice", ""); r.Active {
		t.Fatal("globex/alice still active")
	}
	if n := st.lookups.Load() - before; n != 1 {
		t.Fatalf("%d lookups, want 1 (acme stays cached, globex is re-read)", n)
	}
}

// A change announced while a lookup is in flight must not let that lookup's (possibly stale)
// answer into the cache.
func TestCacheDiscardsAnswersOverlappingAChange(t *testing.T) {
	mem := seeded(t)
	st := &countingStore{Store: mem, hold: make(chan chan struct{})}
	c := directory.NewCache(st, directory.CacheOptions{TTL: time.Hour})
	defer c.Close()

	done := make(chan directory.Resolution)
	go func() {
		r, _ := c.Resolve(ctx, "acme", "alice", "")
		done <- r
	}()
	release := <-st.hold // the lookup has read alice as active
	if err := directory.SetUserDisabled(ctx, mem, "acme", "alice", true); err != nil {
		t.Fatal(err)
	}
	close(release)
	if r := <-done; !r.Active {
		t.Fatal("the in-flight lookup should return what it read")
	}
	st.hold = nil
	r, _ := c.Resolve(ctx, "acme", "alice", "")
	if r.Active {
		t.Fatal("the stale answer was cached")
	}
}

func TestCacheBoundsEntries(t *testing.T) {
	st := &countingStore{Store: seeded(t)}
	c := directory.NewCache(st, directory.CacheOptions{TTL: time.Hour, MaxEntries: 2})
	defer c.Close()
	for _, u := range []string{"alice", "bob", "dave"} {
		_, _ = c.Resolve(ctx, "acme", u, "")
	}
	before := st.lookups.Load()
	for _, u := range []string{"alice", "bob", "dave"} {
		_, _ = c.Resolve(ctx, "acme", u, "")
	}
	if n := st.lookups.Load() - before; n < 1 {
		t.Fatalf("three principals fit in a cache of two: %d lookups on the second pass", n)
	}
}

// closingStore closes its watch channel right away, as a store that shut down would.
type closingStore struct{ directory.Store }

func (closingStore) Watch(context.Context) <-chan directory.Change {
	ch := make(chan directory.Change)
	close(ch)
	return ch
}

func TestCacheStopsCachingWithoutChangeStream(t *testing.T) {
	st := &countingStore{Store: closingStore{seeded(t)}}
	c := directory.NewCache(st, directory.CacheOptions{TTL: time.Hour})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		before := st.lookups.Load()
		_, _ = c.Resolve(ctx, "acme", "alice", "")
		_, _ = c.Resolve(ctx, "acme", "alice", "")
		if st.lookups.Load()-before == 2 {
			return // both calls went to the store
		}
		if time.Now().After(deadline) {
			t.Fatal("the cache still serves from memory although it cannot hear about changes")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCacheAfterClose(t *testing.T) {
	st := seeded(t)
	c := directory.NewCache(st, directory.CacheOptions{})
	c.Close()
	if r, err := c.Resolve(ctx, "acme", "alice", ""); err != nil || !r.Active {
		t.Fatalf("%+v, %v", r, err)
	}
	// The store's writers do not wait for a closed cache.
	done := make(chan error)
	go func() { done <- directory.SetUserDisabled(ctx, st, "acme", "alice", true) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Update blocked on a closed cache")
	}
	if r, _ := c.Resolve(ctx, "acme", "alice", ""); r.Active {
		t.Fatal("a closed cache served a stale answer")
	}
}

func TestNotifierWatcherLeaving(t *testing.T) {
	var n directory.Notifier
	wctx, cancel := context.WithCancel(ctx)
	ch := n.Watch(wctx)
	got := make(chan string, 1)
	go func() {
		for c := range ch {
			got <- c.Tenant
			c.Ack()
		}
		close(got)
	}()
	n.Publish(ctx, "acme")
	if g := <-got; g != "acme" {
		t.Fatalf("got %q", g)
	}
	cancel()
	if _, open := <-got; open {
		t.Fatal("channel not closed after the watcher's context ended")
	}
	n.Publish(ctx, "acme") // no watcher: must not block
}

func TestNotifierDoesNotWaitForCanceledWatcher(t *testing.T) {
	var n directory.Notifier
	wctx, cancel := context.WithCancel(ctx)
	_ = n.Watch(wctx) // nobody reads it
	done := make(chan struct{})
	go func() { n.Publish(ctx, "acme"); close(done) }()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Publish blocked on a watcher whose context ended")
	}
}
