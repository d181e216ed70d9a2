package pg_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/internal/storage/pglisten"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

// freezer is a TCP relay in front of a real Postgres that can stop
// relaying the server's bytes, as a hung host would: the connections stay
// open, what the client sends arrives, and nothing comes back.
type freezer struct {
	ln     net.Listener
	target string
	frozen atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target}
	go f.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			_ = c.Close()
		}
		f.mu.Unlock()
	})
	return f
}

func (f *freezer) serve() {
	for {
		client, err := f.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", f.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, client, server)
		f.mu.Unlock()
		go func() { _, _ = io.Copy(server, client) }()
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := server.Read(buf)
				for f.frozen.Load() {
					time.Sleep(10 * time.Millisecond)
				}
				if n > 0 {
					if _, werr := client.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = client.Close()
					return
				}
			}
		}()
	}
}

// through rewrites dsn to reach its server through the relay.
func (f *freezer) through(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = f.ln.Addr().String()
	return u.String()
}

func serverAddr(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// TestReplyTimeoutBoundsAHungServer: with the database hung (the relay
// holds every byte the server sends), a statement under a context with no
// deadline at all answers within the reply timeout with an unavailable
// error, instead of waiting forever; once the database answers again, the
// pool's next statement runs on a fresh connection.
func TestReplyTimeoutBoundsAHungServer(t *testing.T) {
	_, dsn := pgtest.NewURL(t)
	f := newFreezer(t, serverAddr(t, dsn))
	const timeout = 400 * time.Millisecond
	pool, err := pg.Open(context.Background(), f.through(t, dsn), pg.Options{ReplyTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	f.frozen.Store(true)
	for _, stmt := range []string{"SELECT 1", "SELECT 2"} {
		start := time.Now()
		_, err := pool.Exec(ctx, stmt)
		took := time.Since(start)
		if err == nil {
			t.Fatalf("%s answered with the server hung", stmt)
		}
		if kind := pg.Classify(err); kind != pg.KindUnavailable {
			t.Errorf("%s with the server hung: %v (%v), want unavailable", stmt, kind, err)
		}
		// Generous: the bound is the reply timeout, plus a fresh dial (a
		// connection the hung server already cut) under a loaded machine.
		if took > timeout+3*time.Second {
			t.Errorf("%s gave up after %v; the reply timeout is %v", stmt, took, timeout)
		}
		t.Logf("%s with the server hung: %v after %v", stmt, pg.Classify(err), took.Round(time.Millisecond))
	}
	f.frozen.Store(false)

	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := pool.Exec(ctx, "SELECT 1")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no statement ran after the server came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestReplyTimeoutAndWhatItSpares: a statement whose reply takes longer
// than the timeout is cut (the cost of the bound); a cancelled context
// still ends a statement at once; and a listener, which waits for the
// server to speak first, idles past the timeout and still hears.
func TestReplyTimeoutAndWhatItSpares(t *testing.T) {
	pool0, dsn := pgtest.NewURL(t)
	const timeout = 300 * time.Millisecond
	pool, err := pg.Open(context.Background(), dsn, pg.Options{ReplyTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()

	// A statement silent for longer than the timeout is cut: the cost of
	// the bound, documented on Options.ReplyTimeout.
	if _, err := pool.Exec(ctx, `SELECT pg_sleep(1)`); pg.Classify(err) != pg.KindUnavailable {
		t.Errorf("a statement silent for 1s with a 300ms reply timeout: %v", err)
	}

	// A cancellation still ends a read at once.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = pool.Exec(cctx, `SELECT pg_sleep(5)`)
	if !errors.Is(err, context.DeadlineExceeded) && pg.Classify(err) != pg.KindCanceled {
		t.Errorf("a statement whose context ends: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a cancelled statement returned after %v", took)
	}

	// A listener on the pool's configuration idles past the timeout and
	// still gets its notification, on the connection it started with.
	events := make(chan string, 8)
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- pglisten.Run(lctx, pglisten.Config{
			Conn: pool.Config().ConnConfig, Channels: []string{"reply"},
			Connected: func(context.Context, bool) { events <- "connected" },
			Notify:    func(_ context.Context, n *pgconn.Notification) { events <- "notify " + n.Payload },
			Lost:      func(context.Context, error) { events <- "lost" },
		})
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("listener: %v", err)
		}
	}()
	if e := <-events; e != "connected" {
		t.Fatalf("listener: %s", e)
	}
	time.Sleep(3 * timeout)
	if _, err := pool0.Exec(ctx, `SELECT pg_notify('reply', 'late')`); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-events:
		if e != "notify late" {
			t.Errorf("listener after idling past the reply timeout: %s, want the notification", e)
		}
	case <-time.After(5 * time.Second):
		t.Error("the listener got nothing")
	}
}
