package clicore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
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
// the others, and Run returns its error joined with that of every other
// part that failed, not only the first; the loops end last, after the
// hooks that finish the servers' work.
func TestProcessGroupReportsEveryFailure(t *testing.T) {
	errListen, errShutdown := errors.New("listener failed"), errors.New("shutdown failed")
	var ev events
	var p Group
	p.Serve(func(context.Context) error { return errListen })
	p.Serve(func(ctx context.Context) error {
		<-ctx.Done()
		ev.add("server stopped")
		return errShutdown
	})
	p.Loop(func(ctx context.Context) error {
		<-ctx.Done()
		ev.add("loop ended")
		return nil
	})
	stopping := make(chan struct{})
	p.OnStopping(func() { close(stopping) })
	p.OnStopped(func() { ev.add("stopped hook") })
	err := p.Run(t.Context())
	if !errors.Is(err, errListen) || !errors.Is(err, errShutdown) {
		t.Fatalf("run = %v, want both %v and %v", err, errListen, errShutdown)
	}
	<-stopping // the stopping hook ran
	ev.before(t, "server stopped", "stopped hook")
	ev.before(t, "stopped hook", "loop ended")
}

// TestProcessGroupFailingLoopStopsServers: a background loop that fails
// ends the servers, and its error is Run's.
func TestProcessGroupFailingLoopStopsServers(t *testing.T) {
	errLoop := errors.New("reconciler failed")
	var p Group
	p.Serve(func(ctx context.Context) error { <-ctx.Done(); return nil })
	p.Loop(func(context.Context) error { return errLoop })
	if err := p.Run(t.Context()); !errors.Is(err, errLoop) {
		t.Fatalf("run = %v, want %v", err, errLoop)
	}
}

// TestProcessGroupCleanStop: when the context ends and every part stops
// cleanly, Run returns nil.
func TestProcessGroupCleanStop(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var p Group
	started := make(chan struct{})
	p.Serve(func(ctx context.Context) error { close(started); <-ctx.Done(); return nil })
	p.Loop(func(ctx context.Context) error { <-ctx.Done(); return nil })
	go func() { <-started; cancel() }()
	if err := p.Run(ctx); err != nil {
		t.Fatalf("run = %v, want nil", err)
	}
}
