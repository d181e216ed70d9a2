package executor

import (
	"context"
	"errors"
	"sync"
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
	// TryRelayLease takes the store's relay lease without waiting: nil
	// (and no error) when another holder has it. A holder calls Release,
	// once, when its round ends, whatever its context has become; the
	// lease also goes with its holder's process or connection, so a holder
	// that dies does not keep it (Postgres: a session advisory lock,
	// released when its session ends).
	//
	// With the lease, in the same exchange with the store and read after
	// the lease was taken, it says which of own (ids of rows the holder
	// spooled itself) are still spooled, and the id of the oldest row
	// spooled (0: none). A relay that sends rows it committed itself,
	// without reading them back, leaves out those another relay sent (and
	// unspooled) meanwhile; and when an older row waits before them
	// (another executor's), it reads and sends the store's oldest rows
	// instead, so that a busy executor's relay, which takes the lease round
	// after round, sends the others' rows too.
	TryRelayLease(ctx context.Context, own []int64) (*RelayLease, error)
}

// RelayLease is a relay round's hold on the store's relay lease.
type RelayLease struct {
	mu   sync.Mutex
	done bool // given back (Release, or unspool)
	// release gives the lease back; unspool, when the store sets it
	// (WithUnspool), drops rows and gives the lease back in one exchange.
	release func()
	unspool func(ctx context.Context, ids []int64) error
	// Left are those of the ids asked about still spooled, in increasing
	// order; Oldest is the oldest spooled id (0: none).
	Left   []int64
	Oldest int64
}

// NewRelayLease is a lease that release gives back, which found left of
// the ids asked about still spooled and oldest the oldest spooled id.
func NewRelayLease(release func(), left []int64, oldest int64) *RelayLease {
	return &RelayLease{release: release, Left: left, Oldest: oldest}
}

// WithUnspool lets the lease drop a round's rows and give itself back in
// one exchange with the store (unspool), and returns it. unspool must
// give the lease back whatever it returns.
func (l *RelayLease) WithUnspool(unspool func(ctx context.Context, ids []int64) error) *RelayLease {
	l.unspool = unspool
	return l
}

// giveBack marks the lease given back, and says whether it was held.
func (l *RelayLease) giveBack() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	held := !l.done
	l.done = true
	return held
}

// Release gives the lease back; only the first call (or unspool) does.
func (l *RelayLease) Release() {
	if l.giveBack() {
		l.release()
	}
}

// UnspoolAndRelease drops ids from st, the rows the trail now holds, and
// gives the lease back: in one exchange where the store offers it
// (WithUnspool), otherwise with st.Unspool and then Release.
func (l *RelayLease) UnspoolAndRelease(ctx context.Context, st Store, ids []int64) error {
	if l.unspool != nil && len(ids) > 0 && l.giveBack() {
		return l.unspool(ctx, ids)
	}
	err := st.Unspool(ctx, ids)
	l.Release()
	return err
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

// relayLease takes the store's relay lease for one round in which the
// relay would send own, this executor's rows (none: a round that reads
// the store). A store without one (not a RelayLeaser) always grants it,
// with all of own still spooled and nothing older.
func (e *Executor) relayLease(ctx context.Context, own []SpooledRow) (*RelayLease, error) {
	ids := make([]int64, len(own))
	for i, r := range own {
		ids[i] = r.ID
	}
	l, ok := e.cfg.Store.(RelayLeaser)
	if !ok {
		return NewRelayLease(func() {}, ids, 0), nil
	}
	lease, err := l.TryRelayLease(ctx, ids)
	switch {
	case err != nil:
		return nil, err
	case lease == nil:
		return nil, errRelayBusy
	}
	return lease, nil
}

// stillOwn keeps those of rows (this executor's, in id order) that the
// lease found still spooled: another relay may have sent the others while
// it held the lease. It says whether a row older than those kept waits in
// the store (another executor's, or one the trail refused).
func stillOwn(rows []SpooledRow, lease *RelayLease) (kept []SpooledRow, older bool) {
	left, oldest := lease.Left, lease.Oldest
	older = oldest != 0 && (len(left) == 0 || oldest < left[0])
	if len(left) == len(rows) {
		return rows, older
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
	return kept, older
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
