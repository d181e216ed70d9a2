package identity

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/json"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/mandate-dev/mandate/internal/failure"
)

const (
	// DefaultMaxTokenBytes bounds the token size when Config leaves it zero.
	// Real tokens are well under 2 KiB; the limit caps the work an
	// unauthenticated caller can make us do.
	DefaultMaxTokenBytes = 8 << 10
	// DefaultLeeway absorbs clock skew between issuer and verifier.
	DefaultLeeway = 30 * time.Second
	// MinSecretBytes is the shortest HMAC secret accepted: RFC 7518 §3.2
	// requires a key at least as long as the HS256 output.
	MinSecretBytes = 32
)

// supportedAlgs is the complete list of algorithms a token may declare.
// Anything else, `none` included, is refused by the parser before any
// key is chosen.
var supportedAlgs = []jose.SignatureAlgorithm{jose.HS256, jose.RS256, jose.ES256, jose.EdDSA}

// Config configures a Verifier for user and agent tokens. At least one key
// source (DevSecret, JWKSFile, OIDCIssuerURL) is required.
type Config struct {
	// Audience lists the `aud` values this service answers to; a token must
	// name at least one of them so a token minted for another service
	// cannot be replayed here. Required.
	Audience []string
	// Issuers lists the accepted `iss` values. Required.
	Issuers []string
	// DevSecret is the HS256 secret of `mandate dev`. It is the only HMAC
	// key the Verifier ever uses, which is what defeats algorithm confusion
	// attacks with public keys. Optional; at least MinSecretBytes long.
	DevSecret []byte
	// JWKSFile is the path of a JWK Set with RSA, P-256 or Ed25519 public
	// keys, read once by NewVerifier. Optional.
	JWKSFile string
	// OIDCIssuerURL is an OpenID Connect issuer whose discovery document
	// names the JWKS to fetch. Keys are cached and refetched in the
	// background until the context given to NewVerifier ends: as often as
	// the JWKS response's Cache-Control max-age says, within [1m, 1h], and
	// every 15 minutes without one, so that a rotated-in key is known before
	// tokens signed with it arrive. A token naming an unknown `kid` also
	// triggers a refetch, at most once per minute. Optional.
	OIDCIssuerURL string
	// HTTPClient fetches OIDC documents; nil means a client with a 10s
	// timeout.
	HTTPClient *http.Client
	// MaxTokenBytes defaults to DefaultMaxTokenBytes.
	MaxTokenBytes int
	// Leeway defaults to DefaultLeeway.
	Leeway time.Duration
	// Now replaces time.Now in tests.
	Now func() time.Time
	// CacheSize bounds how many verified tokens are remembered until their
	// `exp`, so a token is verified once per process rather than on every
	// call. Zero means DefaultCacheSize; negative turns the cache off.
	CacheSize int

	// refreshAfter replaces time.After for the background key refresh in
	// tests.
	refreshAfter func(time.Duration) <-chan time.Time
}

// Verifier checks user and agent bearer tokens. It is safe for concurrent
// use.
type Verifier struct {
	check     checker
	devSecret []byte
	keys      *keyStore   // nil when no asymmetric key source is configured
	cache     *tokenCache // nil when caching is off; dropped whenever keys change
}

// NewVerifier validates cfg and loads its keys. With an OIDC issuer it
// fetches the discovery document and the key set now, so a misconfigured
// issuer fails at startup instead of on the first request, and refreshes the
// key set in the background until ctx ends.
func NewVerifier(ctx context.Context, cfg Config) (*Verifier, error) {
	chk, err := newChecker(cfg.Audience, cfg.Issuers, cfg.MaxTokenBytes, cfg.Leeway, cfg.Now)
	if err != nil {
		return nil, err
	}
	if cfg.DevSecret == nil && cfg.JWKSFile == "" && cfg.OIDCIssuerURL == "" {
		return nil, errors.New("identity: config needs DevSecret, JWKSFile or OIDCIssuerURL")
	}
	if cfg.DevSecret != nil && len(cfg.DevSecret) < MinSecretBytes {
		return nil, fmt.Errorf("identity: DevSecret must be at least %d bytes", MinSecretBytes)
	}
	v := &Verifier{check: chk, devSecret: slices.Clone(cfg.DevSecret), cache: newTokenCache(cfg.CacheSize)}
	if cfg.JWKSFile != "" || cfg.OIDCIssuerURL != "" {
		v.keys, err = newKeyStore(ctx, cfg.JWKSFile, cfg.OIDCIssuerURL, cfg.HTTPClient, chk.now, cfg.refreshAfter)
		if err != nil {
			return nil, err
		}
		// A refetched key set may have dropped the key a cached token was
		// signed with: forget every verdict reached with the old set.
		v.keys.onRefresh = v.cache.reset
	}
	return v, nil
}

