package edgelimit

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/identity"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// TestLimiterBucket: a key spends its burst, is then refused with the time
// until a token is back, spends nothing while refused, and passes again
// once that time has passed; another key is not affected.
func TestLimiterBucket(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	l := New(Config{Rate: 2, Burst: 3, Now: c.now})
	for i := range 3 {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	for range 5 {
		ok, retry := l.Allow("a")
		if ok || retry != 500*time.Millisecond {
			t.Fatalf("past the burst: ok %v, retry after %v; want refused, 500ms", ok, retry)
		}
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("another key was refused")
	}
	c.t = c.t.Add(500 * time.Millisecond)
	if ok, _ := l.Allow("a"); !ok {
		t.Fatal("refused once retry-after had passed: refusals spent tokens")
	}
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("a second request passed with one token back")
	}
}

// TestLimiterDisabled: rate 0 is no limiter; every request passes.
func TestLimiterDisabled(t *testing.T) {
	l := New(Config{Rate: 0, Burst: 1})
	if l != nil {
		t.Fatal("rate 0 built a limiter")
	}
	for range 1000 {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatal("a disabled limiter refused")
		}
	}
	if l.Keys() != 0 {
		t.Fatal("a disabled limiter tracks keys")
	}
}

// TestLimiterKeysBounded: however many keys ask, at most MaxKeys buckets
// are kept, the least recently used forgotten first.
func TestLimiterKeysBounded(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	l := New(Config{Rate: 1, Burst: 1, MaxKeys: 100, Now: c.now})
	l.Allow("kept")
	for i := range 10000 {
		l.Allow(fmt.Sprintf("k%d", i))
		if i%50 == 0 {
			l.Allow("kept") // recently used: never the one forgotten
		}
	}
	if n := l.Keys(); n != 100 {
		t.Fatalf("%d keys tracked, want 100", n)
	}
	if ok, _ := l.Allow("kept"); ok {
		t.Fatal("the recently used key was forgotten (its bucket was full again)")
	}
}

// TestAnonymousKeysBounded: addresses of any shape map to at most
// AnonymousShards keys, the same address always to the same one.
func TestAnonymousKeysBounded(t *testing.T) {
	seen := map[string]bool{}
	for range 20000 {
		addr := fmt.Sprintf("%d.%d.%d.%d:%d", rand.IntN(256), rand.IntN(256), rand.IntN(256), rand.IntN(256), rand.IntN(65536))
		seen[AnonymousKey(addr)] = true
	}
	seen[AnonymousKey("not an address \x00 at all")] = true
	if len(seen) > AnonymousShards {
		t.Fatalf("%d anonymous keys, want at most %d", len(seen), AnonymousShards)
	}
	if AnonymousKey("10.0.0.1:1") != AnonymousKey("10.0.0.1:2") {
		t.Fatal("one address, two ports: two keys")
	}
}

// TestKey: principals differing in tenant, user or agent get different
// keys; a service on its own authority is keyed by its name.
func TestKey(t *testing.T) {
	keys := map[string]bool{}
	for _, p := range []identity.Principal{
		{Tenant: "acme", UserID: "carol"},
		{Tenant: "acme", UserID: "carol", AgentID: "payout-bot"},
		{Tenant: "globex", UserID: "carol"},
		{Tenant: "acme", UserID: "alice"},
		{Kind: identity.KindService, ServiceName: "executor"},
	} {
		keys[Key(p)] = true
	}
	if len(keys) != 5 {
		t.Fatalf("%d distinct keys for 5 principals", len(keys))
	}
}
