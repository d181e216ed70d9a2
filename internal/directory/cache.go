package directory

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// CacheOptions tunes a Cache. Zero fields take the defaults documented on each field.
type CacheOptions struct {
	// TTL bounds how long a resolution is served from memory. Changes announced by the store
	// drop entries at once; the TTL only limits staleness when an announcement is lost (for
	// example while the store's notification connection is down). Default 30s.
	TTL time.Duration
	// MaxEntries bounds the number of cached principals; beyond it an arbitrary entry is
	// evicted. Default 100000.
	MaxEntries int
	// OnInvalidate, when set, is called after the entries of a tenant ("" for all tenants) were
	// dropped in response to a change, before the change is acknowledged to the store (a
	// memory store's write returns after that). It must not block.
	OnInvalidate func(tenant string)
	// Now replaces time.Now, for tests.
	Now func() time.Time
}

// CacheStats counts what a Cache did.
type CacheStats struct {
	// Hits are resolutions answered from memory.
	Hits uint64
	// Misses are resolutions that went to the store.
	Misses uint64
	// Invalidations are changes received from the store.
	Invalidations uint64
}

// Cache is a Resolver that remembers resolutions per principal for a TTL and forgets all of a
// tenant's entries as soon as the store announces a change to that tenant. Inactive resolutions
// are cached too; errors are not.
type Cache struct {
	store Store
	opts  CacheOptions

	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	watching bool                           // false once the store's change stream ended
	entries  map[string]map[principal]entry // by tenant
	gens     map[string]uint64              // per-tenant generation, bumped on invalidation
	epoch    uint64                         // bumped when all tenants are invalidated
	size     int

	hits, misses, invalidations atomic.Uint64
}

type principal struct{ user, agent string }

type entry struct {
	res     Resolution
	expires time.Time
}

// NewCache wraps s and starts watching it for changes. Call Close to stop.
func NewCache(s Store, opts CacheOptions) *Cache {
	if opts.TTL <= 0 {
		opts.TTL = 30 * time.Second
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = 100_000
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Cache{
		store:    s,
		opts:     opts,
		cancel:   cancel,
		done:     make(chan struct{}),
		watching: true,
		entries:  map[string]map[principal]entry{},
		gens:     map[string]uint64{},
	}
	changes := s.Watch(ctx)
	go c.watch(changes)
	return c
}

func (c *Cache) watch(changes <-chan Change) {
	defer close(c.done)
	for ch := range changes {
		c.invalidate(ch.Tenant)
		// Told before the change is acknowledged, so that by the time the
		// store's write returns, whoever listens (the catalog's tool-list
		// notifications) has been told too.
		if c.opts.OnInvalidate != nil {
			c.opts.OnInvalidate(ch.Tenant)
		}
		ch.Ack()
	}
	// Without a change stream the cache could serve stale answers until the TTL; stop caching.
	c.mu.Lock()
	c.watching = false
	c.entries = map[string]map[principal]entry{}
	c.size = 0
	c.mu.Unlock()
}

func (c *Cache) invalidate(tenant string) {
	c.invalidations.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if tenant == "" {
		c.epoch++
		c.entries = map[string]map[principal]entry{}
		c.size = 0
		return
	}
	c.gens[tenant]++
	c.size -= len(c.entries[tenant])
	delete(c.entries, tenant)
}

// Resolve answers from memory when it can and from the store otherwise; see [Resolve] for the
// rules. The returned slices and maps (Limits) belong to the caller.
func (c *Cache) Resolve(ctx context.Context, tenant, userID, agentID string) (Resolution, error) {
	key := principal{userID, agentID}
	now := c.opts.Now()
	c.mu.Lock()
	if e, ok := c.entries[tenant][key]; ok && now.Before(e.expires) {
		c.mu.Unlock()
		c.hits.Add(1)
		return e.res.clone(), nil
	}
	gen, epoch, watching := c.gens[tenant], c.epoch, c.watching
	c.mu.Unlock()

	c.misses.Add(1)
	res, err := Resolve(ctx, c.store, tenant, userID, agentID)
	if err != nil || !watching {
		return res, err
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	// A change announced while the store was being read may have been missed by that read;
	// keeping the answer would then pin stale data.
	if c.gens[tenant] != gen || c.epoch != epoch || !c.watching {
		return res, nil
	}
	byTenant := c.entries[tenant]
	if byTenant == nil {
		byTenant = map[principal]entry{}
		c.entries[tenant] = byTenant
	}
	if _, exists := byTenant[key]; !exists {
		if c.size >= c.opts.MaxEntries {
			c.evictOne()
		}
		c.size++
	}
	byTenant[key] = entry{res: res.clone(), expires: now.Add(c.opts.TTL)}
	return res, nil
}

// evictOne drops an arbitrary entry (Go map iteration order is randomised).
func (c *Cache) evictOne() {
	for t, m := range c.entries {
		for k := range m {
			delete(m, k)
			c.size--
			if len(m) == 0 {
				delete(c.entries, t)
			}
			return
		}
	}
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats {
	return CacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Invalidations: c.invalidations.Load()}
}

// Close stops watching the store and waits for the watching goroutine to end. The Cache keeps
// answering afterwards, straight from the store.
func (c *Cache) Close() {
	c.cancel()
	<-c.done
}
