package clicore

import (
	"context"
	"errors"
	"sync"

	"golang.org/x/sync/errgroup"
)

// Group runs the long-lived parts of one process under an errgroup:
// its servers, and the background loops beside them (reconcilers, the
// events relay). A part that fails stops all of them, and Run reports the
// error of every part that failed, not only the first.
//
// Parts stop in order. The servers stop first, when the context ends or a
// part fails; the stopping hooks run as that begins. Once every server has
// returned, the stopped hooks finish the work still in flight (the
// executor's last outcomes); only then do the loops end, so that they see
// that work through (the relay delivers the events of those outcomes).
type Group struct {
	servers  []func(context.Context) error
	loops    []func(context.Context) error
	stopping []func()
	stopped  []func()
}

// Serve adds a server: run serves until its context ends and returns nil
// then, or returns why it could not serve.
func (p *Group) Serve(run func(context.Context) error) { p.servers = append(p.servers, run) }

// Loop adds background loops, which run until the servers have stopped and
// the stopped hooks have run, and return nil then.
func (p *Group) Loop(runs ...func(context.Context) error) { p.loops = append(p.loops, runs...) }

// OnStopping adds a hook run as soon as the servers begin to stop: it ends
// what would hold their graceful stop (long-lived streams).
func (p *Group) OnStopping(f func()) { p.stopping = append(p.stopping, f) }

// OnStopped adds a hook run once every server has stopped, before the
// loops end.
func (p *Group) OnStopped(f func()) { p.stopped = append(p.stopped, f) }

// Run runs every part until ctx ends or one fails. It returns nil when ctx
// ended and every part stopped cleanly, else the joined errors of the parts
// that failed.
func (p *Group) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	var (
		mu   sync.Mutex
		errs []error
	)
	record := func(err error) error {
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		return err
	}
	for _, f := range p.stopping {
		stop := context.AfterFunc(gctx, f)
		defer stop()
	}
	// The loops outlive the servers: their context ends after the
	// stopped hooks, and keeps ctx's values.
	loopCtx, stopLoops := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLoops()
	for _, run := range p.loops {
		g.Go(func() error { return record(run(loopCtx)) })
	}
	var servers sync.WaitGroup
	for _, run := range p.servers {
		servers.Add(1)
		g.Go(func() error {
			defer servers.Done()
			return record(run(gctx))
		})
	}
	g.Go(func() error {
		servers.Wait()
		for _, f := range p.stopped {
			f()
		}
		stopLoops()
		return nil
	})
	_ = g.Wait() // the first of errs; run reports them all
	return errors.Join(errs...)
}
