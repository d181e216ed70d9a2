package identity

import (
	"context"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// FuzzVerify feeds arbitrary strings to a Verifier that trusts the dev
// secret and RSA, EC and Ed25519 keys. It must never panic, every refusal
// must carry a code and must not echo the input, and anything accepted must
// be a well-formed principal of the only tenant any trusted key signed for.
func FuzzVerify(f *testing.F) {
	k := getKeys(f)
	v := newTestVerifier(f, f.TempDir())
	agent := with(userClaims(), "act", map[string]any{"sub": "agent-7", "mandate_model": "m", "mandate_model_version": "1"})
	seeds := []string{
		signHS(f, devSecret, userClaims()),
		signHS(f, devSecret, agent),
		sign(f, jose.RS256, k.rsa, k.rsaKid, userClaims()),
		sign(f, jose.ES256, k.ec, k.ecKid, agent),
		sign(f, jose.EdDSA, k.ed, k.edKid, userClaims()),
		sign(f, jose.RS256, k.rsa, "", userClaims()),
		// Refused for a reason each.
		signHS(f, devSecret, with(userClaims(), "exp", testNow.Add(-time.Hour).Unix())),
		signHS(f, devSecret, with(userClaims(), "tenant", nil)),
		signHS(f, devSecret, with(userClaims(), "aud", "elsewhere")),
		signHS(f, devSecret, with(userClaims(), "mandate_service", "gw")),
		signHS(f, serviceSecret, serviceClaims("gw")),
		signHS(f, []byte("untrusted-secret-0123456789abcdef-01"), with(userClaims(), "tenant", "globex")),
		sign(f, jose.HS256, rsaPublicPEM(f, &k.rsa.PublicKey), k.rsaKid, with(userClaims(), "tenant", "globex")),
		sign(f, jose.RS256, k.rsaOther, "rsa-9", with(userClaims(), "tenant", "globex")),
		unsignedToken(f, with(userClaims(), "tenant", "globex")),
		"",
		".",
		"..",
		"a.b.c",
		"a.b.c.d.e",
		"eyJhbGciOiJIUzI1NiJ9.e30.",
		"eyJhbGciOiJIUzI1NiIsImNyaXQiOlsiZXhwIl19.e30.AAAA",
		"eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.",
		"\x00\xff.\x00.\x00",
		strings.Repeat("A", DefaultMaxTokenBytes+1),
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		p, err := v.Verify(context.Background(), tok)
		if err != nil {
			if ErrorCode(err) == "" {
				t.Fatalf("refusal without a code: %v", err)
			}
			if len(tok) >= 16 && strings.Contains(err.Error(), tok) {
				t.Fatalf("error echoes the token: %v", err)
			}
			if p != (Principal{}) {
				t.Fatalf("refusal with a principal: %+v", p)
			}
			return
		}
		if p.Tenant != testTenant {
			t.Fatalf("accepted a token for tenant %q", p.Tenant)
		}
		if p.UserID == "" || (p.Kind != KindUser && p.Kind != KindAgent) || (p.Kind == KindAgent) != (p.AgentID != "") {
			t.Fatalf("accepted a malformed principal: %+v", p)
		}
	})
}
