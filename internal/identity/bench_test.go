package identity

import (
	"context"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
)

func BenchmarkVerifyHS256(b *testing.B) {
	v := newTestVerifier(b, b.TempDir())
	tok := signHS(b, devSecret, userClaims())
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(ctx, tok); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyRS256(b *testing.B) {
	k := getKeys(b)
	v := newTestVerifier(b, b.TempDir())
	tok := sign(b, jose.RS256, k.rsa, k.rsaKid, userClaims())
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(ctx, tok); err != nil {
			b.Fatal(err)
		}
	}
}
