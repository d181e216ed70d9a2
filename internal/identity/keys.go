package identity

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/mandate-dev/mandate/internal/failure"
)

const (
	// minRefreshInterval limits JWKS refetches on unknown kids, so a stream
	// of tokens with made-up kids cannot turn us into a load generator
	// against the identity provider. It is also the shortest interval of
	// the background refresh, and its retry interval after a failed fetch.
	minRefreshInterval = time.Minute
	// defaultRefreshInterval is the background refresh interval when the
	// issuer's JWKS response has no Cache-Control max-age.
	defaultRefreshInterval = 15 * time.Minute
	// maxRefreshInterval bounds a long max-age, so a rotation is picked up
	// within the hour whatever the issuer says.
	maxRefreshInterval = time.Hour
	// maxDocumentBytes bounds discovery and JWKS responses.
	maxDocumentBytes = 1 << 20
	// minRSABits refuses keys too weak to trust (NIST SP 800-131A).
	minRSABits = 2048
	// fetchTimeout bounds one OIDC round trip when the caller's context has
	// no deadline of its own.
	fetchTimeout = 10 * time.Second
)

// keyStore holds the asymmetric verification keys: the static ones from a
// JWKS file and the cached ones from an OIDC issuer. The issuer's keys are
// refetched in the background, so a rotated-in key is usually known before
// the first token signed with it arrives, and, rate-limited, when a token
// names a kid we do not know.
type keyStore struct {
	static []jose.JSONWebKey
	oidc   *oidcSource // nil without an OIDC issuer
	now    func() time.Time
	after  func(time.Duration) <-chan time.Time // time.After; tests replace it

	remote atomic.Pointer[[]jose.JSONWebKey]
	// onRefresh, when set, runs after a refetch replaced the remote keys.
	onRefresh func()

	refreshMu   sync.Mutex // serialises refetches
	lastRefresh time.Time  // guarded by refreshMu
}

type oidcSource struct {
	client  *http.Client
	jwksURI string
}

// newKeyStore loads the keys. With an OIDC issuer it fetches them now and
// keeps them fresh in the background until ctx ends.
func newKeyStore(ctx context.Context, file, issuerURL string, client *http.Client, now func() time.Time,
	after func(time.Duration) <-chan time.Time,
) (*keyStore, error) {
	if after == nil {
		after = time.After
	}
	ks := &keyStore{now: now, after: after}
	if file != "" {
		b, err := os.ReadFile(file) //nolint:gosec // G304: the path is operator configuration, not request input.
		if err != nil {
			return nil, fmt.Errorf("identity: read JWKS file: %w", err)
		}
		ks.static, err = parseJWKS(b)
		if err != nil {
			return nil, fmt.Errorf("identity: JWKS file %s: %w", file, err)
		}
	}
	if issuerURL != "" {
		if client == nil {
			client = &http.Client{Timeout: fetchTimeout}
		}
		jwksURI, err := discover(ctx, client, issuerURL)
		if err != nil {
			return nil, err
		}
		ks.oidc = &oidcSource{client: client, jwksURI: jwksURI}
		keys, next, err := ks.oidc.fetchKeys(ctx)
		if err != nil {
			return nil, err
		}
		ks.remote.Store(&keys)
		ks.lastRefresh = now()
		go ks.keepFresh(ctx, next)
	}
	return ks, nil
}

// keepFresh refetches the issuer's keys every interval until ctx ends; each
// fetch sets the next interval.
func (ks *keyStore) keepFresh(ctx context.Context, interval time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ks.after(interval):
		}
		interval = ks.refresh(ctx)
	}
}

// refresh refetches the issuer's keys and returns when to do so next. A
// failed fetch keeps the keys we have and is retried soon.
func (ks *keyStore) refresh(ctx context.Context) time.Duration {
	ks.refreshMu.Lock()
	defer ks.refreshMu.Unlock()
	ks.lastRefresh = ks.now()
	keys, next, err := ks.oidc.fetchKeys(ctx)
	if err != nil {
		return minRefreshInterval
	}
	ks.replace(keys)
	return next
}

// replace installs a refetched key set; onRefresh runs when it differs
// from the one it replaces. Callers hold refreshMu.
func (ks *keyStore) replace(keys []jose.JSONWebKey) {
	old := ks.remote.Swap(&keys)
	if old != nil && sameKeys(*old, keys) {
		return
	}
	if ks.onRefresh != nil {
		ks.onRefresh()
	}
}

