package identity

import (
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/mandate-dev/mandate/internal/failure"
)

// explicitNull marshals as JSON null so a claim can be present but null.
type explicitNull struct{}

func (explicitNull) MarshalJSON() ([]byte, error) { return []byte("null"), nil }

func rsaPublicPEM(tb testing.TB, k *rsa.PublicKey) []byte {
	tb.Helper()
	der, err := x509.MarshalPKIXPublicKey(k)
	must(tb, err)
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func TestVerifyRefusals(t *testing.T) {
	k := getKeys(t)
	v := newTestVerifier(t, t.TempDir())
	rsaPEM := rsaPublicPEM(t, &k.rsa.PublicKey)
	rsaDER, err := x509.MarshalPKIXPublicKey(&k.rsa.PublicKey)
	must(t, err)

	tests := []struct {
		name  string
		token func() string
		code  string
	}{
		{"empty", func() string { return "" }, failure.CodeAuthenticationMissingCredentials},
		{"expired", func() string {
			return signHS(t, devSecret, with(userClaims(), "exp", testNow.Add(-time.Hour).Unix()))
		}, failure.CodeAuthenticationTokenExpired},
		{"expired just beyond leeway", func() string {
			return signHS(t, devSecret, with(userClaims(), "exp", testNow.Add(-DefaultLeeway-time.Second).Unix()))
		}, failure.CodeAuthenticationTokenExpired},
		{"missing exp", func() string { return signHS(t, devSecret, with(userClaims(), "exp", nil)) }, failure.CodeAuthenticationMissingClaim},
		{"nbf in the future", func() string {
			return signHS(t, devSecret, with(userClaims(), "nbf", testNow.Add(time.Hour).Unix()))
		}, failure.CodeAuthenticationTokenNotYetValid},
		{"iat in the future", func() string {
			return signHS(t, devSecret, with(userClaims(), "iat", testNow.Add(time.Hour).Unix()))
		}, failure.CodeAuthenticationTokenNotYetValid},
		{"wrong audience", func() string { return signHS(t, devSecret, with(userClaims(), "aud", []string{"billing-api"})) }, failure.CodeAuthenticationWrongAudience},
		{"missing audience", func() string { return signHS(t, devSecret, with(userClaims(), "aud", nil)) }, failure.CodeAuthenticationWrongAudience},
		{"wrong issuer", func() string { return signHS(t, devSecret, with(userClaims(), "iss", "https://evil.test")) }, failure.CodeAuthenticationWrongIssuer},
		{"missing issuer", func() string { return signHS(t, devSecret, with(userClaims(), "iss", nil)) }, failure.CodeAuthenticationWrongIssuer},
		{"alg none", func() string { return unsignedToken(t, userClaims()) }, failure.CodeAuthenticationInvalidToken},
		{"HS256 keyed with the RSA public key PEM", func() string {
			return sign(t, jose.HS256, rsaPEM, k.rsaKid, userClaims())
		}, failure.CodeAuthenticationInvalidToken},
		{"HS256 keyed with the RSA public key DER", func() string {
			return sign(t, jose.HS256, rsaDER, k.rsaKid, userClaims())
		}, failure.CodeAuthenticationInvalidToken},
		{"HS512 is not an accepted algorithm", func() string { return sign(t, jose.HS512, append(devSecret, devSecret...), "", userClaims()) }, failure.CodeAuthenticationInvalidToken},
		{"RS256 header naming the EC key", func() string { return sign(t, jose.RS256, k.rsa, k.ecKid, userClaims()) }, failure.CodeAuthenticationInvalidToken},
		{"unknown kid", func() string { return sign(t, jose.RS256, k.rsaOther, "rsa-9", userClaims()) }, failure.CodeAuthenticationUnknownKey},
		{"RS256 bad signature under a trusted kid", func() string { return sign(t, jose.RS256, k.rsaOther, k.rsaKid, userClaims()) }, failure.CodeAuthenticationInvalidToken},
		{"embedded jwk header is ignored", func() string {
			opts := (&jose.SignerOptions{EmbedJWK: true}).WithType("JWT")
			s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: k.rsaOther}, opts)
			must(t, err)
			return mustSerialize(t, s, userClaims())
		}, failure.CodeAuthenticationInvalidToken},
		{"HS256 bad signature", func() string {
			return signHS(t, []byte("another-secret-0123456789abcdef-0123"), userClaims())
		}, failure.CodeAuthenticationInvalidToken},
		{"payload swapped after signing", func() string {
			good := strings.Split(signHS(t, devSecret, userClaims()), ".")
			other := strings.Split(signHS(t, devSecret, with(userClaims(), "tenant", "globex")), ".")
			return good[0] + "." + other[1] + "." + good[2]
		}, failure.CodeAuthenticationInvalidToken},
		{"oversized", func() string {
			return signHS(t, devSecret, with(userClaims(), "pad", strings.Repeat("x", DefaultMaxTokenBytes)))
		}, failure.CodeAuthenticationTokenTooLarge},
		{"malformed: one part", func() string { return "garbage" }, failure.CodeAuthenticationInvalidToken},
		{"malformed: three junk parts", func() string { return "a.b.c" }, failure.CodeAuthenticationInvalidToken},
		{"malformed: five parts (JWE shape)", func() string { return "a.b.c.d.e" }, failure.CodeAuthenticationInvalidToken},
		{"malformed: claims not JSON", func() string {
			s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: devSecret}, nil)
			must(t, err)
			jws, err := s.Sign([]byte("not json"))
			must(t, err)
			out, err := jws.CompactSerialize()
			must(t, err)
			return out
		}, failure.CodeAuthenticationInvalidToken},
		{"exp is a string", func() string { return signHS(t, devSecret, with(userClaims(), "exp", "tomorrow")) }, failure.CodeAuthenticationInvalidToken},
		{"missing sub", func() string { return signHS(t, devSecret, with(userClaims(), "sub", nil)) }, failure.CodeAuthenticationMissingClaim},
		{"missing tenant", func() string { return signHS(t, devSecret, with(userClaims(), "tenant", nil)) }, failure.CodeAuthenticationMissingClaim},
		{"empty tenant", func() string { return signHS(t, devSecret, with(userClaims(), "tenant", "")) }, failure.CodeAuthenticationMissingClaim},
		{"act without sub", func() string {
			return signHS(t, devSecret, with(userClaims(), "act", map[string]any{"mandate_model": "m"}))
		}, failure.CodeAuthenticationMissingClaim},
		{"nested act (an agent acting through an agent)", func() string {
			return signHS(t, devSecret, with(userClaims(), "act", map[string]any{"sub": "outer-bot", "act": map[string]any{"sub": "inner-bot"}}))
		}, failure.CodeAuthenticationInvalidToken},
		{"service token signed with the service secret", func() string {
			return signHS(t, serviceSecret, serviceClaims("gateway"))
		}, failure.CodeAuthenticationInvalidToken},
		{"service claim on a token signed with the dev secret", func() string {
			return signHS(t, devSecret, with(userClaims(), "mandate_service", "gateway"))
		}, failure.CodeAuthenticationInvalidToken},
		{"null service claim still marks a service token", func() string {
			return signHS(t, devSecret, with(userClaims(), "mandate_service", explicitNull{}))
		}, failure.CodeAuthenticationInvalidToken},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := tc.token()
			p, err := v.Verify(context.Background(), tok)
			if got := ErrorCode(err); got != tc.code {
				t.Fatalf("code = %q (err %v), want %q", got, err, tc.code)
			}
			if !errors.Is(err, &Error{Code: tc.code}) {
				t.Errorf("errors.Is(err, &Error{Code: %q}) = false", tc.code)
			}
			if p != (Principal{}) {
				t.Errorf("refused token still produced principal %+v", p)
			}
			msg := err.Error()
			if len(tok) > 8 && strings.Contains(msg, tok) {
				t.Errorf("error message contains the token")
			}
			for _, secret := range [][]byte{devSecret, serviceSecret} {
				if strings.Contains(msg, string(secret)) {
					t.Errorf("error message contains a secret")
				}
			}
		})
	}
}

