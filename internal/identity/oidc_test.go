package identity

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/mandate-dev/mandate/internal/failure"
)

// fakeIssuer is an OIDC provider on a loopback TLS server whose key set
// and behaviour tests can change between requests.
type fakeIssuer struct {
	srv        *httptest.Server
	mu         sync.Mutex
	jwks       []byte
	discovery  func(base string) map[string]any
	jwksStatus int
	// cacheControl, when set, is the Cache-Control header of the JWKS.
	cacheControl string
	fetches      atomic.Int32
}

func newFakeIssuer(t *testing.T, jwks []byte) *fakeIssuer {
	t.Helper()
	f := &fakeIssuer{jwks: jwks, jwksStatus: http.StatusOK}
	f.discovery = func(base string) map[string]any {
		return map[string]any{"issuer": base, "jwks_uri": base + "/keys"}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		doc := f.discovery(f.srv.URL)
		f.mu.Unlock()
		b, _ := jsonMarshal(doc)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	})
	mux.HandleFunc("GET /keys", func(w http.ResponseWriter, r *http.Request) {
		f.fetches.Add(1)
		f.mu.Lock()
		status, body, cc := f.jwksStatus, f.jwks, f.cacheControl
		f.mu.Unlock()
		if cc != "" {
			w.Header().Set("Cache-Control", cc)
		}
		w.WriteHeader(status)
		_, _ = w.Write(body)
	})
	f.srv = httptest.NewTLSServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeIssuer) set(jwks []byte, status int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.jwks, f.jwksStatus = jwks, status
}

func (f *fakeIssuer) config(now func() time.Time) Config {
	return Config{
		Audience:      []string{testAudience},
		Issuers:       []string{f.srv.URL},
		OIDCIssuerURL: f.srv.URL,
		HTTPClient:    f.srv.Client(),
		Now:           now,
	}
}

func TestOIDCDiscoveryAndKeyRotation(t *testing.T) {
	k := getKeys(t)
	rsaOnly := publicJWKS(t, jose.JSONWebKey{Key: k.rsa, KeyID: k.rsaKid, Use: "sig"})
	rotated := publicJWKS(t,
		jose.JSONWebKey{Key: k.rsa, KeyID: k.rsaKid, Use: "sig"},
		jose.JSONWebKey{Key: k.ed, KeyID: k.edKid, Use: "sig"},
	)
	iss := newFakeIssuer(t, rsaOnly)
	now := testNow
	var clockMu sync.Mutex
	clock := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }

	v, err := NewVerifier(t.Context(), iss.config(clock))
	must(t, err)

	claims := func() map[string]any { return with(userClaims(), "iss", iss.srv.URL) }
	rsaTok := sign(t, jose.RS256, k.rsa, k.rsaKid, claims())
	edTok := sign(t, jose.EdDSA, k.ed, k.edKid, claims())
	unknownTok := sign(t, jose.RS256, k.rsaOther, "rsa-unknown", claims())

	// Steps run in order against one verifier: each names what the cache
	// and the rate limit should do.
	steps := []struct {
		name        string
		advance     time.Duration
		serve       []byte
		status      int
		token       string
		code        string
		wantFetches int32
	}{
		{"initial key set verifies RS256", 0, nil, 0, rsaTok, "", 1},
		{"rotated key unseen, refresh rate-limited", 0, rotated, http.StatusOK, edTok, failure.CodeAuthenticationUnknownKey, 1},
		{"after a minute the unknown kid triggers one refresh", 61 * time.Second, nil, 0, edTok, "", 2},
		{"cached key needs no fetch", 0, nil, 0, edTok, "", 2},
		{"made-up kid right after a refresh does not fetch", 0, nil, 0, unknownTok, failure.CodeAuthenticationUnknownKey, 2},
		{"made-up kid a minute later fetches once and still fails", 61 * time.Second, nil, 0, unknownTok, failure.CodeAuthenticationUnknownKey, 3},
		{"issuer down: cached keys keep working", 61 * time.Second, []byte("oops"), http.StatusInternalServerError, rsaTok, "", 3},
		{"issuer down: unknown kid is unknown_key", 0, nil, 0, unknownTok, failure.CodeAuthenticationUnknownKey, 4},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			clockMu.Lock()
			now = now.Add(st.advance)
			clockMu.Unlock()
			if st.serve != nil {
				iss.set(st.serve, st.status)
			}
			_, err := v.Verify(context.Background(), st.token)
			if got := ErrorCode(err); got != st.code {
				t.Fatalf("code = %q (err %v), want %q", got, err, st.code)
			}
			if got := iss.fetches.Load(); got != st.wantFetches {
				t.Errorf("JWKS fetches = %d, want %d", got, st.wantFetches)
			}
		})
	}
}

