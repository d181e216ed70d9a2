package directory_test

import (
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/directory/directorytest"
	"github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/directory/postgres"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

// BenchmarkResolve resolves an agent acting for a user with two roles: straight from each
// store, and through a Cache in front of it (every call after the first is a hit).
func BenchmarkResolve(b *testing.B) {
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
			b.Run("uncached", func(b *testing.B) {
				benchResolve(b, directory.Direct(s))
			})
			b.Run("cached", func(b *testing.B) {
				c := directory.NewCache(s, directory.CacheOptions{TTL: time.Hour})
				defer c.Close()
				benchResolve(b, c)
			})
		})
	}
}

func benchResolve(b *testing.B, r directory.Resolver) {
	b.ReportAllocs()
	for b.Loop() {
		res, err := r.Resolve(ctx, "acme", "alice", "support-bot")
		if err != nil || !res.Active {
			b.Fatalf("%+v, %v", res, err)
		}
	}
}