func mustSerialize(tb testing.TB, s jose.Signer, claims map[string]any) string {
	tb.Helper()
	b, err := jsonMarshal(claims)
	must(tb, err)
	jws, err := s.Sign(b)
	must(tb, err)
	out, err := jws.CompactSerialize()
	must(tb, err)
	return out
}

func TestVerifyAccepts(t *testing.T) {
	k := getKeys(t)
	v := newTestVerifier(t, t.TempDir())
	exp := testNow.Add(time.Hour).Truncate(time.Second)
	user := Principal{
		Kind: KindUser, Tenant: testTenant, Org: "sales", UserID: "u-42",
		Issuer: testIssuer, TokenID: "tok-1", ExpiresAt: exp,
	}
	agentClaims := with(userClaims(), "act", map[string]any{
		"sub": "agent-7", "mandate_model": "claude-x", "mandate_model_version": "2026-01",
	})
	agent := user
	agent.Kind, agent.AgentID, agent.Model, agent.ModelVersion = KindAgent, "agent-7", "claude-x", "2026-01"

	tests := []struct {
		name  string
		token string
		want  Principal
	}{
		{"HS256 user", signHS(t, devSecret, userClaims()), user},
		{"HS256 agent with act claim", signHS(t, devSecret, agentClaims), agent},
		{"RS256 from the JWKS file", sign(t, jose.RS256, k.rsa, k.rsaKid, userClaims()), user},
		{"ES256 from the JWKS file", sign(t, jose.ES256, k.ec, k.ecKid, agentClaims), agent},
		{"EdDSA from the JWKS file", sign(t, jose.EdDSA, k.ed, k.edKid, userClaims()), user},
		{"RS256 without kid uses the only RSA key", sign(t, jose.RS256, k.rsa, "", userClaims()), user},
		{"audience as a plain string, second configured value", signHS(t, devSecret, with(userClaims(), "aud", "other-api")), user},
		{"audience list intersecting on one value", signHS(t, devSecret, with(userClaims(), "aud", []string{"x", testAudience})), user},
		{"expired but within leeway", signHS(t, devSecret, with(userClaims(), "exp", testNow.Add(-10*time.Second).Unix())),
			withExpiry(user, testNow.Add(-10*time.Second))},
		{"nbf in the future within leeway", signHS(t, devSecret, with(userClaims(), "nbf", testNow.Add(10*time.Second).Unix())), user},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := v.Verify(context.Background(), tc.token)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if !got.ExpiresAt.Equal(tc.want.ExpiresAt) {
				t.Errorf("ExpiresAt = %v, want %v", got.ExpiresAt, tc.want.ExpiresAt)
			}
			got.ExpiresAt = tc.want.ExpiresAt
			if iat := userClaims()["iat"]; iat != nil && got.IssuedAt.Unix() != iat.(int64) {
				t.Errorf("IssuedAt = %v, want the iat claim %v", got.IssuedAt, iat)
			}
			got.IssuedAt = time.Time{}
			if got != tc.want {
				t.Errorf("principal = %+v\nwant        %+v", got, tc.want)
			}
		})
	}
}

