package confirmtest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/services/confirm"
)

// Retaining is a Backend that bounds what it keeps (confirm.Purger).
type Retaining interface {
	Backend
	confirm.Purger
}

// RunRetention runs the conformance tests of confirm.Purger.
// newBackend must return an empty backend that keeps a challenge for
// retain after its expiry. Time is real, as in Run.
func RunRetention(t *testing.T, newBackend func(t *testing.T, retain time.Duration) Retaining) {
	const (
		ttl    = 50 * time.Millisecond
		retain = 400 * time.Millisecond
	)
	t.Run("PurgeExpired", func(t *testing.T) {
		t.Parallel()
		b := newBackend(t, retain)
		ctx := testCtx(t)
		old := create(t, b, Challenge("acme", "inv-old"), ttl)
		decided := create(t, b, Challenge("acme", "inv-decided"), ttl)
		if _, err := b.Decide(ctx, "acme", decided.ID, confirm.Decision{Approve: true, By: "carol", Channel: confirm.ChannelApprovalPage}); err != nil {
			t.Fatal(err)
		}
		live := create(t, b, Challenge("acme", "inv-live"), time.Hour)
		other := create(t, b, Challenge("globex", "inv-old"), ttl)

		// Expired, within retention: kept, read as EXPIRED.
		time.Sleep(2 * ttl)
		if n, err := b.PurgeExpired(ctx, 100); err != nil || n != 0 {
			t.Fatalf("PurgeExpired within retention = %d, %v; want 0", n, err)
		}
		if got, err := b.Get(ctx, "acme", old.ID); err != nil || got.State != confirm.StateExpired {
			t.Fatalf("an expired challenge within retention: %+v, %v; want it EXPIRED", got, err)
		}

		// Past retention: deleted, at most limit per call, with their
		// notices; the live one stays.
		time.Sleep(retain + ttl)
		if _, err := b.ExpireDue(ctx, 100); err != nil {
			t.Fatal(err)
		}
		if n, err := b.PurgeExpired(ctx, 0); err != nil || n != 0 {
			t.Fatalf("PurgeExpired(limit 0) = %d, %v; want 0", n, err)
		}
		if n, err := b.PurgeExpired(ctx, 2); err != nil || n != 2 {
			t.Fatalf("PurgeExpired(limit 2) = %d, %v; want 2", n, err)
		}
		if n, err := b.PurgeExpired(ctx, 100); err != nil || n != 1 {
			t.Fatalf("PurgeExpired after = %d, %v; want the third", n, err)
		}
		for _, c := range []confirm.Challenge{old, decided, other} {
			if _, err := b.Get(ctx, c.Tenant, c.ID); !errors.Is(err, confirm.ErrNotFound) {
				t.Fatalf("Get of %s/%s past retention: %v, want ErrNotFound", c.Tenant, c.ID, err)
			}
		}
		if _, err := b.Get(ctx, "acme", live.ID); err != nil {
			t.Fatalf("the live challenge: %v", err)
		}
		for _, n := range claim(t, b, time.Hour) {
			if n.ChallengeID != live.ID {
				t.Fatalf("a purged challenge's notice is left: %s", describe([]confirm.Notice{n}))
			}
		}
		// The invocation may open a challenge again.
		if _, created, err := b.Create(ctx, Challenge("acme", "inv-old"), time.Hour); err != nil || !created {
			t.Fatalf("Create for a purged challenge's invocation = (created %v, %v), want a new one", created, err)
		}
	})

	t.Run("PurgeExpiredConcurrently", func(t *testing.T) {
		t.Parallel()
		b := newBackend(t, retain)
		const n = 12
		for i := range n {
			create(t, b, Challenge("acme", "inv-"+string(rune('a'+i))), ttl)
		}
		time.Sleep(retain + 2*ttl)
		var (
			mu    sync.Mutex
			total int
			wg    sync.WaitGroup
		)
		for range 4 {
			wg.Go(func() {
				for {
					k, err := b.PurgeExpired(testCtx(t), 3)
					if err != nil {
						t.Errorf("PurgeExpired: %v", err)
						return
					}
					mu.Lock()
					total += k
					mu.Unlock()
					if k == 0 {
						return
					}
				}
			})
		}
		wg.Wait()
		if total != n {
			t.Fatalf("four purgers deleted %d challenges in all, want %d (each once)", total, n)
		}
	})
}
