package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

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

// TestNoticeReasonFitsTheTable: whatever a webhook answered, the reason is
// stored (valid UTF-8, no NUL, within the table's bound), as
// confirm.NoticeReason makes it.
func TestNoticeReasonFitsTheTable(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.New(t, postgres.Migrations)
	s := newStore(t, pool)
	if _, _, err := s.Create(ctx, confirmtest.Challenge("acme", "inv-1"), time.Minute); err != nil {
		t.Fatal(err)
	}
	ns, err := s.ClaimNotices(ctx, 10, time.Minute)
	if err != nil || len(ns) != 1 {
		t.Fatalf("ClaimNotices = %v, %v", ns, err)
	}
	junk := "\x00" + strings.Repeat("€", 200) + "\xff"
	if err := s.NoticeFailed(ctx, ns[0].ID, time.Minute, junk); err != nil {
		t.Fatal(err)
	}
	var reason string
	var attempts int
	if err := pool.QueryRow(ctx, "SELECT reason, attempts FROM confirm.notices WHERE id = $1", ns[0].ID).Scan(&reason, &attempts); err != nil {
		t.Fatal(err)
	}
	if want := confirm.NoticeReason(junk); reason != want || len(reason) > confirm.MaxNoticeReason || !utf8.ValidString(reason) ||
		strings.ContainsRune(reason, 0) || attempts != 1 {
		t.Fatalf("stored reason %q (%d bytes), attempts %d; want %q, 1", reason, len(reason), attempts, want)
	}
	if _, err := pool.Exec(ctx, "UPDATE confirm.notices SET reason = $2 WHERE id = $1", ns[0].ID, strings.Repeat("x", confirm.MaxNoticeReason+1)); err == nil {
		t.Fatal("the database accepted an unbounded reason")
	}
}

// TestWebhooksOverTwoReplicas: two confirm replicas, each with its own
// pool and relay, deliver the notices of one database to one receiver: 20
// challenges opened and 10 of them expired give exactly 30 deliveries,
// each notice accepted once — however the two relays' rounds interleave.
func TestWebhooksOverTwoReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, dsn := pgtest.NewURL(t, postgres.Migrations)
	other, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	stores := []*postgres.Store{newStore(t, pool), newStore(t, other)}
	key := []byte("0123456789abcdef0123456789abcdef")
	var (
		mu   sync.Mutex
		seen = map[string]int{}
		kind = map[string]int{}
	)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := confirm.VerifyWebhook(key, r.Header, body, time.Now(), time.Minute); err != nil {
			t.Errorf("a delivery does not verify: %v", err)
		}
		var ev confirm.WebhookEvent
		_ = json.Unmarshal(body, &ev)
		mu.Lock()
		seen[r.Header.Get("webhook-id")]++
		kind[ev.Type]++
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	defer rcv.Close()
	for i := range 20 {
		ttl := time.Hour
		if i%2 == 0 {
			ttl = 300 * time.Millisecond
		}
		if _, _, err := stores[i%2].Create(ctx, confirmtest.Challenge("acme", fmt.Sprint("inv-", i)), ttl); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(400 * time.Millisecond)
	var wg sync.WaitGroup
	for _, st := range stores {
		relay := confirm.NewWebhookRelay(st, nil, confirm.WebhookConfig{URL: rcv.URL, Key: key, Batch: 4})
		wg.Go(func() {
			for range 20 {
				if _, err := relay.Once(ctx); err != nil {
					t.Errorf("relay: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 30 || kind["challenge.opened"] != 20 || kind["challenge.expired"] != 10 {
		t.Fatalf("%d notices delivered (%v), want 30: 20 opened, 10 expired", len(seen), kind)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("notice %s delivered %d times", id, n)
		}
	}
}

func TestRetentionConformance(t *testing.T) {
	confirmtest.RunRetention(t, func(t *testing.T, retain time.Duration) confirmtest.Retaining {
		s := postgres.New(pgtest.New(t, postgres.Migrations), postgres.Options{Logger: quiet, WatchPoll: 5 * time.Second, Retain: retain})
		t.Cleanup(s.Close)
		return s
	})
}
