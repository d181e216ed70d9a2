package executor

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
)

// The executor's outbox of audit rows is its spool (Store.Spool): every
// intent goes there before its call is dispatched, and every later row of
// the call after it. Concurrent calls share a commit: on a store that
// spools batches (BatchSpooler), one writer (writeOutbox) takes the rows
// queued while the previous batch committed and commits them together, as
// the audit service's Writer does for the appends, and answers every
// caller. The relay then appends the rows it knows this executor
// committed (outbox.own) without reading them back, while nothing older
// waits in the store before them; once something does (the trail was
// down, a row was refused), it reads the store's oldest rows instead until
// it has caught up.

const (
	// outboxBatch bounds the rows one batch commits.
	outboxBatch = 512
	// outboxQueue bounds the rows waiting for the writer.
	outboxQueue = 4096
	// maxOwn bounds the rows the relay remembers; past it, it reads the
	// store instead.
	maxOwn = 8 * spoolBatch
)

// outboxReq is a row waiting for the writer, and where its caller waits.
type outboxReq struct {
	row SpooledRow
	// lazy: the row may be committed without waiting for the WAL flush
	// (BatchSpooler.SpoolRows).
	lazy bool
	done chan error
}

// auditOutbox is the writer's queue and the rows this executor committed
// and has not relayed yet.
type auditOutbox struct {
	// spooler is the store's batch spooling; nil: rows are spooled one at
	// a time and the relay reads them back.
	spooler BatchSpooler
	queue   chan *outboxReq
	// stop ends the writer, done says it ended.
	stop, done chan struct{}

	mu sync.Mutex
	// own are the rows committed by this executor and not relayed yet, in
	// commit (id) order, unless it overflowed (maxOwn) since.
	own []SpooledRow
	// behind: rows may wait in the store before those in own (a relay
	// round failed, own overflowed), so the relay reads the store.
	behind bool
	// overflows counts the times own overflowed and was dropped.
	overflows uint64
}

// newAuditOutbox returns the outbox over store, its writer not started.
func newAuditOutbox(store Store) *auditOutbox {
	o := &auditOutbox{stop: make(chan struct{}), done: make(chan struct{})}
	if bs, ok := store.(BatchSpooler); ok {
		o.spooler, o.queue = bs, make(chan *outboxReq, outboxQueue)
	}
	return o
}

// inOrder reports whether the relay may append the rows in own: nothing
// older waits in the store.
func (o *auditOutbox) inOrder() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.spooler != nil && !o.behind
}

// pending is how many rows own holds.
func (o *auditOutbox) pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.own)
}

// committed records rows this executor committed (ids set), in order.
func (o *auditOutbox) committed(rows []SpooledRow) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.own)+len(rows) > maxOwn {
		// The relay is far behind (the trail is down): it reads these
		// from the store.
		o.behind, o.own = true, nil
		o.overflows++
		return
	}
	o.own = append(o.own, rows...)
}

// fellBehind marks that rows may wait in the store before those in own.
func (o *auditOutbox) fellBehind() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.behind = true
}

// mark is what caughtUp compares with: own overflowed since, or not.
func (o *auditOutbox) mark() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.overflows
}

// caughtUp forgets the rows a round that read the store relayed; when
// that round relayed everything the store held (all) and own kept every
// row committed since the round began (mark), nothing older than own's
// rows is left, and the relay appends own again.
func (o *auditOutbox) caughtUp(relayed []int64, all bool, mark uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(relayed) > 0 && len(o.own) > 0 {
		o.own = slices.DeleteFunc(o.own, func(r SpooledRow) bool { return slices.Contains(relayed, r.ID) })
	}
	if all && o.overflows == mark {
		o.behind = false
	}
}

// enqueue keeps rec in the executor's outbox of audit rows (the spool),
// within timeout, and wakes the relay, which appends it to the trail right
// after. The row's time is when it was made durable.
//
// An intent is committed durably. Every later row of the call is lazy: a
// crash of the store's server may lose it, and the reconciler then
// settles the intent from the backend's receipt, as for a call whose
// executor died before it wrote the outcome. A batch is lazy only when
// every row in it is.
func (e *Executor) enqueue(ctx context.Context, rec *mandatev1.AuditRecord, timeout time.Duration) error {
	if rec.Time == nil {
		rec.Time = timestamppb.New(e.cfg.Now())
	}
	o := e.outbox
	if o.spooler == nil {
		if err := e.storeRow(ctx, rec, timeout); err != nil {
			return err
		}
		e.wakeRelay()
		return nil
	}
	b, err := encodeSpooled(rec)
	if err != nil {
		return err
	}
	// rec is not changed once queued: the relay may send it as it is.
	req := &outboxReq{row: SpooledRow{Tenant: rec.GetTenant(), InvocationID: rec.GetInvocationId(), Record: b, Time: rec.GetTime().AsTime(), rec: rec},
		lazy: rec.GetPhase() != contract.PhaseIntent, done: make(chan error, 1)}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-o.done:
		// The writer has stopped (Close): one row at a time.
		if err := e.storeRow(ctx, rec, timeout); err != nil {
			return err
		}
		e.wakeRelay()
		return nil
	default:
	}
	select {
	case o.queue <- req:
	case <-o.done:
		return errOutboxClosed
	case <-t.C:
		return context.DeadlineExceeded
	}
	select {
	case err := <-req.done:
		return err
	case <-t.C:
		// The batch may still commit: the row then reaches the trail after
		// the answer the caller gets now (appends being idempotent, a row
		// also appended another way is stored once).
		return context.DeadlineExceeded
	}
}

