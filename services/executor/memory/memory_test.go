package memory_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/services/executor"
	"github.com/mandate-dev/mandate/services/executor/executortest"
	"github.com/mandate-dev/mandate/services/executor/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	executortest.Run(t, func(*testing.T) executor.Store { return memory.New(memory.Options{}) })
}

// clock is a manual clock for expiry tests.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestExpiryBoundary pins the boundary exactly: a record is live strictly before
// reserved+ttl and expired from that instant on.
func TestExpiryBoundary(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name    string
		advance time.Duration
		live    bool
	}{
		{"just reserved", 0, true},
		{"one nanosecond before expiry", time.Minute - time.Nanosecond, true},
		{"at expiry", time.Minute, false},
		{"long after", 48 * time.Hour, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &clock{now: executortest.Base}
			st := memory.New(memory.Options{Now: clk.Now})
			if _, err := st.Reserve(ctx, executortest.Key(), executor.Reservation{Digest: "d1", TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
			clk.Advance(tt.advance)
			saved, err := st.Reserve(ctx, executortest.Key(), executor.Reservation{Digest: "d1", TTL: time.Hour})
			if tt.live && !errors.Is(err, executor.ErrInFlight) {
				t.Fatalf("Reserve = (%v, %v), want ErrInFlight while live", saved, err)
			}
			if !tt.live && (err != nil || saved != nil) {
				t.Fatalf("Reserve = (%v, %v), want a new reservation once expired", saved, err)
			}
		})
	}
}

func TestFinishedRecordExpiresFromReservation(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: executortest.Base}
	st := memory.New(memory.Options{Now: clk.Now})
	if _, err := st.Reserve(ctx, executortest.Key(), executor.Reservation{Digest: "d1", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(50 * time.Second)
	k := executortest.Key()
	if err := st.Finish(ctx, executor.Finish{Key: &k, Saved: executortest.Success("inv-1")}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(9 * time.Second)
	if saved, err := st.Reserve(ctx, executortest.Key(), executor.Reservation{Digest: "d1", TTL: time.Minute}); err != nil || saved == nil {
		t.Fatalf("59s after reserving: (%v, %v), want the replay", saved, err)
	}
	clk.Advance(time.Second)
	if saved, err := st.Reserve(ctx, executortest.Key(), executor.Reservation{Digest: "d1", TTL: time.Minute}); err != nil || saved != nil {
		t.Fatalf("60s after reserving (10s after finishing): (%v, %v), want a new reservation", saved, err)
	}
}

func TestPurgeExpired(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: executortest.Base}
	st := memory.New(memory.Options{Now: clk.Now})
	short, long := executortest.Key(), executortest.Key()
	long.Key = "long"
	for _, r := range []struct {
		k   executor.IdemKey
		ttl time.Duration
	}{{short, time.Minute}, {long, time.Hour}} {
		if _, err := st.Reserve(ctx, r.k, executor.Reservation{Digest: "d1", TTL: r.ttl}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := st.PurgeExpired(ctx); err != nil || n != 0 {
		t.Fatalf("PurgeExpired before expiry = %d, %v; want 0", n, err)
	}
	clk.Advance(time.Minute)
	if n, err := st.PurgeExpired(ctx); err != nil || n != 1 {
		t.Fatalf("PurgeExpired = %d, %v; want 1", n, err)
	}
	if _, err := st.Reserve(ctx, long, executor.Reservation{Digest: "d1", TTL: time.Hour}); !errors.Is(err, executor.ErrInFlight) {
		t.Fatalf("the live record was purged: %v", err)
	}
}

func TestEventsPageCap(t *testing.T) {
	ctx := context.Background()
	st := memory.New(memory.Options{MaxEvents: 3})
	for _, inv := range []string{"a", "b", "c", "d", "e"} {
		if err := st.Finish(ctx, executor.Finish{Event: executortest.Ev("acme", inv)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, limit := range []int{0, -1, 3, 10} {
		evs, err := st.Events(ctx, "acme", 0, limit)
		if err != nil || len(evs) != 3 {
			t.Fatalf("Events(limit %d) = %d events, %v; want 3 (the cap)", limit, len(evs), err)
		}
	}
}