// Verify checks token and returns the user or agent it identifies. Every
// refusal is an *Error. A service token is refused here even if it were
// signed with a key we trust: services reach users' data only by relaying a
// user's token.
//
// A token that verified is remembered (by digest) until its `exp`, so the
// signature and claims are checked once per process per token; see
// tokenCache for what that does and does not change.
func (v *Verifier) Verify(ctx context.Context, token string) (Principal, error) {
	return v.cache.verify(ctx, token, &v.check, v.verify)
}

func (v *Verifier) verify(ctx context.Context, token string) (Principal, error) {
	c, err := v.check.verify(ctx, token, v.resolveKey, failure.CodeAuthenticationInvalidToken)
	if err != nil {
		return Principal{}, err
	}
	if c.Service.set {
		return Principal{}, newError(failure.CodeAuthenticationInvalidToken, "a service token cannot authenticate a user or agent", nil)
	}
	if c.Subject == "" {
		return Principal{}, newError(failure.CodeAuthenticationMissingClaim, "token has no sub claim", nil)
	}
	if c.Tenant == "" {
		return Principal{}, newError(failure.CodeAuthenticationMissingClaim, "token has no tenant claim", nil)
	}
	p := Principal{
		Kind:      KindUser,
		Tenant:    c.Tenant,
		Org:       c.Org,
		UserID:    c.Subject,
		Issuer:    c.Issuer,
		TokenID:   c.ID,
		ExpiresAt: c.Expiry.Time(),
	}
	if c.IssuedAt != nil {
		p.IssuedAt = c.IssuedAt.Time()
	}
	if c.Act != nil {
		if c.Act.Subject == "" {
			return Principal{}, newError(failure.CodeAuthenticationMissingClaim, "act claim has no sub", nil)
		}
		if c.Act.Act != nil {
			return Principal{}, newError(failure.CodeAuthenticationInvalidToken,
				"nested act claim (an agent acting through another agent) is not supported: the audit trail records one agent per call", nil)
		}
		p.Kind = KindAgent
		p.AgentID = c.Act.Subject
		p.Model = c.Act.Model
		p.ModelVersion = c.Act.ModelVersion
	}
	return p, nil
}

// resolveKey picks the one key allowed to verify a token with this header.
// The choice is driven by the algorithm family: HS256 only ever gets the dev
// secret and asymmetric algorithms only ever get a public key of the
// matching type, so a public key can never be used as an HMAC secret.
// Keys embedded in the token (jwk, jku, x5u headers) are ignored.
func (v *Verifier) resolveKey(ctx context.Context, h jose.Header) (any, error) {
	switch jose.SignatureAlgorithm(h.Algorithm) {
	case jose.HS256:
		if v.devSecret == nil {
			return nil, newError(failure.CodeAuthenticationInvalidToken, "HS256 tokens are not accepted", nil)
		}
		return v.devSecret, nil
	case jose.RS256, jose.ES256, jose.EdDSA:
		if v.keys == nil {
			return nil, newError(failure.CodeAuthenticationInvalidToken, "asymmetric tokens are not accepted", nil)
		}
		return v.keys.lookup(ctx, h.KeyID, jose.SignatureAlgorithm(h.Algorithm))
	default:
		return nil, newError(failure.CodeAuthenticationInvalidToken, "unsupported signing algorithm", nil)
	}
}

// checker holds the checks user and service tokens share, so the two
// verifiers cannot drift apart on expiry, issuer or audience rules.
type checker struct {
	audience []string
	issuers  []string
	maxBytes int
	leeway   time.Duration
	now      func() time.Time
}

func newChecker(aud, iss []string, maxBytes int, leeway time.Duration, now func() time.Time) (checker, error) {
	if len(aud) == 0 || slices.Contains(aud, "") {
		return checker{}, errors.New("identity: Audience is required and must not contain empty values")
	}
	if len(iss) == 0 || slices.Contains(iss, "") {
		return checker{}, errors.New("identity: Issuers is required and must not contain empty values")
	}
	if maxBytes < 0 || leeway < 0 {
		return checker{}, errors.New("identity: MaxTokenBytes and Leeway must not be negative")
	}
	if maxBytes == 0 {
		maxBytes = DefaultMaxTokenBytes
	}
	if leeway == 0 {
		leeway = DefaultLeeway
	}
	if now == nil {
		now = time.Now
	}
	return checker{
		audience: slices.Clone(aud),
		issuers:  slices.Clone(iss),
		maxBytes: maxBytes,
		leeway:   leeway,
		now:      now,
	}, nil
}