func withExpiry(p Principal, t time.Time) Principal {
	p.ExpiresAt = t
	return p
}

func TestVerifierWithoutDevSecretRefusesHS256(t *testing.T) {
	k := getKeys(t)
	v, err := NewVerifier(context.Background(), Config{
		Audience: []string{testAudience},
		Issuers:  []string{testIssuer},
		JWKSFile: writeFile(t, t.TempDir(), trustedJWKS(t)),
		Now:      fixedNow,
	})
	must(t, err)
	tests := []struct {
		name  string
		token string
		code  string
	}{
		{"HS256 keyed with the RSA public key PEM", sign(t, jose.HS256, rsaPublicPEM(t, &k.rsa.PublicKey), k.rsaKid, userClaims()), failure.CodeAuthenticationInvalidToken},
		{"HS256 with any secret", signHS(t, devSecret, userClaims()), failure.CodeAuthenticationInvalidToken},
		{"RS256 still accepted", sign(t, jose.RS256, k.rsa, k.rsaKid, userClaims()), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.Verify(context.Background(), tc.token)
			if got := ErrorCode(err); got != tc.code {
				t.Fatalf("code = %q (err %v), want %q", got, err, tc.code)
			}
		})
	}
}

func TestMaxTokenBytesIsConfigurable(t *testing.T) {
	v, err := NewVerifier(context.Background(), Config{
		Audience: []string{testAudience}, Issuers: []string{testIssuer},
		DevSecret: devSecret, MaxTokenBytes: 100, Now: fixedNow,
	})
	must(t, err)
	_, err = v.Verify(context.Background(), signHS(t, devSecret, userClaims()))
	if got := ErrorCode(err); got != failure.CodeAuthenticationTokenTooLarge {
		t.Fatalf("code = %q, want %q", got, failure.CodeAuthenticationTokenTooLarge)
	}
}

