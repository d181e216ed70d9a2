package edgelimit

import (
	"container/list"
	"hash/fnv"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/mandate-dev/mandate/internal/identity"
)

// Defaults of Config.
const (
	// DefaultRate is the requests per second one principal may make at an
	// edge, sustained.
	DefaultRate = 50
	// DefaultBurst is how many requests one principal may make at once.
	DefaultBurst = 100
	// DefaultMaxKeys bounds the buckets a Limiter tracks.
	DefaultMaxKeys = 10000
	// AnonymousShards is how many buckets requests whose credentials do
	// not verify share between them.
	AnonymousShards = 64
)

// Config configures a Limiter.
type Config struct {
	// Rate is the sustained requests per second of one key; 0 disables the
	// limiter (every request passes).
	Rate float64
	// Burst is how many requests one key may make at once (default
	// DefaultBurst, and at least 1).
	Burst int
	// MaxKeys bounds the buckets tracked at once (default DefaultMaxKeys).
	MaxKeys int
	// Now reads the clock (default time.Now).
	Now func() time.Time
}

// Limiter is a token bucket per key with a bounded number of keys. It is
// safe for concurrent use; the zero of *Limiter (nil) lets every request
// pass.
type Limiter struct {
	limit   rate.Limit
	burst   int
	maxKeys int
	now     func() time.Time

	mu   sync.Mutex
	keys map[string]*list.Element // of *bucket
	lru  list.List                // most recently used first
}

type bucket struct {
	key string
	lim *rate.Limiter
}

// New returns a Limiter, or nil when c.Rate is 0 (disabled).
func New(c Config) *Limiter {
	if c.Rate <= 0 {
		return nil
	}
	if c.Burst <= 0 {
		c.Burst = DefaultBurst
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = DefaultMaxKeys
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Limiter{limit: rate.Limit(c.Rate), burst: c.Burst, maxKeys: c.MaxKeys, now: c.Now, keys: map[string]*list.Element{}}
}

// Allow takes one token from key's bucket. When there is none it reports
// false and how long until one is back.
func (l *Limiter) Allow(key string) (ok bool, retryAfter time.Duration) {
	if l == nil {
		return true, 0
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucketLocked(key)
	if b.lim.AllowN(now, 1) {
		return true, 0
	}
	// A refused request spends nothing: the token it lacks comes back at
	// the bucket's rate.
	missing := 1 - b.lim.TokensAt(now)
	return false, time.Duration(missing / float64(l.limit) * float64(time.Second))
}

// bucketLocked finds or makes key's bucket, most recently used now,
// forgetting the least recently used one past MaxKeys.
func (l *Limiter) bucketLocked(key string) *bucket {
	if e, ok := l.keys[key]; ok {
		l.lru.MoveToFront(e)
		return e.Value.(*bucket)
	}
	if l.lru.Len() >= l.maxKeys {
		oldest := l.lru.Back()
		l.lru.Remove(oldest)
		delete(l.keys, oldest.Value.(*bucket).key)
	}
	b := &bucket{key: key, lim: rate.NewLimiter(l.limit, l.burst)}
	l.keys[key] = l.lru.PushFront(b)
	return b
}

// Keys is how many buckets the limiter tracks now (at most MaxKeys).
func (l *Limiter) Keys() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lru.Len()
}

// Key is the bucket key of an authenticated principal: its tenant, user
// and agent (the issuer too, so that two identity providers' subjects
// never share a bucket); a service acting on its own authority is keyed by
// its name.
func Key(p identity.Principal) string {
	if p.UserID == "" && p.ServiceName != "" {
		return "service\x00" + p.ServiceName
	}
	return "principal\x00" + p.Issuer + "\x00" + p.Tenant + "\x00" + p.UserID + "\x00" + p.AgentID
}

// AnonymousKey is the bucket key of a request whose credentials did not
// verify: one of AnonymousShards, by a hash of the client's IP address
// (remoteAddr as net/http gives it). Headers never choose it.
func AnonymousKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(host))
	return "anonymous\x00" + strconv.Itoa(int(h.Sum32()%AnonymousShards))
}
