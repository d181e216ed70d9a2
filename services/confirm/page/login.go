package page

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Sign-in token parameters.
const (
	// LoginAudience is the `aud` of sign-in tokens. No service accepts it for
	// bearer tokens, and the page accepts nothing else.
	LoginAudience = "mandate-approval-page"
	// LoginPurpose is the value of the `purpose` claim.
	LoginPurpose = "mandate_login"
	// DefaultLoginTTL is a sign-in link's lifetime when LoginURL is given 0.
	DefaultLoginTTL = 15 * time.Minute
	// MaxLoginTTL is the longest a sign-in link may live; the page refuses
	// tokens minted for longer.
	MaxLoginTTL = time.Hour
	// minSecretBytes is RFC 7518 §3.2's minimum for HS256 keys.
	minSecretBytes = 32
	// maxTokenBytes bounds the work an anonymous visitor can cause.
	maxTokenBytes = 4 << 10
	// loginLeeway absorbs clock skew between the minting CLI and the page.
	loginLeeway = 30 * time.Second
)

// loginClaims is the payload of a sign-in token. It has no `sub` on
// purpose: a user-token verifier refuses a token without one.
type loginClaims struct {
	Issuer    string           `json:"iss"`
	Audience  jwt.Audience     `json:"aud"`
	Expiry    *jwt.NumericDate `json:"exp"`
	NotBefore *jwt.NumericDate `json:"nbf"`
	IssuedAt  *jwt.NumericDate `json:"iat"`
	ID        string           `json:"jti"`
	Purpose   string           `json:"purpose"`
	User      string           `json:"user"`
	Tenant    string           `json:"tenant"`
}

// foreignClaims are claims of other token kinds; a sign-in token with any
// of them is refused.
type foreignClaims struct {
	Subject json.RawMessage `json:"sub"`
	Act     json.RawMessage `json:"act"`
	Service json.RawMessage `json:"mandate_service"`
}

// MintLoginToken signs a one-time sign-in token for a user of tenant with
// the dev secret. ttl 0 means DefaultLoginTTL; more than MaxLoginTTL is
// refused.
func MintLoginToken(secret []byte, issuer, user, tenant string, ttl time.Duration) (string, error) {
	return mintLoginToken(secret, issuer, user, tenant, ttl, time.Now())
}

func mintLoginToken(secret []byte, issuer, user, tenant string, ttl time.Duration, now time.Time) (string, error) {
	switch {
	case len(secret) < minSecretBytes:
		return "", fmt.Errorf("page: the secret must be at least %d bytes", minSecretBytes)
	case issuer == "" || user == "" || tenant == "":
		return "", errors.New("page: a sign-in token needs issuer, user and tenant")
	case ttl < 0 || ttl > MaxLoginTTL:
		return "", fmt.Errorf("page: a sign-in link lives at most %s", MaxLoginTTL)
	}
	if ttl == 0 {
		ttl = DefaultLoginTTL
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: secret}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return "", fmt.Errorf("page: signer: %w", err)
	}
	c := loginClaims{
		Issuer: issuer, Audience: jwt.Audience{LoginAudience},
		Expiry: jwt.NewNumericDate(now.Add(ttl)), NotBefore: jwt.NewNumericDate(now), IssuedAt: jwt.NewNumericDate(now),
		ID: rand.Text(), Purpose: LoginPurpose, User: user, Tenant: tenant,
	}
	tok, err := jwt.Signed(signer).Claims(c).Serialize()
	if err != nil {
		return "", fmt.Errorf("page: sign: %w", err)
	}
	return tok, nil
}

// LoginURL returns a one-time sign-in link to the approval page at baseURL
// (the page's public origin, e.g. "http://127.0.0.1:8080") for user of
// tenant, signed with the dev secret and valid for ttl (0: DefaultLoginTTL,
// at most MaxLoginTTL). `mandate dev` prints it; only users get one.
func LoginURL(baseURL string, secret []byte, issuer, user, tenant string, ttl time.Duration) (string, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("page: base URL %q must be an absolute http(s) URL", baseURL)
	}
	tok, err := MintLoginToken(secret, issuer, user, tenant, ttl)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(baseURL, "/") + loginPath + "?t=" + url.QueryEscape(tok), nil
}

// badLoginError is every reason a sign-in token is refused; the reason goes
// to the log, the visitor only learns that the link does not work.
type badLoginError string

func (e badLoginError) Error() string { return "sign-in token refused: " + string(e) }

// verifyLogin checks a sign-in token and returns its claims.
func verifyLogin(raw string, secret []byte, issuers []string, now time.Time) (loginClaims, error) {
	var c loginClaims
	if raw == "" {
		return c, badLoginError("no token")
	}
	if len(raw) > maxTokenBytes {
		return c, badLoginError("token too large")
	}
	tok, err := jwt.ParseSigned(raw, []jose.SignatureAlgorithm{jose.HS256})
	if err != nil {
		return c, badLoginError("malformed token or algorithm other than HS256")
	}
	if len(tok.Headers) != 1 || tok.Headers[0].KeyID != "" || tok.Headers[0].JSONWebKey != nil {
		return c, badLoginError("unexpected token header")
	}
	var foreign foreignClaims
	if err := tok.Claims(secret, &c, &foreign); err != nil {
		return c, badLoginError("signature does not verify")
	}
	switch {
	case foreign.Subject != nil || foreign.Act != nil || foreign.Service != nil:
		return c, badLoginError("a bearer token is not a sign-in token")
	case c.Purpose != LoginPurpose:
		return c, badLoginError("wrong purpose")
	case !slices.Contains(c.Audience, LoginAudience):
		return c, badLoginError("wrong audience")
	case !slices.Contains(issuers, c.Issuer):
		return c, badLoginError("untrusted issuer")
	case c.ID == "" || c.User == "" || c.Tenant == "":
		return c, badLoginError("missing jti, user or tenant")
	case c.Expiry == nil || c.IssuedAt == nil:
		return c, badLoginError("missing exp or iat")
	case now.After(c.Expiry.Time().Add(loginLeeway)):
		return c, badLoginError("expired")
	case now.Add(loginLeeway).Before(c.IssuedAt.Time()), c.NotBefore != nil && now.Add(loginLeeway).Before(c.NotBefore.Time()):
		return c, badLoginError("not valid yet")
	case c.Expiry.Time().Sub(c.IssuedAt.Time()) > MaxLoginTTL:
		return c, badLoginError("lifetime exceeds the maximum")
	}
	return c, nil
}
