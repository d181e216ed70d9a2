package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mandate-dev/mandate/internal/storage/pglisten"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/internal/follow"
)

// ListenerApplicationName is the application_name of the listener's
// connection, so that it can be told apart in pg_stat_activity.
const ListenerApplicationName = "mandate-confirm-listener"

// Watch implements confirm.Store. It returns once the listener has LISTEN
// in place (or after Options.WatchReadyTimeout; the poll then covers the
// gap), so a decision made anywhere after Watch returns wakes it.
func (s *Store) Watch(ctx context.Context, tenant, id string) (<-chan confirm.Challenge, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	s.watchers++
	if s.stop == nil {
		lctx, stop := context.WithCancel(context.Background())
		s.stop, s.ready = stop, make(chan struct{})
		s.wg.Add(1)
		go s.listen(lctx, s.ready)
	}
	ready := s.ready
	s.mu.Unlock()

	t := time.NewTimer(s.opts.WatchReadyTimeout)
	select {
	case <-ready:
	case <-ctx.Done():
	case <-t.C:
	}
	t.Stop()

	sub := s.hub.Subscribe(id)
	woken := sub.C()
	first, err := s.Get(ctx, tenant, id)
	if err != nil {
		sub.Close()
		s.unwatch()
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		sub.Close()
		s.unwatch()
		return nil, errClosed
	}
	s.wg.Add(1) // under mu: Close cannot be waiting yet
	s.mu.Unlock()
	out := make(chan confirm.Challenge)
	go func() {
		defer s.wg.Done()
		defer s.unwatch()
		follow.Run(ctx, s.done, out, first, sub, woken,
			func(ctx context.Context) (confirm.Challenge, error) { return s.Get(ctx, tenant, id) },
			follow.Options{Poll: s.opts.WatchPoll, Logger: s.opts.Logger})
	}()
	return out, nil
}

func (s *Store) unwatch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchers--
	if s.watchers == 0 && s.stop != nil {
		s.stop()
		s.stop = nil
	}
}

// listen keeps a LISTEN connection open until ctx ends, reconnecting with backoff, and turns
// notifications into wake-ups.
func (s *Store) listen(ctx context.Context, ready chan struct{}) {
	defer s.wg.Done()
	_ = pglisten.Run(ctx, pglisten.Config{
		Conn:            s.pool.Config().ConnConfig,
		ApplicationName: ListenerApplicationName,
		Channels:        []string{Channel},
		ReconnectMin:    s.opts.ReconnectMin,
		ReconnectMax:    s.opts.ReconnectMax,
		Logger:          s.opts.Logger,
		Name:            "confirm listener",
		Connected: func(_ context.Context, resync bool) {
			if !resync {
				close(ready)
				return
			}
			// Notifications sent while we were away are lost: everyone re-reads.
			s.hub.NotifyAll()
		},
		Notify: func(_ context.Context, n *pgconn.Notification) { s.hub.Notify(n.Payload) },
	})
}
