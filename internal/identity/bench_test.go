package identity

import (
	"context"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
)

// The uncached cases are what every call paid before the token cache; the
// cached ones are what a token seen before costs now.

func BenchmarkVerifyHS256(b *testing.B) {
	tok := signHS(b, devSecret, userClaims())
	benchVerify(b, tok)
}

func BenchmarkVerifyRS256(b *testing.B) {
	k := getKeys(b)
	tok := sign(b, jose.RS256, k.rsa, k.rsaKid, userClaims())
	benchVerify(b, tok)
}

func benchVerify(b *testing.B, tok string) {
	for _, bc := range []struct {
		name string
		size int
	}{{"uncached", -1}, {"cached", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			v, err := NewVerifier(context.Background(), Config{
				Audience:  []string{testAudience},
				Issuers:   []string{testIssuer},
				DevSecret: devSecret,
				JWKSFile:  writeFile(b, b.TempDir(), trustedJWKS(b)),
				Now:       fixedNow,
				CacheSize: bc.size,
			})
			must(b, err)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(ctx, tok); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkVerifyCachedParallel is the cached path under contention, as in
// a service answering many callers with the same few tokens.
func BenchmarkVerifyCachedParallel(b *testing.B) {
	v := newTestVerifier(b, b.TempDir())
	tok := signHS(b, devSecret, userClaims())
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := v.Verify(ctx, tok); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
