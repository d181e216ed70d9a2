package identity

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/mandate-dev/mandate/internal/failure"
)

// clock is a settable time source for verifiers under test.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.now = t }

func newCachingVerifier(tb testing.TB, now func() time.Time, size int) *Verifier {
	tb.Helper()
	v, err := NewVerifier(context.Background(), Config{
		Audience:  []string{testAudience},
		Issuers:   []string{testIssuer},
		DevSecret: devSecret,
		Now:       now,
		CacheSize: size,
	})
	must(tb, err)
	return v
}

// TestCachedTokenExpires walks one token through its life: the cache
// answers before `exp`, the full check (with its leeway) after it, and the
// token is refused once the leeway is spent, cached or not.
func TestCachedTokenExpires(t *testing.T) {
	clk := &clock{now: testNow}
	v := newCachingVerifier(t, clk.Now, 0)
	tok := signHS(t, devSecret, userClaims()) // exp = testNow + 1h
	exp := testNow.Add(time.Hour)

	steps := []struct {
		name    string
		at      time.Time
		code    string
		entries int
	}{
		{"first verification fills the cache", testNow, "", 1},
		{"a minute before exp the cache answers", exp.Add(-time.Minute), "", 1},
		{"past exp but within the leeway the full check accepts", exp.Add(DefaultLeeway / 2), "", 1},
		{"past exp and the leeway the token is refused", exp.Add(DefaultLeeway + time.Second), failure.CodeAuthenticationTokenExpired, 1},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			clk.set(st.at)
			p, err := v.Verify(context.Background(), tok)
			if got := ErrorCode(err); got != st.code {
				t.Fatalf("code = %q (err %v), want %q", got, err, st.code)
			}
			if err == nil && (p.UserID != "u-42" || p.Tenant != testTenant || !p.ExpiresAt.Equal(exp)) {
				t.Errorf("principal = %+v", p)
			}
			if got := v.cache.len(); got != st.entries {
				t.Errorf("cache entries = %d, want %d", got, st.entries)
			}
		})
	}
}

// TestCacheKeysOnTheWholeToken checks that a cached token vouches for no
// other: a different token is verified on its own, and a forgery that
// shares every claim with a cached token is refused and not remembered.
func TestCacheKeysOnTheWholeToken(t *testing.T) {
	v := newCachingVerifier(t, fixedNow, 0)
	ctx := context.Background()
	good := signHS(t, devSecret, userClaims())
	if _, err := v.Verify(ctx, good); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		token   string
		code    string
		user    string
		entries int
	}{
		{"same token is answered from the cache", good, "", "u-42", 1},
		{"another user's token is verified and cached", signHS(t, devSecret, with(userClaims(), "sub", "u-7")), "", "u-7", 2},
		{"same claims, wrong key: refused, not cached", signHS(t, []byte("another-secret-0123456789abcdef-0123"), userClaims()), failure.CodeAuthenticationInvalidToken, "", 2},
		{"same claims, other audience: refused, not cached", signHS(t, devSecret, with(userClaims(), "aud", []string{"elsewhere"})), failure.CodeAuthenticationWrongAudience, "", 2},
		{"tampered signature: refused", good[:len(good)-2] + "AA", failure.CodeAuthenticationInvalidToken, "", 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := v.Verify(ctx, tc.token)
			if got := ErrorCode(err); got != tc.code {
				t.Fatalf("code = %q (err %v), want %q", got, err, tc.code)
			}
			if p.UserID != tc.user {
				t.Errorf("user = %q, want %q", p.UserID, tc.user)
			}
			if got := v.cache.len(); got != tc.entries {
				t.Errorf("cache entries = %d, want %d", got, tc.entries)
			}
		})
	}
}

func TestCacheIsBounded(t *testing.T) {
	const size = 4
	v := newCachingVerifier(t, fixedNow, size)
	ctx := context.Background()
	for i := range 50 {
		tok := signHS(t, devSecret, with(userClaims(), "sub", fmt.Sprintf("u-%d", i)))
		p, err := v.Verify(ctx, tok)
		if err != nil || p.UserID != fmt.Sprintf("u-%d", i) {
			t.Fatalf("token %d: principal %+v, err %v", i, p, err)
		}
		if got := v.cache.len(); got > size {
			t.Fatalf("after %d tokens the cache holds %d entries, bound is %d", i+1, got, size)
		}
	}
	if got := v.cache.len(); got != size {
		t.Errorf("cache entries = %d, want %d (full)", got, size)
	}
}

func TestCacheOff(t *testing.T) {
	v := newCachingVerifier(t, fixedNow, -1)
	if v.cache != nil {
		t.Fatal("CacheSize -1 should turn the cache off")
	}
	if _, err := v.Verify(context.Background(), signHS(t, devSecret, userClaims())); err != nil {
		t.Fatal(err)
	}
}