func TestNewVerifierRejectsBadConfig(t *testing.T) {
	dir := t.TempDir()
	weak, err := rsa.GenerateKey(randReader(), 1024)
	must(t, err)
	octJWKS := `{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"h"}]}`
	base := func() Config {
		return Config{Audience: []string{testAudience}, Issuers: []string{testIssuer}, DevSecret: devSecret}
	}
	tests := []struct {
		name   string
		mutate func(*Config)
	}{
		{"no audience", func(c *Config) { c.Audience = nil }},
		{"empty audience value", func(c *Config) { c.Audience = []string{""} }},
		{"no issuers", func(c *Config) { c.Issuers = nil }},
		{"no key source", func(c *Config) { c.DevSecret = nil }},
		{"short dev secret", func(c *Config) { c.DevSecret = []byte("short") }},
		{"negative leeway", func(c *Config) { c.Leeway = -time.Second }},
		{"missing JWKS file", func(c *Config) { c.JWKSFile = dir + "/nope.json" }},
		{"JWKS with an HMAC key", func(c *Config) { c.JWKSFile = writeFile(t, t.TempDir(), []byte(octJWKS)) }},
		{"JWKS with a weak RSA key", func(c *Config) {
			c.JWKSFile = writeFile(t, t.TempDir(), publicJWKS(t, jose.JSONWebKey{Key: weak, KeyID: "weak"}))
		}},
		{"JWKS that is not JSON", func(c *Config) { c.JWKSFile = writeFile(t, t.TempDir(), []byte("nope")) }},
		{"JWKS without usable keys", func(c *Config) { c.JWKSFile = writeFile(t, t.TempDir(), []byte(`{"keys":[]}`)) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.mutate(&cfg)
			if _, err := NewVerifier(context.Background(), cfg); err == nil {
				t.Fatal("NewVerifier accepted a bad config")
			}
		})
	}
}

func TestJWKSFileKeepsPublicHalfAndSkipsEncryptionKeys(t *testing.T) {
	k := getKeys(t)
	// A private key and an encryption key in the file: the first is reduced
	// to its public half, the second ignored.
	b, err := jsonMarshal(map[string]any{"keys": []any{
		jose.JSONWebKey{Key: k.ec, KeyID: k.ecKid, Use: "sig"},
		jose.JSONWebKey{Key: &k.rsa.PublicKey, KeyID: k.rsaKid, Use: "enc"},
	}})
	must(t, err)
	v, err := NewVerifier(context.Background(), Config{
		Audience: []string{testAudience}, Issuers: []string{testIssuer},
		JWKSFile: writeFile(t, t.TempDir(), b), Now: fixedNow,
	})
	must(t, err)
	tests := []struct {
		name  string
		token string
		code  string
	}{
		{"ES256 verifies with the public half", sign(t, jose.ES256, k.ec, k.ecKid, userClaims()), ""},
		{"RS256 with an encryption-only key", sign(t, jose.RS256, k.rsa, k.rsaKid, userClaims()), failure.CodeAuthenticationUnknownKey},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.Verify(context.Background(), tc.token)
			if got := ErrorCode(err); got != tc.code {
				t.Fatalf("code = %q (err %v), want %q", got, err, tc.code)
			}
		})
	}
	for _, key := range v.keys.static {
		if !key.IsPublic() {
			t.Errorf("key %q kept private material", key.KeyID)
		}
	}
}

func TestMintDevRoundTrip(t *testing.T) {
	v := newTestVerifier(t, t.TempDir())
	tests := []struct {
		name string
		req  MintRequest
		want Principal
	}{
		{"user", MintRequest{Issuer: testIssuer, Audience: testAudience, User: "u-1", Tenant: testTenant, Org: "ops", TTL: time.Minute, Now: testNow},
			Principal{Kind: KindUser, Tenant: testTenant, Org: "ops", UserID: "u-1", Issuer: testIssuer, ExpiresAt: testNow.Add(time.Minute)}},
		{"agent", MintRequest{Issuer: testIssuer, Audience: testAudience, User: "u-1", Tenant: testTenant, Agent: "a-1", Model: "m", ModelVersion: "v1", Now: testNow},
			Principal{Kind: KindAgent, Tenant: testTenant, UserID: "u-1", AgentID: "a-1", Model: "m", ModelVersion: "v1", Issuer: testIssuer, ExpiresAt: testNow.Add(DefaultTTL)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok1, err := MintDev(devSecret, tc.req)
			must(t, err)
			tok2, err := MintDev(devSecret, tc.req)
			must(t, err)
			p1, err := v.Verify(context.Background(), tok1)
			must(t, err)
			p2, err := v.Verify(context.Background(), tok2)
			must(t, err)
			if p1.TokenID == "" || p1.TokenID == p2.TokenID {
				t.Errorf("jti not random: %q, %q", p1.TokenID, p2.TokenID)
			}
			p1.TokenID = ""
			if !p1.ExpiresAt.Equal(tc.want.ExpiresAt) {
				t.Errorf("ExpiresAt = %v, want %v", p1.ExpiresAt, tc.want.ExpiresAt)
			}
			p1.ExpiresAt = tc.want.ExpiresAt
			if !p1.IssuedAt.Equal(tc.req.Now.Truncate(time.Second)) {
				t.Errorf("IssuedAt = %v, want %v", p1.IssuedAt, tc.req.Now)
			}
			p1.IssuedAt = time.Time{}
			if p1 != tc.want {
				t.Errorf("principal = %+v\nwant        %+v", p1, tc.want)
			}
		})
	}
}

