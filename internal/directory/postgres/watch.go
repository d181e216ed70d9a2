package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/storage/pglisten"
)

// ListenerApplicationName is the application_name of the listener's connection, so that it can
// be told apart in pg_stat_activity.
const ListenerApplicationName = "mandate-directory-listener"

// listenerRun is the state of one listener goroutine; guarded by Store.mu.
type listenerRun struct {
	ready     chan struct{} // closed once LISTEN is first in place
	connected bool          // LISTEN has been in place at least once
	early     bool          // a Watch gave up waiting for ready: flush on first connect
	listening bool          // LISTEN is in place right now
	conn      uint64        // counts connections, to tell stale echo registrations apart
	// pending counts the NOTIFYs this Store sent, per sending backend and tenant, whose echo
	// has not arrived yet. Update already announced those changes in-process.
	pending map[echoKey]int
}

type echoKey struct {
	pid    uint32
	tenant string
}

// echoReg records what one Update attempt registered, so it can be withdrawn if the attempt
// does not commit.
type echoReg struct {
	run  *listenerRun
	conn uint64
	keys []echoKey
}

// expectEchoes registers the notifications a transaction is about to commit, if a listener is
// listening now: their echo is then dropped instead of announced a second time. When no
// listener is in place, nothing is registered and an echo, should one arrive, is announced
// again, which is harmless.
func (s *Store) expectEchoes(pid uint32, tenants []string) echoReg {
	s.mu.Lock()
	defer s.mu.Unlock()
	run := s.run
	if run == nil || !run.listening {
		return echoReg{}
	}
	reg := echoReg{run: run, conn: run.conn}
	for _, t := range tenants {
		k := echoKey{pid, t}
		run.pending[k]++
		reg.keys = append(reg.keys, k)
	}
	return reg
}

func (s *Store) forgetEchoes(reg echoReg) {
	if reg.run == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if reg.run.conn != reg.conn { // reconnected meanwhile: the map was reset
		return
	}
	for _, k := range reg.keys {
		if reg.run.pending[k] > 1 {
			reg.run.pending[k]--
		} else {
			delete(reg.run.pending, k)
		}
	}
}

// isEcho reports (and consumes) whether a notification is the echo of this Store's own commit.
func (s *Store) isEcho(run *listenerRun, pid uint32, tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := echoKey{pid, tenant}
	switch n := run.pending[k]; {
	case n > 1:
		run.pending[k]--
	case n == 1:
		delete(run.pending, k)
	default:
		return false
	}
	return true
}

// Watch implements directory.Store. While at least one watcher is registered, a listener on a
// dedicated connection (outside the pool) forwards the changes committed by other processes to
// every watcher; it stops when the last watcher's context ends, or at Close. Watch returns once
// LISTEN is in place (or after Options.WatchReadyTimeout), so every change committed after it
// returns is heard. When the listener reconnects it announces a change to all tenants, since
// notifications sent while it was away are lost.
func (s *Store) Watch(ctx context.Context) <-chan directory.Change {
	ch := s.notifier.Watch(ctx)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ch
	}
	s.watchers++
	if s.stop == nil {
		lctx, stop := context.WithCancel(context.Background())
		run := &listenerRun{ready: make(chan struct{})}
		s.stop, s.run = stop, run
		s.wg.Add(1)
		go s.listen(lctx, run)
	}
	run := s.run
	s.mu.Unlock()
	context.AfterFunc(ctx, s.unwatch)

	t := time.NewTimer(s.opts.WatchReadyTimeout)
	defer t.Stop()
	select {
	case <-run.ready:
	case <-ctx.Done():
	case <-t.C:
		s.mu.Lock()
		if !run.connected {
			run.early = true
		}
		s.mu.Unlock()
	}
	return ch
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

// listen runs the listener until ctx ends. Each time LISTEN is in place it resets the echo
// bookkeeping and, after a reconnect or when a Watch stopped waiting for the first connection,
// announces a change to all tenants; when the connection is lost it announces one too, since
// whatever was cached may be stale until the listener is back.
func (s *Store) listen(ctx context.Context, run *listenerRun) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		run.listening, run.pending = false, nil
		if s.run == run {
			s.run = nil
		}
		s.mu.Unlock()
	}()
	_ = pglisten.Run(ctx, pglisten.Config{
		Conn:            s.pool.Config().ConnConfig,
		ApplicationName: ListenerApplicationName,
		Channels:        []string{Channel},
		ReconnectMin:    s.opts.ReconnectMin,
		ReconnectMax:    s.opts.ReconnectMax,
		Logger:          s.opts.Logger,
		Name:            "directory change listener",
		Connected: func(ctx context.Context, resync bool) {
			s.mu.Lock()
			// Entries cached while nobody listened may predate a change we never heard about:
			// after a reconnect, or when a Watch stopped waiting for the first connection.
			flush := resync || run.early
			run.connected, run.listening = true, true
			run.conn++
			run.pending = map[echoKey]int{}
			if !resync {
				close(run.ready)
			}
			s.mu.Unlock()
			if flush {
				s.notifier.Publish(ctx, "")
			}
		},
		Notify: func(ctx context.Context, n *pgconn.Notification) {
			if !s.isEcho(run, n.PID, n.Payload) {
				s.notifier.Publish(ctx, n.Payload)
			}
		},
		Lost: func(ctx context.Context, _ error) {
			s.mu.Lock()
			run.listening, run.pending = false, nil
			s.mu.Unlock()
			// Whatever was cached may be stale now and stays so until we are back.
			s.notifier.Publish(ctx, "")
		},
	})
}
