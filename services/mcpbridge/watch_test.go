package mcpbridge_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/catalog"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// startBridge serves a second, in-process bridge over e's services with
// cfg's Catalog (default e.catalog) and timeouts.
func startBridge(t *testing.T, e *env, cfg mcpbridge.Config) *env {
	t.Helper()
	mux := http.NewServeMux()
	hs := httptest.NewServer(mux)
	if cfg.Catalog == nil {
		cfg.Catalog = e.catalog
	}
	cfg.Executor, cfg.Manifest, cfg.Verifier, cfg.ResourceURL = e.exec, e.set, e.users, hs.URL+"/mcp"
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
	e := startBridge(t, start(t), mcpbridge.Config{IdleTimeout: 50 * time.Millisecond})
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
	time.Sleep(20 * 50 * time.Millisecond)
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
	*catalog.Catalog
	err error

	mu     sync.Mutex
	tokens []string
}

func (f *flakyCatalog) Watch(ctx context.Context, p identity.Principal, send func(catalog.Event) error) error {
	tok, _ := identity.RawTokenFromContext(ctx)
	f.mu.Lock()
	f.tokens = append(f.tokens, tok)
	first := len(f.tokens) == 1
	f.mu.Unlock()
	if first {
		return f.err
	}
	return f.Catalog.Watch(ctx, p, send)
}

func (f *flakyCatalog) relayed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.tokens)
}

// TestWatchReconnects: a watch that fails is restarted with backoff; one
// refused for its token waits for a request to bring a newer token and
// relays that one.
func TestWatchReconnects(t *testing.T) {
	base := start(t)
	first := token(t, "acme", "alice", "support-bot")
	time.Sleep(1100 * time.Millisecond) // a later expiry (tokens have second precision)
	newer := token(t, "acme", "alice", "support-bot")
	cases := []struct {
		name string
		err  error
		// refresh sends a request with the newer token before the watch
		// may reconnect.
		refresh bool
	}{
		{name: "transient failure", err: errors.New("connection reset")},
		{name: "token refused", err: failure.New(identity.Stage, "authentication.token_expired", "token expired"), refresh: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cat := &flakyCatalog{Catalog: base.catalog, err: tc.err}
			e := startBridge(t, base, mcpbridge.Config{Catalog: cat})
			cs, changed := e.listen(t, first)
			before := names(t, cs)
			waitFor(t, "the first watch", func() bool { return len(cat.relayed()) >= 1 })
			if tc.refresh {
				time.Sleep(20 * 100 * time.Millisecond / 4) // several backoff periods
				if got := cat.relayed(); len(got) != 1 {
					t.Fatalf("the watch reconnected %d times without a fresh token", len(got)-1)
				}
				names(t, e.connect(t, newer))
			}
			waitFor(t, "the watch to reconnect", func() bool { return len(cat.relayed()) >= 2 })
			got := cat.relayed()
			if got[0] != first {
				t.Fatal("the first watch did not relay the session's token")
			}
			want := first
			if tc.refresh {
				want = newer
			}
			if got[1] != want {
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