// TestKeyRefreshDropsCache removes a key from the issuer's set: as long as
// the verifier has not refetched, the old key still verifies (as it did
// before the cache); the refetch that brings the new key drops every cached
// verdict, so a token signed with the removed key is refused at once.
func TestKeyRefreshDropsCache(t *testing.T) {
	k := getKeys(t)
	iss := newFakeIssuer(t, publicJWKS(t, jose.JSONWebKey{Key: k.rsa, KeyID: k.rsaKid, Use: "sig"}))
	clk := &clock{now: testNow}
	v, err := NewVerifier(t.Context(), iss.config(clk.Now))
	must(t, err)
	claims := func() map[string]any { return with(userClaims(), "iss", iss.srv.URL) }
	rsaTok := sign(t, jose.RS256, k.rsa, k.rsaKid, claims())
	edTok := sign(t, jose.EdDSA, k.ed, k.edKid, claims())

	steps := []struct {
		name    string
		advance time.Duration
		serve   []byte
		token   string
		code    string
		entries int
	}{
		{"RS256 token verified and cached", 0, nil, rsaTok, "", 1},
		{"issuer rotates to Ed25519; not refetched yet, cache answers", 0, publicJWKS(t, jose.JSONWebKey{Key: k.ed, KeyID: k.edKid, Use: "sig"}), rsaTok, "", 1},
		// The Ed25519 verdict is not stored either: its verification began
		// before the refresh it caused (see TestCacheResetDiscardsInFlight).
		{"new kid a minute later refetches and drops the cache", 61 * time.Second, nil, edTok, "", 0},
		{"token of the removed key is refused", 0, nil, rsaTok, failure.CodeAuthenticationUnknownKey, 0},
		{"token of the new key is cached from now on", 0, nil, edTok, "", 1},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			clk.set(clk.Now().Add(st.advance))
			if st.serve != nil {
				iss.set(st.serve, http.StatusOK)
			}
			_, err := v.Verify(context.Background(), st.token)
			if got := ErrorCode(err); got != st.code {
				t.Fatalf("code = %q (err %v), want %q", got, err, st.code)
			}
			if got := v.cache.len(); got != st.entries {
				t.Errorf("cache entries = %d, want %d", got, st.entries)
			}
		})
	}
}

// TestCacheResetDiscardsInFlight covers a verification that began before
// a key refresh and ends after it: its verdict was reached with the old
// keys and must not land in the new cache.
func TestCacheResetDiscardsInFlight(t *testing.T) {
	c := newTokenCache(8)
	key := tokenDigest("some token")
	_, gen, ok := c.get(key, testNow)
	if ok {
		t.Fatal("empty cache answered")
	}
	c.reset()
	c.put(key, Principal{UserID: "u-1"}, testNow.Add(time.Hour), gen)
	if _, _, ok := c.get(key, testNow); ok || c.len() != 0 {
		t.Fatalf("a verdict from before the reset was stored (entries %d)", c.len())
	}
	_, gen, _ = c.get(key, testNow)
	c.put(key, Principal{UserID: "u-1"}, testNow.Add(time.Hour), gen)
	if p, _, ok := c.get(key, testNow); !ok || p.UserID != "u-1" {
		t.Fatalf("get after put = %+v, %v", p, ok)
	}
}

func TestServiceVerifierCaches(t *testing.T) {
	clk := &clock{now: testNow}
	v, err := NewServiceVerifier(ServiceConfig{
		Secret: serviceSecret, Audience: []string{testAudience}, Issuers: []string{testIssuer}, Now: clk.Now,
	})
	must(t, err)
	ctx := context.Background()
	tok := signHS(t, serviceSecret, serviceClaims("executor"))
	for range 3 {
		p, err := v.Verify(ctx, tok)
		if err != nil || p.Kind != KindService || p.ServiceName != "executor" {
			t.Fatalf("principal %+v, err %v", p, err)
		}
	}
	if got := v.cache.len(); got != 1 {
		t.Errorf("cache entries = %d, want 1", got)
	}
	// A user token is no service token, cache or not.
	if _, err := v.Verify(ctx, signHS(t, devSecret, userClaims())); ErrorCode(err) != failure.CodeAuthenticationNotAService {
		t.Errorf("user token: code %q, want %q", ErrorCode(err), failure.CodeAuthenticationNotAService)
	}
	clk.set(testNow.Add(time.Hour + DefaultLeeway + time.Second))
	if _, err := v.Verify(ctx, tok); ErrorCode(err) != failure.CodeAuthenticationTokenExpired {
		t.Errorf("expired service token: code %q, want %q", ErrorCode(err), failure.CodeAuthenticationTokenExpired)
	}
}

// TestTokenDigest: the cache key is the SHA-256 of the whole token, at any
// length, and a token of usual size is hashed without allocating.
func TestTokenDigest(t *testing.T) {
	for _, n := range []int{0, 1, 600, 2048, 2049, 10000} {
		tok := strings.Repeat("t", n)
		if got, want := tokenDigest(tok), sha256.Sum256([]byte(tok)); got != want {
			t.Fatalf("length %d: digest %x, want %x", n, got, want)
		}
	}
	tok := strings.Repeat("t", 600)
	if n := testing.AllocsPerRun(100, func() { _ = tokenDigest(tok) }); n != 0 {
		t.Fatalf("tokenDigest allocates %v times, want 0", n)
	}
}