// claims is the token payload. It is decoded with go-jose's JSON package,
// which matches field names case-sensitively, so "Tenant" is not "tenant".
type claims struct {
	Issuer    string           `json:"iss"`
	Subject   string           `json:"sub"`
	Audience  jwt.Audience     `json:"aud"`
	Expiry    *jwt.NumericDate `json:"exp"`
	NotBefore *jwt.NumericDate `json:"nbf"`
	IssuedAt  *jwt.NumericDate `json:"iat"`
	ID        string           `json:"jti"`
	Tenant    string           `json:"tenant"`
	Org       string           `json:"org"`
	Act       *actClaim        `json:"act"`
	Service   optionalString   `json:"mandate_service"`
}

// actClaim is the RFC 8693 actor: the agent acting for the subject.
type actClaim struct {
	Subject      string `json:"sub"`
	Model        string `json:"mandate_model,omitempty"`
	ModelVersion string `json:"mandate_model_version,omitempty"`
	// Act is a nested actor (an agent acting through another agent). It
	// is decoded only to be refused: the trail records one agent per
	// call, so a chain it cannot record is not silently cut to its head.
	Act *actClaim `json:"act,omitempty"`
}

// optionalString records whether a claim was present at all, even as null,
// because the mere presence of mandate_service marks a service token.
type optionalString struct {
	set   bool
	value string
}

func (o *optionalString) UnmarshalJSON(b []byte) error {
	o.set = true
	if string(b) == "null" {
		return nil
	}
	return json.Unmarshal(b, &o.value)
}

// verifiedPayload captures the payload bytes that go-jose has verified, so a
// bad signature and bad JSON can be told apart and reported precisely.
type verifiedPayload []byte

func (p *verifiedPayload) UnmarshalJSON(b []byte) error {
	*p = append((*p)[:0], b...)
	return nil
}

type keyResolver func(ctx context.Context, h jose.Header) (any, error)

// verify runs the checks common to every token. sigCode is the code for a
// signature that does not verify: invalid_token for users, not_a_service for
// the service verifier (a token not signed by the service key is, by
// definition, not a service's).
func (c *checker) verify(ctx context.Context, token string, resolve keyResolver, sigCode string) (*claims, error) {
	if token == "" {
		return nil, newError(failure.CodeAuthenticationMissingCredentials, "no bearer token", nil)
	}
	// Size first: nothing below runs on an oversized input.
	if len(token) > c.maxBytes {
		return nil, newError(failure.CodeAuthenticationTokenTooLarge, fmt.Sprintf("token exceeds %d bytes", c.maxBytes), nil)
	}
	tok, err := jwt.ParseSigned(token, supportedAlgs)
	if err != nil {
		return nil, newError(failure.CodeAuthenticationInvalidToken, "malformed token or unsupported algorithm", err)
	}
	if len(tok.Headers) != 1 {
		return nil, newError(failure.CodeAuthenticationInvalidToken, "token must have exactly one signature", nil)
	}
	key, err := resolve(ctx, tok.Headers[0])
	if err != nil {
		return nil, err
	}
	var payload verifiedPayload
	if err := tok.Claims(key, &payload); err != nil {
		return nil, newError(sigCode, "signature verification failed", err)
	}
	var cl claims
	if err := json.Unmarshal(payload, &cl); err != nil {
		return nil, newError(failure.CodeAuthenticationInvalidToken, "token claims are malformed", err)
	}
	if err := c.checkClaims(&cl); err != nil {
		return nil, err
	}
	return &cl, nil
}

// checkClaims enforces lifetime, issuer and audience. Lifetime comes first:
// an expired token is reported as expired even if it is also misaddressed,
// because "get a new token" is the remedy that fixes both.
func (c *checker) checkClaims(cl *claims) error {
	now := c.now()
	if cl.Expiry == nil {
		return newError(failure.CodeAuthenticationMissingClaim, "token has no exp claim", nil)
	}
	if now.After(cl.Expiry.Time().Add(c.leeway)) {
		return newError(failure.CodeAuthenticationTokenExpired, "token has expired", nil)
	}
	if cl.NotBefore != nil && now.Add(c.leeway).Before(cl.NotBefore.Time()) {
		return newError(failure.CodeAuthenticationTokenNotYetValid, "token is not valid yet (nbf)", nil)
	}
	if cl.IssuedAt != nil && now.Add(c.leeway).Before(cl.IssuedAt.Time()) {
		return newError(failure.CodeAuthenticationTokenNotYetValid, "token was issued in the future (iat)", nil)
	}
	if !slices.Contains(c.issuers, cl.Issuer) {
		return newError(failure.CodeAuthenticationWrongIssuer, "token issuer is not trusted", nil)
	}
	if !slices.ContainsFunc(cl.Audience, func(a string) bool { return slices.Contains(c.audience, a) }) {
		return newError(failure.CodeAuthenticationWrongAudience, "token is not addressed to this service", nil)
	}
	return nil
}
