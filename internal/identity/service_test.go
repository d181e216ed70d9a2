package identity

import (
	"context"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/mandate-dev/mandate/internal/failure"
)

// TestUserAndServiceTokensNeverCross proves both directions: a user or
// agent token never verifies as a service, and a service token never
// verifies as a user.
func TestUserAndServiceTokensNeverCross(t *testing.T) {
	k := getKeys(t)
	users := newTestVerifier(t, t.TempDir())
	services := newTestServiceVerifier(t)

	svcToken, err := mintService(serviceSecret, testIssuer, testAudience, "gateway", time.Hour, testNow)
	must(t, err)
	agentToken, err := MintDev(devSecret, MintRequest{
		Issuer: testIssuer, Audience: testAudience, User: "u-1", Tenant: testTenant,
		Agent: "a-1", Model: "m", Now: testNow,
	})
	must(t, err)

	type verifyFunc func(context.Context, string) (Principal, error)
	tests := []struct {
		name   string
		verify verifyFunc
		token  string
		code   string
	}{
		// Service tokens against the user verifier.
		{"service token as user", users.Verify, svcToken, failure.CodeAuthenticationInvalidToken},
		{"service claims signed with the dev secret as user", users.Verify, signHS(t, devSecret, serviceClaims("gateway")), failure.CodeAuthenticationInvalidToken},
		// User and agent tokens against the service verifier.
		{"user token as service", services.Verify, signHS(t, devSecret, userClaims()), failure.CodeAuthenticationNotAService},
		{"agent token as service", services.Verify, agentToken, failure.CodeAuthenticationNotAService},
		{"RS256 user token as service", services.Verify, sign(t, jose.RS256, k.rsa, k.rsaKid, userClaims()), failure.CodeAuthenticationNotAService},
		{"user token with a forged service claim as service", services.Verify, signHS(t, devSecret, serviceClaims("gateway")), failure.CodeAuthenticationNotAService},
		{"user claims signed with the service secret as service", services.Verify, signHS(t, serviceSecret, userClaims()), failure.CodeAuthenticationNotAService},
		{"service token whose sub disagrees", services.Verify, signHS(t, serviceSecret, with(serviceClaims("gateway"), "sub", "u-42")), failure.CodeAuthenticationNotAService},
		{"empty service claim", services.Verify, signHS(t, serviceSecret, serviceClaims("")), failure.CodeAuthenticationNotAService},
		// The shared checks still apply to service tokens.
		{"expired service token", services.Verify, signHS(t, serviceSecret, with(serviceClaims("gateway"), "exp", testNow.Add(-time.Hour).Unix())), failure.CodeAuthenticationTokenExpired},
		{"service token for another audience", services.Verify, signHS(t, serviceSecret, with(serviceClaims("gateway"), "aud", "billing")), failure.CodeAuthenticationWrongAudience},
		{"service token from another issuer", services.Verify, signHS(t, serviceSecret, with(serviceClaims("gateway"), "iss", "x")), failure.CodeAuthenticationWrongIssuer},
		{"alg none service token", services.Verify, unsignedToken(t, serviceClaims("gateway")), failure.CodeAuthenticationInvalidToken},
		{"oversized service token", services.Verify, signHS(t, serviceSecret, with(serviceClaims("gateway"), "pad", string(make([]byte, DefaultMaxTokenBytes)))), failure.CodeAuthenticationTokenTooLarge},
		// And the happy paths, so the refusals above are not vacuous.
		{"service token as service", services.Verify, svcToken, ""},
		{"agent token as user", users.Verify, agentToken, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := tc.verify(context.Background(), tc.token)
			if got := ErrorCode(err); got != tc.code {
				t.Fatalf("code = %q (err %v), want %q", got, err, tc.code)
			}
			if tc.code != "" && p != (Principal{}) {
				t.Errorf("refused token produced principal %+v", p)
			}
		})
	}
}

func TestServiceVerifierPrincipal(t *testing.T) {
	v := newTestServiceVerifier(t)
	tok, err := mintService(serviceSecret, testIssuer, testAudience, "gateway", time.Minute, testNow)
	must(t, err)
	p, err := v.Verify(context.Background(), tok)
	must(t, err)
	if p.Kind != KindService || p.ServiceName != "gateway" || p.Subject() != "service:gateway" ||
		p.Tenant != "" || p.UserID != "" || !p.ExpiresAt.Equal(testNow.Add(time.Minute)) || p.TokenID == "" {
		t.Errorf("principal = %+v", p)
	}
}

