package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/mandate-dev/mandate/internal/failure"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

const (
	// minRefreshInterval limits JWKS refetches on unknown kids, so a stream
	// of tokens with made-up kids cannot turn us into a load generator
	// against the identity provider.
	minRefreshInterval = time.Minute
	// maxDocumentBytes bounds discovery and JWKS responses.
	maxDocumentBytes = 1 << 20
	// minRSABits refuses keys too weak to trust (NIST SP 800-131A).
	minRSABits = 2048
	// fetchTimeout bounds one OIDC round trip when the caller's context has
	// no deadline of its own.
	fetchTimeout = 10 * time.Second
)

// keyStore holds the asymmetric verification keys: the static ones from a
// JWKS file and the cached ones from an OIDC issuer.
type keyStore struct {
	static []jose.JSONWebKey
	oidc   *oidcSource // nil without an OIDC issuer
	now    func() time.Time

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

func newKeyStore(ctx context.Context, file, issuerURL string, client *http.Client, now func() time.Time) (*keyStore, error) {
	ks := &keyStore{now: now}
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
		keys, err := ks.oidc.fetchKeys(ctx)
		if err != nil {
			return nil, err
		}
		ks.remote.Store(&keys)
		ks.lastRefresh = now()
	}
	return ks, nil
}

// lookup returns the public key for kid that can verify alg. Without a kid
// the key must be unambiguous. A miss triggers one rate-limited refetch from
// the OIDC issuer, which is how key rotation reaches us.
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
	keys, ferr := ks.oidc.fetchKeys(ctx)
	if ferr != nil {
		// Keep serving with the keys we have; the identity provider being
		// down must not invalidate tokens we can still check.
		return nil, newError(failure.CodeAuthenticationUnknownKey, "signing key is unknown", ferr)
	}
	ks.remote.Store(&keys)
	if ks.onRefresh != nil {
		ks.onRefresh()
	}
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
	if err := getJSON(ctx, client, strings.TrimSuffix(issuerURL, "/")+"/.well-known/openid-configuration", &doc); err != nil {
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

func (o *oidcSource) fetchKeys(ctx context.Context) ([]jose.JSONWebKey, error) {
	var raw json.RawMessage
	if err := getJSON(ctx, o.client, o.jwksURI, &raw); err != nil {
		return nil, fmt.Errorf("identity: fetch JWKS: %w", err)
	}
	keys, err := parseJWKS(raw)
	if err != nil {
		return nil, fmt.Errorf("identity: JWKS from issuer: %w", err)
	}
	return keys, nil
}

func getJSON(ctx context.Context, client *http.Client, u string, dst any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, fetchTimeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", u, resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxDocumentBytes+1))
	if err != nil {
		return err
	}
	if len(b) > maxDocumentBytes {
		return fmt.Errorf("GET %s: response larger than %d bytes", u, maxDocumentBytes)
	}
	return json.Unmarshal(b, dst)
}
