package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"
)

// events records the order in which the parts of a process group ended.
type events struct {
	mu   sync.Mutex
	list []string
}

func (e *events) add(s string) { e.mu.Lock(); e.list = append(e.list, s); e.mu.Unlock() }

func (e *events) before(t *testing.T, first, then string) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	i, j := slices.Index(e.list, first), slices.Index(e.list, then)
	if i < 0 || j < 0 || i > j {
		t.Fatalf("events %q: want %q before %q", e.list, first, then)
	}
}

// TestProcessGroupReportsEveryFailure: a server that cannot serve stops
// the others, and run returns its error joined with that of every other
// part that failed, not only the first; the loops end last, after the
// hooks that finish the servers' work.
func TestProcessGroupReportsEveryFailure(t *testing.T) {
	errListen, errShutdown := errors.New("listener failed"), errors.New("shutdown failed")
	var ev events
	var p processGroup
	p.serve(func(context.Context) error { return errListen })
	p.serve(func(ctx context.Context) error {
		<-ctx.Done()
		ev.add("server stopped")
		return errShutdown
	})
	p.loop(func(ctx context.Context) error {
		<-ctx.Done()
		ev.add("loop ended")
		return nil
	})
	stopping := make(chan struct{})
	p.onStopping(func() { close(stopping) })
	p.onStopped(func() { ev.add("stopped hook") })
	err := p.run(t.Context())
	if !errors.Is(err, errListen) || !errors.Is(err, errShutdown) {
		t.Fatalf("run = %v, want both %v and %v", err, errListen, errShutdown)
	}
	<-stopping // the stopping hook ran
	ev.before(t, "server stopped", "stopped hook")
	ev.before(t, "stopped hook", "loop ended")
}

// TestProcessGroupFailingLoopStopsServers: a background loop that fails
// ends the servers, and its error is run's.
func TestProcessGroupFailingLoopStopsServers(t *testing.T) {
	errLoop := errors.New("reconciler failed")
	var p processGroup
	p.serve(func(ctx context.Context) error { <-ctx.Done(); return nil })
	p.loop(func(context.Context) error { return errLoop })
	if err := p.run(t.Context()); !errors.Is(err, errLoop) {
		t.Fatalf("run = %v, want %v", err, errLoop)
	}
}

// TestProcessGroupCleanStop: when the context ends and every part stops
// cleanly, run returns nil.
func TestProcessGroupCleanStop(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var p processGroup
	started := make(chan struct{})
	p.serve(func(ctx context.Context) error { close(started); <-ctx.Done(); return nil })
	p.loop(func(ctx context.Context) error { <-ctx.Done(); return nil })
	go func() { <-started; cancel() }()
	if err := p.run(ctx); err != nil {
		t.Fatalf("run = %v, want nil", err)
	}
}

// TestDevEndsWithAFailingPart: when a part of `mandate dev` fails while
// the suite serves, the whole suite stops and the command returns that
// error, rather than serving on without it or hanging.
func TestDevEndsWithAFailingPart(t *testing.T) {
	var out bytes.Buffer
	d := devSettings{httpAddr: "127.0.0.1:0", grpcAddr: "127.0.0.1:0"}
	d.events.keep, d.events.purgeInterval = time.Hour, time.Hour
	var cl closers
	defer cl.close()
	env := func(string) (string, bool) { return "", false }
	p, err := startDev(t.Context(), d, slog.New(slog.NewTextHandler(io.Discard, nil)), IO{Stdout: &out, Stderr: io.Discard, Env: env}, &cl)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`health (http://\S+/healthz)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no health URL in the banner:\n%s", out.String())
	}
	healthz := m[1]
	errBoom := errors.New("component failed")
	p.serve(func(ctx context.Context) error {
		for { // fail once the suite serves
			if healthy(ctx, healthz) {
				return errBoom
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	if err := p.run(t.Context()); !errors.Is(err, errBoom) {
		t.Fatalf("mandate dev returned %v, want %v", err, errBoom)
	}
	if healthy(t.Context(), healthz) {
		t.Fatal("the public server still serves after the suite returned")
	}
}

func healthy(ctx context.Context, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