func TestMintServiceRejectsBadInput(t *testing.T) {
	tests := []struct {
		name                    string
		secret                  []byte
		issuer, audience, svcNm string
	}{
		{"short secret", []byte("short"), testIssuer, testAudience, "gw"},
		{"no issuer", serviceSecret, "", testAudience, "gw"},
		{"no audience", serviceSecret, testIssuer, "", "gw"},
		{"empty name", serviceSecret, testIssuer, testAudience, ""},
		{"name with spaces", serviceSecret, testIssuer, testAudience, "my service"},
		{"name with colon", serviceSecret, testIssuer, testAudience, "a:b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := MintService(tc.secret, tc.issuer, tc.audience, tc.svcNm, time.Minute); err == nil {
				t.Fatal("MintService accepted bad input")
			}
		})
	}
}

func TestNewServiceVerifierRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  ServiceConfig
	}{
		{"no secret", ServiceConfig{Audience: []string{"a"}, Issuers: []string{"i"}}},
		{"short secret", ServiceConfig{Secret: []byte("short"), Audience: []string{"a"}, Issuers: []string{"i"}}},
		{"no audience", ServiceConfig{Secret: serviceSecret, Issuers: []string{"i"}}},
		{"no issuers", ServiceConfig{Secret: serviceSecret, Audience: []string{"a"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewServiceVerifier(tc.cfg); err == nil {
				t.Fatal("NewServiceVerifier accepted a bad config")
			}
		})
	}
}

func TestServiceTokenSourceCachesForHalfItsLifetime(t *testing.T) {
	src, err := NewServiceTokenSource(serviceSecret, testIssuer, testAudience, "gateway", time.Hour)
	must(t, err)
	now := testNow
	src.now = func() time.Time { return now }
	src.token = "" // force a mint on the fake clock
	first, err := src.Token(context.Background())
	must(t, err)
	tests := []struct {
		name    string
		advance time.Duration
		same    bool
	}{
		{"reused before half-life", 29 * time.Minute, true},
		{"renewed after half-life", 2 * time.Minute, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now = now.Add(tc.advance)
			got, err := src.Token(context.Background())
			must(t, err)
			if (got == first) != tc.same {
				t.Errorf("token reused = %v, want %v", got == first, tc.same)
			}
		})
	}
	if _, err := NewServiceTokenSource(serviceSecret, testIssuer, testAudience, "bad name", time.Hour); err == nil {
		t.Error("NewServiceTokenSource accepted an invalid service name")
	}
}

func TestNewAuthenticatorRejectsSharedSecret(t *testing.T) {
	users := newTestVerifier(t, t.TempDir())
	shared, err := NewServiceVerifier(ServiceConfig{Secret: devSecret, Audience: []string{testAudience}, Issuers: []string{testIssuer}})
	must(t, err)
	tests := []struct {
		name    string
		cfg     AuthenticatorConfig
		wantErr bool
	}{
		{"no users verifier", AuthenticatorConfig{Services: newTestServiceVerifier(t)}, true},
		{"service secret equals dev secret", AuthenticatorConfig{Users: users, Services: shared}, true},
		{"service-only without services", AuthenticatorConfig{Users: users, AllowServiceOnly: true}, true},
		{"separate secrets", AuthenticatorConfig{Users: users, Services: newTestServiceVerifier(t)}, false},
		{"users only", AuthenticatorConfig{Users: users}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewAuthenticator(tc.cfg)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
		})
	}
}

// TestCallerInContext: the principal and the token to forward are set and
// read independently, the latest of each wins, and an empty token is none.
func TestCallerInContext(t *testing.T) {
	alice, bob := Principal{Kind: KindUser, Tenant: "acme", UserID: "alice"}, Principal{Kind: KindUser, Tenant: "acme", UserID: "bob"}
	bg := context.Background()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		want    Principal
		wantOK  bool
		wantTok string
	}{
		{"nothing", bg, Principal{}, false, ""},
		{"principal only", WithPrincipal(bg, alice), alice, true, ""},
		{"token only", WithRawToken(bg, "t1"), Principal{}, false, "t1"},
		{"token then principal", WithPrincipal(WithRawToken(bg, "t1"), alice), alice, true, "t1"},
		{"principal then token", WithRawToken(WithPrincipal(bg, alice), "t1"), alice, true, "t1"},
		{"middleware's user", withUser(bg, "t1", alice), alice, true, "t1"},
		{"latest principal", WithPrincipal(withUser(bg, "t1", alice), bob), bob, true, "t1"},
		{"latest token", WithRawToken(withUser(bg, "t1", alice), "t2"), alice, true, "t2"},
		{"empty token", WithRawToken(withUser(bg, "t1", alice), ""), alice, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := FromContext(tc.ctx)
			if p != tc.want || ok != tc.wantOK {
				t.Errorf("FromContext = %+v, %v; want %+v, %v", p, ok, tc.want, tc.wantOK)
			}
			tok, ok := RawTokenFromContext(tc.ctx)
			if tok != tc.wantTok || ok != (tc.wantTok != "") {
				t.Errorf("RawTokenFromContext = %q, %v; want %q", tok, ok, tc.wantTok)
			}
		})
	}
}
