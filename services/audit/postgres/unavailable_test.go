package postgres_test

import (
	"errors"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/audittest"
	"github.com/mandate-dev/mandate/services/audit/postgres"
)

// proxy is a TCP forwarder in front of Postgres that the test can cut (listener closed, every
// connection reset: what clients see when the server goes away) and restore on the same port.
type proxy struct {
	t      *testing.T
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	p := &proxy{t: t, target: target, conns: map[net.Conn]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.Cut)
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			if !p.track(c, up) {
				return
			}
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				_ = dst.Close()
				_ = src.Close()
			}
			p.wg.Go(func() { pipe(up, c) })
			p.wg.Go(func() { pipe(c, up) })
		}
	})
}

func (p *proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil { // cut meanwhile
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// Cut closes the listener and every open connection and waits for the forwarders to stop.
func (p *proxy) Cut() {
	p.mu.Lock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // reset, not a graceful close
		}
		_ = c.Close()
		delete(p.conns, c)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Restore listens again on the same address.
func (p *proxy) Restore() {
	p.t.Helper()
	var ln net.Listener
	var err error
	for range 50 { // the port can take a moment to be free again
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		p.t.Fatalf("re-listening on %s: %v", p.addr, err)
	}
	p.serve(ln)
}

type counts struct{ rows, head, pending int64 }

func countAll(t *testing.T, direct *pgxpool.Pool) counts {
	t.Helper()
	var c counts
	err := direct.QueryRow(ctxFor(t), `SELECT
		(SELECT count(*) FROM audit.records),
		(SELECT coalesce(sum(seq), 0) FROM audit.heads),
		(SELECT count(*) FROM audit.pending)`).Scan(&c.rows, &c.head, &c.pending)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPostgresUnavailable(t *testing.T) {
	direct, dsn := pgtest.NewURL(t, postgres.Migrations)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, u.Host)
	u.Host = px.addr
	pool, err := pg.Open(ctxFor(t), u.String(), pg.Options{MaxConns: 4, ConnectTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st := newStore(t, pool)
	writers := []struct {
		name string
		w    *audit.Writer
	}{
		{"batched", newWriter(t, st, audit.WriterOptions{RetryBackoff: 5 * time.Millisecond})},
		{"unbatched", newWriter(t, st, audit.WriterOptions{Unbatched: true, RetryBackoff: 5 * time.Millisecond})},
	}
	ctx := ctxFor(t)
	for _, w := range writers {
		if _, err := w.w.Append(ctx, audittest.Rec("acme", "before-"+w.name, audit.PhaseIntent)); err != nil {
			t.Fatalf("%s, before the outage: %v", w.name, err)
		}
	}
	before := countAll(t, direct)

	px.Cut()
	for _, w := range writers {
		t.Run("append fails while cut/"+w.name, func(t *testing.T) {
			start := time.Now()
			_, err := w.w.Append(ctx, audittest.Rec("acme", "during-"+w.name, audit.PhaseIntent), audittest.Rec("globex", "during-"+w.name, audit.PhaseIntent))
			if !errors.Is(err, audit.ErrUnavailable) || !audit.Retryable(err) {
				t.Fatalf("err = %v, want ErrUnavailable", err)
			}
			t.Logf("error while cut: %v", err)
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("the append took %v to fail", d)
			}
			for _, leak := range []string{"127.0.0.1", px.addr, "dial", "refused", "reset"} {
				if strings.Contains(err.Error(), leak) {
					t.Errorf("the error %q leaks %q", err, leak)
				}
			}
		})
	}
	t.Run("reads fail while cut", func(t *testing.T) {
		if _, err := st.Query(ctx, audit.Filter{Tenant: "acme"}); !errors.Is(err, audit.ErrUnavailable) {
			t.Errorf("Query: %v, want ErrUnavailable", err)
		}
		if _, err := st.Verify(ctx, "acme"); !errors.Is(err, audit.ErrUnavailable) {
			t.Errorf("Verify: %v, want ErrUnavailable", err)
		}
		if _, err := st.Get(ctx, "acme", "before-batched"); !errors.Is(err, audit.ErrUnavailable) {
			t.Errorf("Get: %v, want ErrUnavailable", err)
		}
	})
	if after := countAll(t, direct); after != before {
		t.Fatalf("the failed appends wrote something: before %+v, after %+v", before, after)
	}

	px.Restore()
	for _, w := range writers {
		t.Run("append succeeds after restore/"+w.name, func(t *testing.T) {
			// The very first append after the server is back succeeds: same Writer, same pool.
			out, err := w.w.Append(ctx, audittest.Rec("acme", "during-"+w.name, audit.PhaseIntent), audittest.Rec("globex", "during-"+w.name, audit.PhaseIntent))
			if err != nil {
				t.Fatalf("first append after restore: %v", err)
			}
			if out[0].Tenant != "acme" || out[1].Tenant != "globex" {
				t.Fatalf("rows %+v", out)
			}
		})
	}
	after := countAll(t, direct)
	if after.rows != before.rows+4 {
		t.Fatalf("rows: %d before the outage, %d after; want 4 more", before.rows, after.rows)
	}
	for _, tenant := range []string{"acme", "globex"} {
		rep, err := st.Verify(ctx, tenant)
		if err != nil || !rep.OK {
			t.Fatalf("%s after the outage: %+v, %v", tenant, rep, err)
		}
	}
}

// TestPostgresUnavailableMidStream cuts the connection while appends are flowing: each append
// either succeeds or fails with ErrUnavailable, the chain stays intact, and retrying the
// failed ones after the restore stores each exactly once.
func TestPostgresUnavailableMidStream(t *testing.T) {
	direct, dsn := pgtest.NewURL(t, postgres.Migrations)
	u, _ := url.Parse(dsn)
	px := startProxy(t, u.Host)
	u.Host = px.addr
	pool, err := pg.Open(ctxFor(t), u.String(), pg.Options{MaxConns: 4, ConnectTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st := newStore(t, pool)
	w := newWriter(t, st, audit.WriterOptions{RetryBackoff: 5 * time.Millisecond, Attempts: 2})

	ctx := ctxFor(t)
	const writers, each = 16, 40
	var mu sync.Mutex
	var failed []audit.Record
	var wg sync.WaitGroup
	cut := make(chan struct{})
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				if i == each/2 && g == 0 {
					close(cut)
				}
				r := audittest.Rec("acme", "g"+strconv.Itoa(g)+"-"+strconv.Itoa(i), audit.PhaseIntent)
				if _, err := w.Append(ctx, r); err != nil {
					if !errors.Is(err, audit.ErrUnavailable) {
						t.Errorf("append: %v, want success or ErrUnavailable", err)
					}
					mu.Lock()
					failed = append(failed, r)
					mu.Unlock()
				}
			}
		})
	}
	<-cut
	px.Cut()
	time.Sleep(50 * time.Millisecond)
	px.Restore()
	wg.Wait()
	for _, r := range failed {
		if _, err := w.Append(ctx, r); err != nil {
			t.Fatalf("retry after restore: %v", err)
		}
	}
	rep, err := st.Verify(ctx, "acme")
	if err != nil || !rep.OK || rep.Rows != writers*each {
		t.Fatalf("after the outage: %+v, %v; want an intact chain of %d rows", rep, err, writers*each)
	}
	if c := countAll(t, direct); c.rows != writers*each {
		t.Fatalf("%d rows stored, want %d (each record exactly once)", c.rows, writers*each)
	}
	t.Logf("%d of %d appends failed during the outage and were retried", len(failed), writers*each)
}
