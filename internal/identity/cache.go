package identity

import (
	"context"
	"crypto/sha256"
	"sync"
	"time"
)

// DefaultCacheSize is how many verified tokens a verifier remembers when
// its config leaves CacheSize zero. A governed call is verified by several
// services and each of them sees the same few tokens again and again, so a
// small cache answers nearly every check; the bound keeps a flood of
// distinct valid tokens from growing memory.
const DefaultCacheSize = 10_000

// tokenCache remembers the principals of tokens that verified, keyed by the
// SHA-256 of the raw token (a heap dump shows digests, never tokens). An
// entry answers only while its token's `exp` has not passed: the cache never
// stretches a token's life, and the leeway past `exp` is left to a full
// verification. Refusals are never cached, so a token refused for an
// unknown key verifies once the key set has it. The cache knows nothing of
// revocation: whether a user is disabled is the directory's answer, asked on
// every call by the executor. It is safe for concurrent use.
type tokenCache struct {
	max int

	mu      sync.RWMutex
	entries map[[sha256.Size]byte]cachedPrincipal
	gen     uint64 // bumped by reset, so a verification begun under old keys is not stored
}

type cachedPrincipal struct {
	p       Principal
	expires time.Time
}

// newTokenCache returns a cache of at most size entries; nil (no caching)
// when size is negative.
func newTokenCache(size int) *tokenCache {
	if size < 0 {
		return nil
	}
	if size == 0 {
		size = DefaultCacheSize
	}
	return &tokenCache{max: size, entries: make(map[[sha256.Size]byte]cachedPrincipal)}
}

// verify answers from the cache, or runs full and remembers what it
// returned. Tokens the checker would refuse before parsing (empty,
// oversized) go straight to full, so they are never even hashed.
func (c *tokenCache) verify(ctx context.Context, token string, chk *checker, full func(context.Context, string) (Principal, error)) (Principal, error) {
	if c == nil || token == "" || len(token) > chk.maxBytes {
		return full(ctx, token)
	}
	key := tokenDigest(token)
	p, gen, ok := c.get(key, chk.now())
	if ok {
		return p, nil
	}
	p, err := full(ctx, token)
	if err != nil {
		return Principal{}, err
	}
	c.put(key, p, p.ExpiresAt, gen)
	return p, nil
}

// tokenDigest hashes token, copying a token of usual size through a stack
// buffer rather than a heap allocation.
func tokenDigest(token string) [sha256.Size]byte {
	var buf [2048]byte
	if len(token) <= len(buf) {
		return sha256.Sum256(append(buf[:0], token...))
	}
	return sha256.Sum256([]byte(token))
}

// get returns the principal of a token verified before, if its `exp` is
// still ahead of now, and the generation to pass to put otherwise.
func (c *tokenCache) get(key [sha256.Size]byte, now time.Time) (Principal, uint64, bool) {
	if c == nil {
		return Principal{}, 0, false
	}
	c.mu.RLock()
	e, ok := c.entries[key]
	gen := c.gen
	c.mu.RUnlock()
	if ok && now.Before(e.expires) {
		return e.p, gen, true
	}
	return Principal{}, gen, false
}

// put remembers p until expires, unless the cache was reset since gen was
// read (the keys that verified the token may be gone). A full cache evicts
// one entry at random (Go randomises where a map iteration starts), which
// costs nothing to maintain and cannot be steered into a pathological order.
func (c *tokenCache) put(key [sha256.Size]byte, p Principal, expires time.Time, gen uint64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.max {
		for k := range c.entries {
			delete(c.entries, k)
			break
		}
	}
	c.entries[key] = cachedPrincipal{p: p, expires: expires}
}

// reset forgets every entry; the verifier calls it when its key set changes.
func (c *tokenCache) reset() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.entries)
	c.gen++
}

// len reports the number of entries, for tests.
func (c *tokenCache) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.entries)
}
