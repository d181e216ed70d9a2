package memory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
	"github.com/mandate-dev/mandate/services/confirm/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	confirmtest.Run(t, func(t *testing.T) confirmtest.Backend {
		s := memory.New(memory.Options{})
		t.Cleanup(s.Close)
		return s
	})
}

// TestRetention: a challenge stays readable (EXPIRED) for Retain after its expiry, then the
// next Create drops it and its invocation may open a new one.
func TestRetention(t *testing.T) {
	now := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	s := memory.New(memory.Options{Now: func() time.Time { return now }, Retain: time.Hour})
	t.Cleanup(s.Close)
	ctx := context.Background()
	old, _, err := s.Create(ctx, confirmtest.Challenge("acme", "inv-old"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Minute + 59*time.Minute) // expired 59 minutes ago: kept
	recent, _, err := s.Create(ctx, confirmtest.Challenge("acme", "inv-1"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "acme", old.ID); err != nil || got.State != confirm.StateExpired {
		t.Fatalf("Get within retention = %v, %v; want EXPIRED", got.State, err)
	}
	now = now.Add(2 * time.Minute) // expired 61 minutes ago: dropped at the next Create
	if _, _, err := s.Create(ctx, confirmtest.Challenge("acme", "inv-2"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "acme", old.ID); !errors.Is(err, confirm.ErrNotFound) {
		t.Fatalf("Get past retention = %v, want ErrNotFound", err)
	}
	again := confirmtest.Challenge("acme", "inv-old")
	if _, created, err := s.Create(ctx, again, time.Minute); err != nil || !created {
		t.Fatalf("Create for the dropped challenge's invocation: created=%v err=%v; want a new one", created, err)
	}
	if got, err := s.Get(ctx, "acme", recent.ID); err != nil || got.State != confirm.StateExpired {
		t.Fatalf("Get(a challenge expired 2 minutes ago) = %v, %v; want it kept, EXPIRED", got.State, err)
	}
}

// TestNoticesFollowRetention: a challenge's expiry is due exactly at
// ExpiresAt, and its notices, delivered or not, are dropped with it once it
// is past retention.
func TestNoticesFollowRetention(t *testing.T) {
	now := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	s := memory.New(memory.Options{Now: func() time.Time { return now }, Retain: time.Hour})
	t.Cleanup(s.Close)
	ctx := context.Background()
	old, _, err := s.Create(ctx, confirmtest.Challenge("acme", "inv-old"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Minute - time.Microsecond)
	if n, err := s.ExpireDue(ctx, 10); err != nil || n != 0 {
		t.Fatalf("ExpireDue a microsecond before expiry = %d, %v; want 0", n, err)
	}
	now = now.Add(time.Microsecond)
	if n, err := s.ExpireDue(ctx, 10); err != nil || n != 1 {
		t.Fatalf("ExpireDue at expiry = %d, %v; want 1", n, err)
	}
	ns, err := s.ClaimNotices(ctx, 10, time.Minute)
	if err != nil || len(ns) != 2 || ns[1].Kind != confirm.NoticeExpired || !ns[1].At.Equal(old.ExpiresAt) {
		t.Fatalf("ClaimNotices = %+v, %v; want opened and expired", ns, err)
	}
	if _, err := s.Decide(ctx, "acme", old.ID, confirm.Decision{Approve: true, By: "alice", Channel: confirm.ChannelAPI}); !errors.Is(err, confirm.ErrExpired) {
		t.Fatalf("Decide after the expired notice: %v", err)
	}
	now = now.Add(61 * time.Minute) // past retention: the next Create drops it with its notices
	if _, _, err := s.Create(ctx, confirmtest.Challenge("acme", "inv-new"), time.Minute); err != nil {
		t.Fatal(err)
	}
	ns, err = s.ClaimNotices(ctx, 10, time.Minute)
	if err != nil || len(ns) != 1 || ns[0].Kind != confirm.NoticeOpened || ns[0].ChallengeID == old.ID {
		t.Fatalf("ClaimNotices after the sweep = %+v, %v; want only the new challenge's opened notice", ns, err)
	}
}

func TestRetentionConformance(t *testing.T) {
	confirmtest.RunRetention(t, func(t *testing.T, retain time.Duration) confirmtest.Retaining {
		s := memory.New(memory.Options{Retain: retain})
		t.Cleanup(s.Close)
		return s
	})
}