func TestMintDevRejectsBadRequests(t *testing.T) {
	ok := MintRequest{Issuer: testIssuer, Audience: testAudience, User: "u", Tenant: testTenant}
	tests := []struct {
		name   string
		secret []byte
		mutate func(*MintRequest)
	}{
		{"short secret", []byte("short"), func(*MintRequest) {}},
		{"no issuer", devSecret, func(r *MintRequest) { r.Issuer = "" }},
		{"no audience", devSecret, func(r *MintRequest) { r.Audience = "" }},
		{"no user", devSecret, func(r *MintRequest) { r.User = "" }},
		{"no tenant", devSecret, func(r *MintRequest) { r.Tenant = "" }},
		{"model without agent", devSecret, func(r *MintRequest) { r.Model = "m" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.mutate(&r)
			if tok, err := MintDev(tc.secret, r); err == nil {
				t.Fatalf("MintDev accepted a bad request, minted %d bytes", len(tok))
			}
		})
	}
}

func TestPrincipalSubject(t *testing.T) {
	tests := []struct {
		name string
		p    Principal
		want string
	}{
		{"user", Principal{Kind: KindUser, UserID: "u"}, "user:u"},
		{"agent acts, not its user", Principal{Kind: KindAgent, UserID: "u", AgentID: "a"}, "agent:a"},
		{"service", Principal{Kind: KindService, ServiceName: "gw"}, "service:gw"},
		{"zero", Principal{}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Subject(); got != tc.want {
				t.Errorf("Subject() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestContextHelpers(t *testing.T) {
	ctx := context.Background()
	if _, ok := FromContext(ctx); ok {
		t.Error("FromContext on a bare context reported a principal")
	}
	if _, ok := RawTokenFromContext(ctx); ok {
		t.Error("RawTokenFromContext on a bare context reported a token")
	}
	p := Principal{Kind: KindUser, UserID: "u", Tenant: testTenant}
	ctx = WithRawToken(WithPrincipal(ctx, p), "tok")
	if got, ok := FromContext(ctx); !ok || got != p {
		t.Errorf("FromContext = %+v, %v", got, ok)
	}
	if got, ok := RawTokenFromContext(ctx); !ok || got != "tok" {
		t.Errorf("RawTokenFromContext = %q, %v", got, ok)
	}
}

func TestErrorCodeAndWrapping(t *testing.T) {
	cause := errors.New("boom")
	e := newError(failure.CodeAuthenticationUnknownKey, "signing key is unknown", cause)
	wrapped := errors.Join(errors.New("context"), e)
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"direct", e, failure.CodeAuthenticationUnknownKey},
		{"wrapped", wrapped, failure.CodeAuthenticationUnknownKey},
		{"foreign", cause, ""},
		{"nil", nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ErrorCode(tc.err); got != tc.want {
				t.Errorf("ErrorCode = %q, want %q", got, tc.want)
			}
		})
	}
	if !errors.Is(e, cause) {
		t.Error("cause not reachable through Unwrap")
	}
	if strings.Contains(e.Error(), "boom") {
		t.Error("Error() leaks the internal cause")
	}
}

func TestDevOnlyVerifierRefusesAsymmetricTokens(t *testing.T) {
	k := getKeys(t)
	v, err := NewVerifier(context.Background(), Config{
		Audience: []string{testAudience}, Issuers: []string{testIssuer}, DevSecret: devSecret, Now: fixedNow,
	})
	must(t, err)
	tests := []struct {
		name  string
		token string
		code  string
	}{
		{"RS256", sign(t, jose.RS256, k.rsa, k.rsaKid, userClaims()), failure.CodeAuthenticationInvalidToken},
		{"ES256", sign(t, jose.ES256, k.ec, k.ecKid, userClaims()), failure.CodeAuthenticationInvalidToken},
		{"EdDSA", sign(t, jose.EdDSA, k.ed, k.edKid, userClaims()), failure.CodeAuthenticationInvalidToken},
		{"HS256 still accepted", signHS(t, devSecret, userClaims()), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.Verify(context.Background(), tc.token)
			if got := ErrorCode(err); got != tc.code {
				t.Fatalf("code = %q (err %v), want %q", got, err, tc.code)
			}
		})
	}
}
