package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
	"github.com/mandate-dev/mandate/services/confirm/postgres"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

var quiet = slog.New(slog.DiscardHandler)

func newStore(t testing.TB, pool *pgxpool.Pool) *postgres.Store {
	t.Helper()
	s := postgres.New(pool, postgres.Options{Logger: quiet, WatchPoll: 5 * time.Second})
	t.Cleanup(s.Close)
	return s
}

func TestConformance(t *testing.T) {
	confirmtest.Run(t, func(t *testing.T) confirmtest.Backend {
		return newStore(t, pgtest.New(t, postgres.Migrations))
	})
}

// TestWatchWakesAcrossReplicas: a decision made through another Store (as
// another replica would, on its own pool) wakes a watcher through
// LISTEN/NOTIFY, well before the poll interval (5s here) could.
func TestWatchWakesAcrossReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, dsn := pgtest.NewURL(t, postgres.Migrations)
	other, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	a, b := newStore(t, pool), newStore(t, other)

	c, _, err := a.Create(ctx, confirmtest.Challenge("acme", "inv-1"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := a.Watch(ctx, "acme", c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if first := <-ch; first.State != confirm.StatePending {
		t.Fatalf("first: %s", first.State)
	}
	decided := time.Now()
	if _, err := b.Decide(ctx, "acme", c.ID, confirm.Decision{Approve: true, By: "alice", Channel: confirm.ChannelAPI}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-ch:
		if got.State != confirm.StateApproved || got.DecidedBy != "alice" {
			t.Fatalf("woken with %+v", got)
		}
		if waited := time.Since(decided); waited > 2*time.Second {
			t.Fatalf("woken after %v: that was the poll, not the notification", waited)
		}
	case <-ctx.Done():
		t.Fatal("the other replica's decision never reached the watcher")
	}
}

// TestStateChecksHoldInTheDatabase: a row that skips a step is refused by
// the schema itself, whatever code writes it.
func TestStateChecksHoldInTheDatabase(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.New(t, postgres.Migrations)
	s := newStore(t, pool)
	c, _, err := s.Create(ctx, confirmtest.Challenge("acme", "inv-1"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for name, sql := range map[string]string{
		"approved without approver": "UPDATE confirm.challenges SET state = 'APPROVED' WHERE id = $1",
		"redeemed without time":     "UPDATE confirm.challenges SET state = 'REDEEMED', decided_by = 'x', decided_at = now(), decision_channel = 'api' WHERE id = $1",
		"stored EXPIRED":            "UPDATE confirm.challenges SET state = 'EXPIRED' WHERE id = $1",
		"empty approver":            "UPDATE confirm.challenges SET state = 'APPROVED', decided_by = '', decided_at = now(), decision_channel = 'api' WHERE id = $1",
	} {
		if _, err := pool.Exec(ctx, sql, c.ID); err == nil {
			t.Errorf("%s: the database accepted it", name)
		}
	}
}

// TestUnavailable: a store whose database is gone answers with
// confirmation.unavailable and no driver text.
func TestUnavailable(t *testing.T) {
	// Nothing listens on port 1: every connection attempt is refused.
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/confirm?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStore(t, pool)
	_, err = s.Get(context.Background(), "acme", confirm.NewID())
	if !errors.Is(err, confirm.ErrUnavailable) || strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("Get without a database: %v", err)
	}
	err = s.ConsumeLoginToken(context.Background(), "jti", time.Now().Add(time.Minute))
	if !errors.Is(err, confirm.ErrUnavailable) {
		t.Fatalf("ConsumeLoginToken without a database: %v", err)
	}
}
