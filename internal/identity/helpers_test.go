package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	testIssuer   = "https://id.mandate.test"
	testAudience = "mandate-api"
	testTenant   = "acme"
)

var (
	testNow       = time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	devSecret     = []byte("dev-secret-0123456789abcdef-0123456789")
	serviceSecret = []byte("service-secret-0123456789abcdef-012345")
)

// testKeys are generated once: RSA generation dominates test time otherwise.
type testKeys struct {
	rsa      *rsa.PrivateKey
	rsaKid   string
	ec       *ecdsa.PrivateKey
	ecKid    string
	ed       ed25519.PrivateKey
	edKid    string
	rsaOther *rsa.PrivateKey // a key nobody trusts
}

var (
	keysOnce sync.Once
	keys     testKeys
)

func getKeys(tb testing.TB) testKeys {
	tb.Helper()
	keysOnce.Do(func() {
		var err error
		keys.rsa, err = rsa.GenerateKey(rand.Reader, 2048)
		must(tb, err)
		keys.rsaOther, err = rsa.GenerateKey(rand.Reader, 2048)
		must(tb, err)
		keys.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		must(tb, err)
		_, keys.ed, err = ed25519.GenerateKey(rand.Reader)
		must(tb, err)
		keys.rsaKid, keys.ecKid, keys.edKid = "rsa-1", "ec-1", "ed-1"
	})
	return keys
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

// publicJWKS returns the JWK Set JSON with the public halves of ks.
func publicJWKS(tb testing.TB, ks ...jose.JSONWebKey) []byte {
	tb.Helper()
	set := jose.JSONWebKeySet{}
	for _, k := range ks {
		set.Keys = append(set.Keys, k.Public())
	}
	b, err := json.Marshal(set)
	must(tb, err)
	return b
}

func trustedJWKS(tb testing.TB) []byte {
	k := getKeys(tb)
	return publicJWKS(tb,
		jose.JSONWebKey{Key: k.rsa, KeyID: k.rsaKid, Use: "sig"},
		jose.JSONWebKey{Key: k.ec, KeyID: k.ecKid, Use: "sig"},
		jose.JSONWebKey{Key: k.ed, KeyID: k.edKid, Use: "sig"},
	)
}

func writeFile(tb testing.TB, dir string, b []byte) string {
	tb.Helper()
	p := filepath.Join(dir, "jwks.json")
	must(tb, os.WriteFile(p, b, 0o600))
	return p
}

func fixedNow() time.Time { return testNow }

// newTestVerifier trusts the dev secret and the RSA, EC and Ed25519 keys.
func newTestVerifier(tb testing.TB, dir string) *Verifier {
	tb.Helper()
	v, err := NewVerifier(context.Background(), Config{
		Audience:  []string{testAudience, "other-api"},
		Issuers:   []string{testIssuer},
		DevSecret: devSecret,
		JWKSFile:  writeFile(tb, dir, trustedJWKS(tb)),
		Now:       fixedNow,
	})
	must(tb, err)
	return v
}

func newTestServiceVerifier(tb testing.TB) *ServiceVerifier {
	tb.Helper()
	v, err := NewServiceVerifier(ServiceConfig{
		Secret:   serviceSecret,
		Audience: []string{testAudience},
		Issuers:  []string{testIssuer},
		Now:      fixedNow,
	})
	must(tb, err)
	return v
}

// userClaims are valid user claims at testNow; cases mutate a copy.
func userClaims() map[string]any {
	return map[string]any{
		"iss":    testIssuer,
		"sub":    "u-42",
		"aud":    []string{testAudience},
		"exp":    testNow.Add(time.Hour).Unix(),
		"nbf":    testNow.Add(-time.Minute).Unix(),
		"iat":    testNow.Add(-time.Minute).Unix(),
		"jti":    "tok-1",
		"tenant": testTenant,
		"org":    "sales",
	}
}

func serviceClaims(name string) map[string]any {
	c := userClaims()
	delete(c, "tenant")
	delete(c, "org")
	c["sub"] = "service:" + name
	c["mandate_service"] = name
	return c
}

// sign serialises claims with the given algorithm, key and kid using
// go-jose, so tests exercise real signatures rather than a home-made copy.
func sign(tb testing.TB, alg jose.SignatureAlgorithm, key any, kid string, claims map[string]any) string {
	tb.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if kid != "" {
		opts = opts.WithHeader("kid", kid)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	must(tb, err)
	tok, err := jwt.Signed(s).Claims(claims).Serialize()
	must(tb, err)
	return tok
}

func signHS(tb testing.TB, secret []byte, claims map[string]any) string {
	tb.Helper()
	return sign(tb, jose.HS256, secret, "", claims)
}

// unsignedToken builds an `alg: none` token by hand: go-jose refuses to
// produce one, which is the point.
func unsignedToken(tb testing.TB, claims map[string]any) string {
	tb.Helper()
	h, err := json.Marshal(map[string]string{"alg": "none", "typ": "JWT"})
	must(tb, err)
	p, err := json.Marshal(claims)
	must(tb, err)
	enc := base64.RawURLEncoding
	return enc.EncodeToString(h) + "." + enc.EncodeToString(p) + "."
}

func with(c map[string]any, kv ...any) map[string]any {
	for i := 0; i < len(kv); i += 2 {
		k := kv[i].(string)
		if kv[i+1] == nil {
			delete(c, k)
			continue
		}
		c[k] = kv[i+1]
	}
	return c
}

func randReader() io.Reader { return rand.Reader }

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
