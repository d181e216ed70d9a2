package executor

import (
	"context"
	"errors"
	"time"
)

// Several executors (replicas) may share one store, and each runs a relay
// woken by its own commits. The relay lease makes the rounds that send
// the store's rows one at a time across them: a round that does not get
// it reads and sends nothing of the store, and tries again soon
// (relayBusyRetry), since the holder may have read the store before this
// executor's rows committed. Rows held in memory (flushHeld) are this
// process's alone and need no lease.

// RelayLeaser is a Store that leases the relay's rounds, so that at most
// one relay at a time reads and sends the rows spooled in it, whichever
// executor runs it. The executor uses it where the store offers it;
// without it, several executors on one store may each send a row (the
// trail stores it once).
type RelayLeaser interface {
	// TryRelayLease takes the store's relay lease without waiting: ok
	// false (and release nil) when another holder has it. A holder calls
	// release, once, when its round ends, whatever its context has become;
	// the lease also goes with its holder's process or connection, so a
	// holder that dies does not keep it (Postgres: a session advisory lock,
	// released when its session ends).
	TryRelayLease(ctx context.Context) (release func(), ok bool, err error)
	// StillSpooled returns those of ids that are still spooled, in
	// increasing order, and the id of the oldest row spooled (0: none). A
	// relay that holds the lease and sends rows it committed itself,
	// without reading them back, leaves out those another relay sent (and
	// unspooled) meanwhile; and when an older row waits before them
	// (another executor's), it reads and sends the store's oldest rows
	// instead, so that a busy executor's relay, which takes the lease
	// round after round, sends the others' rows too.
	StillSpooled(ctx context.Context, ids []int64) (left []int64, oldest int64, err error)
}

// errRelayBusy: another relay holds the store's relay lease; this round
// read and sent nothing of the store.
var errRelayBusy = errors.New("executor: another relay holds the store's relay lease")

// The backoff of a relay whose round found the lease busy: it tries again
// after relayBusyFirst, doubling up to relayBusyMost, until it gets it —
// well within the second a row has to reach the trail, and without
// waiting for the next tick.
const (
	relayBusyFirst = 2 * time.Millisecond
	relayBusyMost  = 32 * time.Millisecond
)

// nextBusyWait is the wait after one of wait.
func nextBusyWait(wait time.Duration) time.Duration {
	if wait <= 0 {
		return relayBusyFirst
	}
	return min(2*wait, relayBusyMost)
}

// relayLease takes the store's relay lease for one round; a store without
// one (not a RelayLeaser) always grants it.
func (e *Executor) relayLease(ctx context.Context) (release func(), err error) {
	l, ok := e.cfg.Store.(RelayLeaser)
	if !ok {
		return func() {}, nil
	}
	release, ok, err = l.TryRelayLease(ctx)
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return nil, errRelayBusy
	}
	return release, nil
}

// stillOwn keeps those of rows (this executor's, in id order) that are
// still spooled: another relay may have sent the others while it held
// the lease. It says whether a row older than those kept waits in the
// store (another executor's, or one the trail refused). A store without a
// lease keeps them all, and says no.
func (e *Executor) stillOwn(ctx context.Context, rows []SpooledRow) (kept []SpooledRow, older bool, err error) {
	l, ok := e.cfg.Store.(RelayLeaser)
	if !ok {
		return rows, false, nil
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	left, oldest, err := l.StillSpooled(ctx, ids)
	if err != nil {
		return nil, false, err
	}
	older = oldest != 0 && (len(left) == 0 || oldest < left[0])
	if len(left) == len(rows) {
		return rows, older, nil
	}
	spooled := make(map[int64]bool, len(left))
	for _, id := range left {
		spooled[id] = true
	}
	kept = make([]SpooledRow, 0, len(left))
	for _, r := range rows {
		if spooled[r.ID] {
			kept = append(kept, r)
		}
	}
	return kept, older, nil
}

// flushLeased runs flushRound until a round gets the lease (or ctx ends),
// waiting the relay's backoff between refused rounds.
func (e *Executor) flushLeased(ctx context.Context, counts, full bool) (int, error) {
	var wait time.Duration
	got := 0
	for {
		n, err := e.flushRound(ctx, counts, full)
		got += n
		if !errors.Is(err, errRelayBusy) {
			return got, err
		}
		wait = nextBusyWait(wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return got, err
		case <-t.C:
		}
	}
}
