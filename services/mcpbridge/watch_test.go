package mcpbridge_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// startBridge serves a second bridge over e's services with cfg's Catalog,
// Executor and Manifest (default e's, the services through the in-process
// channel), logger and timeouts.
func startBridge(t *testing.T, e *env, cfg mcpbridge.Config) *env {
	t.Helper()
	mux := http.NewServeMux()
	hs := httptest.NewServer(mux)
	if cfg.Catalog == nil {
		cfg.Catalog = mandatev1.NewCatalogServiceClient(e.local)
	}
	if cfg.Executor == nil {
		cfg.Executor = mandatev1.NewExecutorServiceClient(e.local)
	}
	if cfg.Manifest == nil {
		cfg.Manifest = e.set
	}
	cfg.Verifier, cfg.ResourceURL = e.users, hs.URL+"/mcp"
	b, err := mcpbridge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/mcp", b.Handler())
	t.Cleanup(func() {
		b.Close()
		hs.Close()
	})
	out := *e
	out.url, out.bridge = hs.URL, b
	return &out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestIdlePrincipalsAreDropped: a principal's server and watch go once it
// has no open session and IdleTimeout passed, never while a session is
// open; a returning principal gets a fresh one.
func TestIdlePrincipalsAreDropped(t *testing.T) {
	const idle = 50 * time.Millisecond
	e := startBridge(t, start(t), mcpbridge.Config{IdleTimeout: idle})
	alice, changed := e.listen(t, token(t, "acme", "alice", ""))
	names(t, alice)
	carolSession := e.connect(t, token(t, "acme", "carol", ""))
	names(t, carolSession)
	if n := e.bridge.Principals(); n != 2 {
		t.Fatalf("%d principals, want 2", n)
	}
	if err := carolSession.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "carol's server to be dropped", func() bool { return e.bridge.Principals() == 1 })

	// alice's session outlives many idle periods and still follows the directory.
	e.bridge.Sweep(time.Now().Add(20 * idle))
	if n := e.bridge.Principals(); n != 1 {
		t.Fatalf("%d principals while alice's session is open, want 1", n)
	}
	if err := directory.SetUserDisabled(context.Background(), e.dir, "acme", "alice", true); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("alice's long-open session heard no tools/list_changed")
	}
	if got := names(t, alice); len(got) != 0 {
		t.Fatalf("disabled alice lists %v", got)
	}
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "alice's server to be dropped", func() bool { return e.bridge.Principals() == 0 })

	// carol comes back: a new server, the catalog's set.
	if got, want := names(t, e.connect(t, token(t, "acme", "carol", ""))), catalogNames(t, e, carol); !slices.Equal(got, want) {
		t.Fatalf("carol lists %v, catalog says %v", got, want)
	}
	if n := e.bridge.Principals(); n != 1 {
		t.Fatalf("%d principals, want 1", n)
	}
}

// flakyCatalog fails the first Watch with err, and records the raw token
// every Watch relays.
type flakyCatalog struct {
	mandatev1.CatalogServiceClient
	err error

	mu     sync.Mutex
	tokens []string
}

func (f *flakyCatalog) Watch(ctx context.Context, in *mandatev1.CatalogServiceWatchRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[mandatev1.CatalogEvent], error) {
	tok, _ := identity.RawTokenFromContext(ctx)
	f.mu.Lock()
	f.tokens = append(f.tokens, tok)
	first := len(f.tokens) == 1
	f.mu.Unlock()
	if first {
		return nil, f.err
	}
	return f.CatalogServiceClient.Watch(ctx, in, opts...)
}

func (f *flakyCatalog) relayed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.tokens)
}

// logRecords is a slog handler that hands every record's message to a
// channel, so that a test can wait for what the bridge announces.
type logRecords chan string

func (l logRecords) Enabled(context.Context, slog.Level) bool { return true }

func (l logRecords) Handle(_ context.Context, r slog.Record) error {
	select {
	case l <- r.Message:
	default: // a test reads only the first few; never hold up the bridge
	}
	return nil
}

func (l logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l logRecords) WithGroup(string) slog.Handler      { return l }

// next returns the next message that is one of want.
func (l logRecords) next(t *testing.T, want ...string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m := <-l:
			if slices.Contains(want, m) {
				return m
			}
		case <-timeout:
			t.Fatalf("the bridge logged none of %q", want)
		}
	}
}

// Messages the watch logs when its stream ends.
const (
	logWaitsForToken = "mcpbridge: catalog watch waits for a fresh token"
	logReconnecting  = "mcpbridge: catalog watch ended; reconnecting"
)

// TestWatchReconnects: a watch that fails is restarted with backoff; one
// refused for its token waits for a request to bring a newer token and
// relays that one.
func TestWatchReconnects(t *testing.T) {
	base := start(t)
	first := token(t, "acme", "alice", "support-bot")
	newer := tokenTTL(t, "acme", "alice", "support-bot", 2*time.Hour) // a later expiry
	cases := []struct {
		name string
		err  error
		// refresh sends a request with the newer token once the watch
		// waits for one.
		refresh bool
	}{
		{name: "transient failure", err: errors.New("connection reset")},
		{name: "token refused", err: failure.New(identity.Stage, "authentication.token_expired", "token expired"), refresh: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cat := &flakyCatalog{CatalogServiceClient: mandatev1.NewCatalogServiceClient(base.local), err: tc.err}
			logs := make(logRecords, 1024)
			e := startBridge(t, base, mcpbridge.Config{Catalog: cat, Logger: slog.New(logs)})
			cs, changed := e.listen(t, first)
			before := names(t, cs)
			// How the watch took its failure: it reconnects after a
			// transient one, and waits for a newer token, with no timer to
			// reconnect on, after a refused one.
			got := logs.next(t, logWaitsForToken, logReconnecting)
			if want := map[bool]string{false: logReconnecting, true: logWaitsForToken}[tc.refresh]; got != want {
				t.Fatalf("the failed watch logged %q, want %q", got, want)
			}
			if tc.refresh {
				if got := cat.relayed(); len(got) != 1 {
					t.Fatalf("the watch reconnected %d times without a fresh token", len(got)-1)
				}
				names(t, e.connect(t, newer))
			}
			waitFor(t, "the watch to reconnect", func() bool { return len(cat.relayed()) >= 2 })
			got2 := cat.relayed()
			if got2[0] != first {
				t.Fatal("the first watch did not relay the session's token")
			}
			want := first
			if tc.refresh {
				want = newer
			}
			if got2[1] != want {
				t.Fatalf("the reconnected watch relays the wrong token (refresh %v)", tc.refresh)
			}
			// The reconnected watch delivers changes with no request in flight.
			setRoles(t, e, "alice")
			select {
			case <-changed:
			case <-time.After(10 * time.Second):
				t.Fatal("no tools/list_changed after the reconnect")
			}
			if after := names(t, cs); len(before) == 0 || len(after) != 0 {
				t.Fatalf("before %v, after %v: want every tool gone with alice's roles", before, after)
			}
			setRoles(t, e, "alice", "support")
		})
	}
}