// sameKeys reports whether two key sets hold the same keys, in order, under
// the same ids and algorithms.
func sameKeys(a, b []jose.JSONWebKey) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].KeyID != b[i].KeyID || a[i].Algorithm != b[i].Algorithm {
			return false
		}
		ta, errA := a[i].Thumbprint(crypto.SHA256)
		tb, errB := b[i].Thumbprint(crypto.SHA256)
		if errA != nil || errB != nil || !bytes.Equal(ta, tb) {
			return false
		}
	}
	return true
}

// lookup returns the public key for kid that can verify alg. Without a kid
// the key must be unambiguous. A miss triggers one rate-limited refetch from
// the OIDC issuer, for a rotation the background refresh has not seen yet.
func (ks *keyStore) lookup(ctx context.Context, kid string, alg jose.SignatureAlgorithm) (any, error) {
	key, err := ks.find(kid, alg)
	if err == nil || ks.oidc == nil || ErrorCode(err) != failure.CodeAuthenticationUnknownKey {
		return key, err
	}
	ks.refreshMu.Lock()
	defer ks.refreshMu.Unlock()
	// Another request may have refreshed while we waited for the lock.
	if key, err = ks.find(kid, alg); err == nil || ErrorCode(err) != failure.CodeAuthenticationUnknownKey {
		return key, err
	}
	now := ks.now()
	if now.Sub(ks.lastRefresh) < minRefreshInterval {
		return nil, err
	}
	ks.lastRefresh = now
	keys, _, ferr := ks.oidc.fetchKeys(ctx)
	if ferr != nil {
		// Keep serving with the keys we have; the identity provider being
		// down must not invalidate tokens we can still check.
		return nil, newError(failure.CodeAuthenticationUnknownKey, "signing key is unknown", ferr)
	}
	ks.replace(keys)
	return ks.find(kid, alg)
}

func (ks *keyStore) find(kid string, alg jose.SignatureAlgorithm) (any, error) {
	var remote []jose.JSONWebKey
	if p := ks.remote.Load(); p != nil {
		remote = *p
	}
	var (
		match     any
		matches   int
		kidInSets bool
	)
	for _, set := range [][]jose.JSONWebKey{ks.static, remote} {
		for i := range set {
			k := &set[i]
			if kid != "" && k.KeyID != kid {
				continue
			}
			kidInSets = true
			if compatible(k, alg) {
				match = k.Key
				matches++
				if kid != "" {
					return match, nil
				}
			}
		}
	}
	switch {
	case matches == 1:
		return match, nil
	case kid == "" && matches > 1:
		return nil, newError(failure.CodeAuthenticationUnknownKey, "token has no kid and several keys could match", nil)
	case kid != "" && kidInSets:
		return nil, newError(failure.CodeAuthenticationInvalidToken, "token algorithm does not match its key", nil)
	default:
		return nil, newError(failure.CodeAuthenticationUnknownKey, "signing key is unknown", nil)
	}
}

// compatible reports whether k may verify alg. Tying each algorithm to one
// key type stops a token from choosing how its key is interpreted.
func compatible(k *jose.JSONWebKey, alg jose.SignatureAlgorithm) bool {
	if k.Algorithm != "" && k.Algorithm != string(alg) {
		return false
	}
	switch key := k.Key.(type) {
	case *rsa.PublicKey:
		return alg == jose.RS256
	case *ecdsa.PublicKey:
		return alg == jose.ES256 && key.Curve == elliptic.P256()
	case ed25519.PublicKey:
		return alg == jose.EdDSA
	default:
		return false
	}
}

