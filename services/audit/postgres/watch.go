package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/internal/storage/pglisten"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/internal/feed"
)

// ListenerApplicationName is the application_name of the listener's connection, so that it can
// be told apart in pg_stat_activity.
const ListenerApplicationName = "mandate-audit-listener"

// Watch implements audit.Store. It returns once the listener has LISTEN in place (or after
// Options.WatchReadyTimeout; the poll then covers the gap).
func (s *Store) Watch(ctx context.Context, tenant string, afterSeq int64) (<-chan audit.Stored, error) {
	if tenant == "" {
		return nil, &audit.ValidationError{Field: "tenant", Reason: "is required"}
	}
	if afterSeq < 0 {
		return nil, &audit.ValidationError{Field: "after_seq", Reason: "is negative"}
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, audit.ErrClosed
	}
	s.watchers++
	if s.stop == nil {
		lctx, stop := context.WithCancel(context.Background())
		s.stop, s.ready = stop, make(chan struct{})
		s.wg.Add(1)
		go s.listen(lctx, s.ready)
	}
	ready := s.ready
	s.wg.Add(1)
	s.mu.Unlock()

	t := time.NewTimer(s.opts.WatchReadyTimeout)
	select {
	case <-ready:
	case <-ctx.Done():
	case <-t.C:
	}
	t.Stop()

	out := make(chan audit.Stored)
	fetch := func(ctx context.Context, after int64, limit int) ([]audit.Stored, error) {
		rows, err := s.pool.Query(ctx, "SELECT "+columnList+" FROM audit.records WHERE tenant = $1 AND seq > $2 ORDER BY seq LIMIT $3",
			tenant, after, limit)
		if err != nil {
			return nil, mapErr("audit: watch", err)
		}
		recs, err := pgx.CollectRows(rows, scanRow)
		return recs, mapErr("audit: watch", err)
	}
	go func() {
		defer s.wg.Done()
		defer s.unwatch()
		feed.Tail(ctx, s.done, out, afterSeq, fetch, func() <-chan struct{} { return s.hub.Wait(tenant) },
			feed.TailOptions{Poll: s.opts.WatchPoll, Logger: s.opts.Logger})
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
		Name:            "audit listener",
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

// announce queues a NOTIFY for tenants that got rows. It is sent after the commit, by one
// goroutine that coalesces what queued meanwhile, on a statement of its own: inside the append
// transaction, NOTIFY would take the cluster-wide notify-queue lock at commit and hold it
// through the commit's fsync, serialising every notifying commit of every tenant. After each
// NOTIFY the goroutine waits Options.AnnounceEvery before the next, so that a busy Store sends
// at most one per interval whatever its commit rate; the first after a quiet spell goes at
// once. A notification lost to a crash between commit and NOTIFY (or to Close within the
// interval) costs remote watchers one poll interval (Options.WatchPoll).
func (s *Store) announce(tenants []string) {
	if len(tenants) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.annPending == nil {
		s.annPending = map[string]bool{}
	}
	for _, t := range tenants {
		s.annPending[t] = true
	}
	if !s.annRunning {
		s.annRunning = true
		s.wg.Add(1)
		go s.announcer()
	}
	select {
	case s.annSignal <- struct{}{}:
	default:
	}
}

func (s *Store) announcer() {
	defer s.wg.Done()
	for {
		select {
		case <-s.done:
			return
		case <-s.annSignal:
		}
		s.mu.Lock()
		tenants := make([]string, 0, len(s.annPending))
		for t := range s.annPending {
			tenants = append(tenants, t)
		}
		clear(s.annPending)
		s.mu.Unlock()
		if len(tenants) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 2)}
		b.Queue(sqlAsyncCommit)
		b.Queue(sqlNotify, textParam(s.typed, tenants))
		// Without BEGIN the two statements run as one implicit transaction.
		if err := s.pool.SendBatch(ctx, b).Close(); err != nil && s.ctx.Err() == nil {
			s.opts.Logger.Warn("audit: NOTIFY after commit failed; remote watchers catch up at their next poll",
				"error_kind", pg.Classify(err).String(), "tenants", len(tenants))
		}
		cancel()
		if s.opts.AnnounceEvery > 0 {
			pause := time.NewTimer(s.opts.AnnounceEvery)
			select {
			case <-s.done:
				pause.Stop()
				return
			case <-pause.C:
			}
		}
	}
}