func TestOIDCRefreshIsSingleFlight(t *testing.T) {
	k := getKeys(t)
	iss := newFakeIssuer(t, publicJWKS(t, jose.JSONWebKey{Key: k.rsa, KeyID: k.rsaKid, Use: "sig"}))
	now := testNow
	var clockMu sync.Mutex
	clock := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	v, err := NewVerifier(t.Context(), iss.config(clock))
	must(t, err)
	clockMu.Lock()
	now = now.Add(2 * time.Minute)
	clockMu.Unlock()

	tok := sign(t, jose.RS256, k.rsaOther, "nobody", with(userClaims(), "iss", iss.srv.URL))
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			if _, err := v.Verify(context.Background(), tok); ErrorCode(err) != failure.CodeAuthenticationUnknownKey {
				t.Errorf("code = %q, want %q", ErrorCode(err), failure.CodeAuthenticationUnknownKey)
			}
		})
	}
	wg.Wait()
	if got := iss.fetches.Load(); got != 2 { // startup + exactly one refresh
		t.Errorf("JWKS fetches = %d, want 2", got)
	}
}

func TestOIDCDiscoveryFailures(t *testing.T) {
	k := getKeys(t)
	good := publicJWKS(t, jose.JSONWebKey{Key: k.rsa, KeyID: k.rsaKid, Use: "sig"})
	tests := []struct {
		name      string
		discovery func(base string) map[string]any
		jwks      []byte
		status    int
	}{
		{"issuer mismatch", func(base string) map[string]any {
			return map[string]any{"issuer": "https://other.test", "jwks_uri": base + "/keys"}
		}, good, http.StatusOK},
		{"jwks_uri downgraded to http", func(base string) map[string]any {
			return map[string]any{"issuer": base, "jwks_uri": "http://127.0.0.1:1/keys"}
		}, good, http.StatusOK},
		{"no jwks_uri", func(base string) map[string]any {
			return map[string]any{"issuer": base}
		}, good, http.StatusOK},
		{"jwks fetch fails", nil, []byte("down"), http.StatusServiceUnavailable},
		{"jwks has only an HMAC key", nil, []byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`), http.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			iss := newFakeIssuer(t, tc.jwks)
			iss.jwksStatus = tc.status
			if tc.discovery != nil {
				iss.discovery = tc.discovery
			}
			if _, err := NewVerifier(context.Background(), iss.config(fixedNow)); err == nil {
				t.Fatal("NewVerifier accepted a broken issuer")
			}
		})
	}
	t.Run("not an absolute URL", func(t *testing.T) {
		cfg := Config{Audience: []string{"a"}, Issuers: []string{"i"}, OIDCIssuerURL: "id.example.com"}
		if _, err := NewVerifier(context.Background(), cfg); err == nil {
			t.Fatal("NewVerifier accepted a relative issuer URL")
		}
	})
}

// manualRefresh drives the background key refresh of a Verifier: the
// refresh loop reports each interval it waits for on asked, and waits until
// the test fires.
type manualRefresh struct {
	asked chan time.Duration
	fire  chan time.Time
}

func newManualRefresh() *manualRefresh {
	return &manualRefresh{asked: make(chan time.Duration), fire: make(chan time.Time)}
}

func (m *manualRefresh) after(d time.Duration) <-chan time.Time {
	m.asked <- d
	return m.fire
}

// next waits until the refresh loop waits again, which it does once the
// refresh before has finished, and returns the interval it asked for.
func (m *manualRefresh) next(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-m.asked:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("the key refresh loop did not wait for its next refresh")
		return 0
	}
}

func TestOIDCBackgroundRefreshPicksUpRotation(t *testing.T) {
	k := getKeys(t)
	rsaOnly := publicJWKS(t, jose.JSONWebKey{Key: k.rsa, KeyID: k.rsaKid, Use: "sig"})
	rotated := publicJWKS(t,
		jose.JSONWebKey{Key: k.rsa, KeyID: k.rsaKid, Use: "sig"},
		jose.JSONWebKey{Key: k.ed, KeyID: k.edKid, Use: "sig"},
	)
	iss := newFakeIssuer(t, rsaOnly)
	now := testNow
	var clockMu sync.Mutex
	clock := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	refresh := newManualRefresh()
	cfg := iss.config(clock)
	cfg.refreshAfter = refresh.after
	v, err := NewVerifier(t.Context(), cfg)
	must(t, err)
	if d := refresh.next(t); d != defaultRefreshInterval {
		t.Fatalf("first refresh in %v, want the default %v without Cache-Control", d, defaultRefreshInterval)
	}

	claims := func() map[string]any { return with(userClaims(), "iss", iss.srv.URL) }
	rsaTok := sign(t, jose.RS256, k.rsa, k.rsaKid, claims())
	edTok := sign(t, jose.EdDSA, k.ed, k.edKid, claims())
	unknownTok := sign(t, jose.RS256, k.rsaOther, "rsa-unknown", claims())
	verify := func(tok, code string, fetches int32) {
		t.Helper()
		if _, err := v.Verify(context.Background(), tok); ErrorCode(err) != code {
			t.Fatalf("code = %q (err %v), want %q", ErrorCode(err), err, code)
		}
		if got := iss.fetches.Load(); got != fetches {
			t.Fatalf("JWKS fetches = %d, want %d", got, fetches)
		}
	}
	verify(rsaTok, "", 1)

	// The issuer rotates a key in; the background refresh sees it before any
	// token signed with it arrives.
	iss.set(rotated, http.StatusOK)
	refresh.fire <- time.Time{}
	refresh.next(t)
	verify(edTok, "", 2) // no unknown-kid round trip

	// A refresh that fails keeps the keys and retries after the minimum
	// interval.
	iss.set([]byte("down"), http.StatusServiceUnavailable)
	refresh.fire <- time.Time{}
	if d := refresh.next(t); d != minRefreshInterval {
		t.Fatalf("after a failed refresh, next in %v, want %v", d, minRefreshInterval)
	}
	verify(edTok, "", 3)
	verify(rsaTok, "", 3)

	// The unknown-kid refetch stays rate-limited, and a background refresh
	// counts as the last refetch.
	iss.set(rotated, http.StatusOK)
	verify(unknownTok, failure.CodeAuthenticationUnknownKey, 3)
	clockMu.Lock()
	now = now.Add(61 * time.Second)
	clockMu.Unlock()
	verify(unknownTok, failure.CodeAuthenticationUnknownKey, 4)
	verify(unknownTok, failure.CodeAuthenticationUnknownKey, 4)
}

func TestOIDCRefreshIntervalFollowsCacheControl(t *testing.T) {
	k := getKeys(t)
	tests := []struct {
		cacheControl string
		want         time.Duration
	}{
		{"", defaultRefreshInterval},
		{"max-age=300", 5 * time.Minute},
		{"public, max-age=600, must-revalidate", 10 * time.Minute},
		{"Max-Age=\"120\"", 2 * time.Minute},
		{"max-age=5", minRefreshInterval},
		{"max-age=0", minRefreshInterval},
		{"max-age=86400", maxRefreshInterval},
		{"max-age=99999999999999999999", maxRefreshInterval},
		{"no-cache", defaultRefreshInterval},
		{"max-age=soon", defaultRefreshInterval},
	}
	for _, tc := range tests {
		t.Run(tc.cacheControl, func(t *testing.T) {
			iss := newFakeIssuer(t, publicJWKS(t, jose.JSONWebKey{Key: k.rsa, KeyID: k.rsaKid, Use: "sig"}))
			iss.cacheControl = tc.cacheControl
			refresh := newManualRefresh()
			cfg := iss.config(fixedNow)
			cfg.refreshAfter = refresh.after
			if _, err := NewVerifier(t.Context(), cfg); err != nil {
				t.Fatal(err)
			}
			if d := refresh.next(t); d != tc.want {
				t.Fatalf("refresh in %v, want %v", d, tc.want)
			}
		})
	}
}

func TestOIDCRefreshOfAnUnchangedSetKeepsVerdicts(t *testing.T) {
	k := getKeys(t)
	jwks := publicJWKS(t, jose.JSONWebKey{Key: k.rsa, KeyID: k.rsaKid, Use: "sig"})
	iss := newFakeIssuer(t, jwks)
	refresh := newManualRefresh()
	cfg := iss.config(fixedNow)
	cfg.refreshAfter = refresh.after
	v, err := NewVerifier(t.Context(), cfg)
	must(t, err)
	refresh.next(t)
	resets := 0
	v.keys.onRefresh = func() { resets++ }

	refresh.fire <- time.Time{}
	refresh.next(t)
	if resets != 0 {
		t.Fatalf("an unchanged key set dropped the token cache %d times", resets)
	}
	iss.set(publicJWKS(t, jose.JSONWebKey{Key: k.rsa, KeyID: k.rsaKid, Use: "sig"},
		jose.JSONWebKey{Key: k.ed, KeyID: k.edKid, Use: "sig"}), http.StatusOK)
	refresh.fire <- time.Time{}
	refresh.next(t)
	if resets != 1 {
		t.Fatalf("a changed key set dropped the token cache %d times, want 1", resets)
	}
}