// parseJWKS keeps the public signing keys of a JWK Set. Keys are parsed one
// by one so an identity provider publishing a key type we do not know (or
// an encryption key) does not take the whole set down. Symmetric keys are an
// error: the only HMAC key is the configured dev secret.
func parseJWKS(b []byte) ([]jose.JSONWebKey, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("not a JWK Set: %w", err)
	}
	var keys []jose.JSONWebKey
	for _, raw := range set.Keys {
		var probe struct {
			Kty string `json:"kty"`
			Use string `json:"use"`
		}
		if err := json.Unmarshal(raw, &probe); err != nil {
			return nil, fmt.Errorf("malformed key: %w", err)
		}
		if probe.Kty == "oct" {
			return nil, errors.New("symmetric (oct) keys are not accepted; use the dev secret")
		}
		if probe.Use != "" && probe.Use != "sig" {
			continue
		}
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(raw); err != nil {
			continue // an unsupported key type; tokens naming it get unknown_key
		}
		if !k.IsPublic() {
			k = k.Public() // never keep private material around longer than needed
		}
		if !k.Valid() {
			continue
		}
		if rk, ok := k.Key.(*rsa.PublicKey); ok && rk.N.BitLen() < minRSABits {
			return nil, fmt.Errorf("RSA key %q is shorter than %d bits", k.KeyID, minRSABits)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("no usable signing keys")
	}
	return keys, nil
}

// discover reads the issuer's OpenID Connect discovery document and returns
// its jwks_uri. The document must name the same issuer (OIDC Discovery §4.3)
// so one provider cannot vouch for another.
func discover(ctx context.Context, client *http.Client, issuerURL string) (string, error) {
	issuer, err := url.Parse(issuerURL)
	if err != nil || (issuer.Scheme != "https" && issuer.Scheme != "http") || issuer.Host == "" {
		return "", fmt.Errorf("identity: OIDC issuer %q is not an absolute http(s) URL", issuerURL)
	}
	var doc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if _, err := getJSON(ctx, client, strings.TrimSuffix(issuerURL, "/")+"/.well-known/openid-configuration", &doc); err != nil {
		return "", fmt.Errorf("identity: OIDC discovery: %w", err)
	}
	if strings.TrimSuffix(doc.Issuer, "/") != strings.TrimSuffix(issuerURL, "/") {
		return "", fmt.Errorf("identity: OIDC discovery names issuer %q, want %q", doc.Issuer, issuerURL)
	}
	jwks, err := url.Parse(doc.JWKSURI)
	if err != nil || jwks.Host == "" {
		return "", errors.New("identity: OIDC discovery has no valid jwks_uri")
	}
	// Never downgrade: keys for an https issuer must come over https.
	if jwks.Scheme != "https" && (issuer.Scheme == "https" || jwks.Scheme != "http") {
		return "", fmt.Errorf("identity: OIDC jwks_uri must use https, got %q", jwks.Scheme)
	}
	return doc.JWKSURI, nil
}

// fetchKeys fetches the issuer's key set and returns it with when to fetch
// it again.
func (o *oidcSource) fetchKeys(ctx context.Context) ([]jose.JSONWebKey, time.Duration, error) {
	var raw json.RawMessage
	h, err := getJSON(ctx, o.client, o.jwksURI, &raw)
	if err != nil {
		return nil, 0, fmt.Errorf("identity: fetch JWKS: %w", err)
	}
	keys, err := parseJWKS(raw)
	if err != nil {
		return nil, 0, fmt.Errorf("identity: JWKS from issuer: %w", err)
	}
	return keys, refreshInterval(h.Get("Cache-Control")), nil
}

// refreshInterval is how long the issuer lets us cache its key set: the
// max-age of its Cache-Control header bounded to [minRefreshInterval,
// maxRefreshInterval], or defaultRefreshInterval without a usable one.
func refreshInterval(cacheControl string) time.Duration {
	for d := range strings.SplitSeq(cacheControl, ",") {
		name, value, ok := strings.Cut(strings.TrimSpace(d), "=")
		if !ok || !strings.EqualFold(name, "max-age") {
			continue
		}
		// Out of range, ParseUint returns the largest value, which the bound
		// below takes care of.
		secs, err := strconv.ParseUint(strings.Trim(value, `"`), 10, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			break
		}
		secs = min(secs, uint64(maxRefreshInterval/time.Second))
		return max(time.Duration(secs)*time.Second, minRefreshInterval)
	}
	return defaultRefreshInterval
}

// getJSON GETs u, decodes the JSON body into dst and returns the response
// headers.
func getJSON(ctx context.Context, client *http.Client, u string, dst any) (http.Header, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, fetchTimeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", u, resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxDocumentBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxDocumentBytes {
		return nil, fmt.Errorf("GET %s: response larger than %d bytes", u, maxDocumentBytes)
	}
	return resp.Header, json.Unmarshal(b, dst)
}