// errOutboxClosed: the executor closed while the row waited.
var errOutboxClosed = errors.New("executor: the outbox writer has stopped")

// writeOutbox is the outbox's writer: it commits what callers queued,
// batch after batch, each batch what queued while the previous one
// committed (at most outboxBatch rows), and answers every caller with the
// batch's result. Rows still queued when stop closes are written before
// it ends.
func (e *Executor) writeOutbox() {
	o := e.outbox
	defer close(o.done)
	batch := make([]*outboxReq, 0, outboxBatch)
	for {
		var first *outboxReq
		select {
		case first = <-o.queue:
		case <-o.stop:
			// Whatever was queued before stop is written; a caller that
			// queues after it finds done closed.
			for {
				select {
				case r := <-o.queue:
					e.commitOutbox([]*outboxReq{r})
				default:
					return
				}
			}
		}
		batch = o.fill(append(batch[:0], first))
		if e.cfg.RelayLinger > 0 && lazyOnly(batch) {
			batch = e.awaitDurable(batch)
		}
		e.commitOutbox(batch)
	}
}

// fill adds to batch what is queued, up to outboxBatch rows.
func (o *auditOutbox) fill(batch []*outboxReq) []*outboxReq {
	for len(batch) < outboxBatch {
		select {
		case r := <-o.queue:
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// lazyOnly reports whether no row of batch needs a durable commit.
func lazyOnly(batch []*outboxReq) bool {
	for _, r := range batch {
		if !r.lazy {
			return false
		}
	}
	return true
}

// awaitDurable holds a batch of lazy rows — outcomes, written after their
// call's reply, whose callers no client waits for — for up to half the
// relay's linger, until a row that must be durable comes (another call's
// intent), the batch is full, or the writer stops: the two then commit as
// one, and an outcome costs no commit of its own. The relay, which lingers
// the whole linger after the intent woke it, still finds the outcome
// committed and sends the two together.
func (e *Executor) awaitDurable(batch []*outboxReq) []*outboxReq {
	o := e.outbox
	t := time.NewTimer(e.cfg.RelayLinger / 2)
	defer t.Stop()
	for len(batch) < outboxBatch {
		select {
		case r := <-o.queue:
			batch = append(batch, r)
			if !r.lazy {
				return o.fill(batch)
			}
		case <-t.C:
			return batch
		case <-o.stop:
			return batch
		}
	}
	return batch
}

// commitOutbox spools batch in one transaction and answers its callers.
func (e *Executor) commitOutbox(batch []*outboxReq) {
	o := e.outbox
	rows := make([]SpooledRow, len(batch))
	lazy := true
	for i, r := range batch {
		rows[i] = r.row
		lazy = lazy && r.lazy
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(e.cfg.OutcomeAttemptTimeout, intentTimeout))
	ids, err := o.spooler.SpoolRows(ctx, rows, lazy)
	cancel()
	if err == nil {
		for i := range rows {
			rows[i].ID = ids[i]
		}
		o.committed(rows)
		e.wakeRelay()
	}
	for _, r := range batch {
		r.done <- err
	}
}

// head is the oldest rows this executor committed and has not relayed,
// up to a batch.
func (o *auditOutbox) head() []SpooledRow {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.own[:min(len(o.own), spoolBatch)])
}

// relayOwn appends rows, the oldest this executor committed (head), and
// drops them from the store. A round that fails leaves them in the store,
// and the relay reads the store from then on until it has caught up, so
// that no row overtakes one before it. It sends none and says older when
// the lease found a row older than these waiting in the store: the round
// reads the store instead.
func (e *Executor) relayOwn(ctx context.Context, rows []SpooledRow, lease *RelayLease) (n int, older bool, err error) {
	o := e.outbox
	if len(rows) == 0 {
		return 0, false, nil
	}
	// Another relay may have sent some of them while it held the store's
	// relay lease (a round that read the store): those are forgotten.
	kept, older := stillOwn(rows, lease)
	if len(kept) < len(rows) {
		gone := make(map[int64]bool, len(rows)-len(kept))
		for _, r := range rows {
			gone[r.ID] = true
		}
		for _, r := range kept {
			delete(gone, r.ID)
		}
		o.mu.Lock()
		o.own = slices.DeleteFunc(o.own, func(r SpooledRow) bool { return gone[r.ID] })
		o.mu.Unlock()
		rows = kept
	}
	if older {
		return 0, true, nil
	}
	if len(rows) == 0 {
		return 0, false, nil
	}
	recs := make([]*mandatev1.AuditRecord, 0, len(rows))
	ids := make([]int64, len(rows))
	for i, r := range rows {
		rec := r.rec
		if rec == nil {
			var err error
			if rec, err = decodeSpooled(r.Record); err != nil {
				o.fellBehind()
				return 0, false, err
			}
		}
		recs = append(recs, rec)
		ids[i] = r.ID
	}
	actx, cancel := context.WithTimeout(ctx, e.cfg.OutcomeAttemptTimeout)
	_, err = e.append(actx, recs...)
	cancel()
	if err != nil {
		o.fellBehind()
		return 0, false, err
	}
	o.mu.Lock()
	o.own = o.own[min(len(o.own), len(rows)):]
	o.mu.Unlock()
	e.recordLag(ctx, rows)
	// A row left in the store after all (its delete failed) is appended
	// again by a round that reads the store, and stored once.
	return len(rows), false, lease.UnspoolAndRelease(ctx, e.cfg.Store, ids)
}
