package pglisten_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/storage/pglisten"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

const appName = "pglisten-test"

// event is one callback invocation, in the order the listener made them.
type event struct {
	kind    string // "connected", "notify" or "lost"
	resync  bool
	channel string
	payload string
}

func start(t *testing.T, cfg pglisten.Config) (<-chan event, func()) {
	t.Helper()
	events := make(chan event, 64)
	cfg.Connected = func(_ context.Context, resync bool) { events <- event{kind: "connected", resync: resync} }
	cfg.Notify = func(_ context.Context, n *pgconn.Notification) {
		events <- event{kind: "notify", channel: n.Channel, payload: n.Payload}
	}
	cfg.Lost = func(context.Context, error) { events <- event{kind: "lost"} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pglisten.Run(ctx, cfg) }()
	stop := sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v after cancel, want nil", err)
		}
	})
	t.Cleanup(stop)
	return events, stop
}

func next(t *testing.T, events <-chan event) event {
	t.Helper()
	select {
	case e := <-events:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no listener event within 10s")
		return event{}
	}
}

func expect(t *testing.T, events <-chan event, want event) {
	t.Helper()
	if got := next(t, events); got != want {
		t.Fatalf("event = %+v, want %+v", got, want)
	}
}

func notify(t *testing.T, pool *pgxpool.Pool, channel, payload string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "SELECT pg_notify($1, $2)", channel, payload); err != nil {
		t.Fatal(err)
	}
}

func TestRunDeliversAndResyncsAfterReconnect(t *testing.T) {
	pool := pgtest.New(t)
	events, _ := start(t, pglisten.Config{
		Conn:            pool.Config().ConnConfig,
		ApplicationName: appName,
		Channels:        []string{"one", "two"},
		ReconnectMin:    10 * time.Millisecond,
		ReconnectMax:    20 * time.Millisecond,
	})
	expect(t, events, event{kind: "connected"})

	notify(t, pool, "other", "ignored") // not listened to: never delivered
	notify(t, pool, "one", "a")
	notify(t, pool, "two", "b")
	expect(t, events, event{kind: "notify", channel: "one", payload: "a"})
	expect(t, events, event{kind: "notify", channel: "two", payload: "b"})

	var killed int
	if err := pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()`, appName).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d listener backends, want 1", killed)
	}
	expect(t, events, event{kind: "lost"})
	expect(t, events, event{kind: "connected", resync: true})

	notify(t, pool, "one", "c")
	expect(t, events, event{kind: "notify", channel: "one", payload: "c"})
}

func TestRunStopsOnCancel(t *testing.T) {
	pool := pgtest.New(t)
	events, stop := start(t, pglisten.Config{
		Conn: pool.Config().ConnConfig, ApplicationName: appName, Channels: []string{"one"},
	})
	expect(t, events, event{kind: "connected"})
	stop()
	// Stopping is not a lost connection: no callback follows.
	select {
	case e := <-events:
		t.Fatalf("event %+v after stop", e)
	default:
	}
	// Run closed its connection; the server ends the backend on its own time, so give it a
	// moment to leave pg_stat_activity.
	var n int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND datname = current_database()`, appName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 || time.Now().After(deadline) {
			break
		}
	}
	if n != 0 {
		t.Fatalf("%d listener connections left 5s after Run returned", n)
	}
}

// warnings counts the records logged at warning level.
type warnings struct{ c chan slog.Record }

func (w warnings) Enabled(_ context.Context, l slog.Level) bool  { return l >= slog.LevelWarn }
func (w warnings) Handle(_ context.Context, r slog.Record) error { w.c <- r; return nil }
func (w warnings) WithAttrs([]slog.Attr) slog.Handler            { return w }
func (w warnings) WithGroup(string) slog.Handler                 { return w }

func TestRunRetriesAConnectionThatNeverCameUp(t *testing.T) {
	cfg, err := pgx.ParseConfig("postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	logged := warnings{c: make(chan slog.Record, 16)}
	events, stop := start(t, pglisten.Config{
		Conn: cfg, Channels: []string{"one"}, Name: "test listener",
		ReconnectMin: time.Millisecond, ReconnectMax: 2 * time.Millisecond,
		Logger: slog.New(logged),
	})
	for range 3 {
		select {
		case r := <-logged.c:
			if r.Message != "test listener lost its connection; reconnecting" {
				t.Fatalf("logged %q", r.Message)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no reconnect attempt logged within 10s")
		}
	}
	stop()
	// Lost is only for connections that were established.
	select {
	case e := <-events:
		t.Fatalf("event %+v without a connection", e)
	default:
	}
}

func TestRunRejectsIncompleteConfig(t *testing.T) {
	if err := pglisten.Run(context.Background(), pglisten.Config{Channels: []string{"x"}}); !errors.Is(err, pglisten.ErrInvalidConfig) {
		t.Fatalf("no Conn: err = %v", err)
	}
	cfg, err := pgx.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	if err := pglisten.Run(context.Background(), pglisten.Config{Conn: cfg}); !errors.Is(err, pglisten.ErrInvalidConfig) {
		t.Fatalf("no Channels: err = %v", err)
	}
}
