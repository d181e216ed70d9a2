package directory_test

import (
	"context"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/directory/directorytest"
	"github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/directory/postgres"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

// BenchmarkVerifyAndResolve is what every governed call pays before its
// first pipeline stage: verify an agent's HS256 token, then resolve the
// principal's permissions and features, uncached and through the Cache.
func BenchmarkVerifyAndResolve(b *testing.B) {
	secret := []byte("0123456789abcdef0123456789abcdef-bench")
	v, err := identity.NewVerifier(context.Background(), identity.Config{
		Audience: []string{"mandate"}, Issuers: []string{"bench"}, DevSecret: secret,
	})
	if err != nil {
		b.Fatal(err)
	}
	tok, err := identity.MintDev(secret, identity.MintRequest{
		Issuer: "bench", Audience: "mandate", User: "alice", Tenant: "acme",
		Agent: "support-bot", Model: "m", ModelVersion: "1", TTL: time.Hour, Now: time.Now(),
	})
	if err != nil {
		b.Fatal(err)
	}
	stores := []struct {
		name string
		open func(b *testing.B) directory.Store
	}{
		{"memory", func(b *testing.B) directory.Store { return memory.New() }},
		{"postgres", func(b *testing.B) directory.Store {
			s := postgres.New(pgtest.New(b, postgres.Migrations), postgres.Options{})
			b.Cleanup(s.Close)
			return s
		}},
	}
	for _, st := range stores {
		b.Run(st.name, func(b *testing.B) {
			s := st.open(b)
			if _, err := directory.Apply(ctx, s, []byte(directorytest.Seed)); err != nil {
				b.Fatal(err)
			}
			run := func(b *testing.B, r directory.Resolver) {
				b.ReportAllocs()
				for b.Loop() {
					p, err := v.Verify(ctx, tok)
					if err != nil {
						b.Fatal(err)
					}
					res, err := r.Resolve(ctx, p.Tenant, p.UserID, p.AgentID)
					if err != nil || !res.Active {
						b.Fatalf("%+v, %v", res, err)
					}
				}
			}
			b.Run("uncached", func(b *testing.B) { run(b, directory.Direct(s)) })
			b.Run("cached", func(b *testing.B) {
				c := directory.NewCache(s, directory.CacheOptions{TTL: time.Hour})
				defer c.Close()
				run(b, c)
			})
		})
	}
}
