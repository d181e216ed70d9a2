package executor

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
)

// Defaults of the audit spool.
const (
	defaultSpoolInterval = time.Second
	spoolBatch           = 256
	// DeadLetterAfter is how many flushes a spooled row may fail with an
	// error other than unavailability (the trail refuses the row itself)
	// before it is moved to the dead letter (Store.Bury), logged and
	// counted; it is never dropped.
	DeadLetterAfter = 20
	// maxHeld bounds the rows held in memory while the executor's own
	// store is down too (a database outage takes both).
	maxHeld = 10000
)

// spoolStoreTimeout bounds spooling one row in the executor's store; a
// store that does not take it within this leaves the row held in memory.
const spoolStoreTimeout = time.Second

// spool keeps an audit row the trail would not take, so that it reaches
// the trail once it is back (FlushSpool): every attempt leaves its row,
// however long the audit service is down. When the executor's own store is
// down too (a database outage), the row is held in memory (up to maxHeld)
// until the trail takes it; only if the process dies first, or the bound
// is reached, is it lost — and that is logged at error level.
func (e *Executor) spool(ctx context.Context, inv *invocation, rec *mandatev1.AuditRecord) {
	if rec.Time == nil {
		rec.Time = timestamppb.New(e.cfg.Now())
	}
	// Bounded (spoolStored): the store is often on the database whose
	// outage made the trail unavailable, and the caller waits for this row.
	if err := e.spoolStored(ctx, rec); err != nil {
		e.heldMu.Lock()
		full := len(e.held) >= maxHeld
		if !full {
			e.held = append(e.held, rec)
		}
		e.heldMu.Unlock()
		if full {
			e.logger(ctx, inv).Error("audit row lost: the trail, the executor's spool and its memory are all full or down",
				"phase", rec.GetPhase(), "outcome", rec.GetOutcome(), "code", rec.GetCode(), "error", err)
			return
		}
		e.metrics.spooled.Add(ctx, 1)
		e.logger(ctx, inv).Warn("audit trail and executor store unavailable: row held in memory until the trail is back", "phase", rec.GetPhase(), "error", err)
		return
	}
	e.metrics.spooled.Add(ctx, 1)
	e.logger(ctx, inv).Warn("audit trail did not take the row: spooled, to be appended when it does", "phase", rec.GetPhase(), "outcome", rec.GetOutcome())
}

// every runs fn every interval until stop is closed, logging its failures
// at debug level (the next round retries). Closing stop ends a round in
// flight (its context is cancelled) and starts no other, so a hung
// database or trail does not hold the shutdown.
func (e *Executor) every(stop <-chan struct{}, interval time.Duration, what string, fn func(context.Context) (int, error)) {
	defer e.spoolWG.Done()
	ctx, cancel := untilStopped(stop)
	defer cancel()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		// A tick and stop may be ready together: stop wins.
		select {
		case <-stop:
			return
		default:
		}
		if _, err := fn(ctx); err != nil && ctx.Err() == nil {
			e.log.Debug(what+" failed; retrying", "error", err)
		}
	}
}

// untilStopped is a context that ends when stop is closed (or cancel is
// called): a round in flight of a background loop ends with the loop.
func untilStopped(stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// wakeRelay has the relay flush now rather than at its next tick; a
// wake-up already pending covers this row too.
func (e *Executor) wakeRelay() {
	select {
	case e.relayWake <- struct{}{}:
	default:
	}
}

// relay is the spool's flusher: it appends what the outbox holds at every
// tick (FlushSpool) and whenever a row is spooled (wakeRelay), so that a
// row reaches the trail right after it is durable; under load one round
// takes what many calls spooled meanwhile. It goes on batch after batch
// while batches come full, so that a backlog drains at once rather than
// one batch a tick. Closing stop ends a round in flight and starts no
// other.
func (e *Executor) relay(stop <-chan struct{}, interval time.Duration) {
	defer e.spoolWG.Done()
	ctx, cancel := untilStopped(stop)
	defer cancel()
	t := time.NewTicker(interval)
	defer t.Stop()
	var (
		failed time.Time
		// retry wakes the relay once relayRetryAfter has passed, for rows
		// whose wake-up came too soon after a failed round.
		retry <-chan time.Time
		// busyWait is the last wait after a round that found the store's
		// relay lease busy (0: the last round got it).
		busyWait time.Duration
		// retryTick: the round the retry starts is a tick's, which found
		// the lease busy.
		retryTick bool
	)
	for {
		tick := false
		select {
		case <-stop:
			return
		case <-t.C:
			tick = true
		case <-e.relayWake:
			if !e.linger(stop) {
				return
			}
		case <-retry:
			retry, tick, retryTick = nil, retryTick, false
		}
		select {
		case <-stop:
			return
		default:
		}
		if wait := relayRetryAfter - time.Since(failed); !tick && wait > 0 {
			// The trail failed the last round: rows spooled meanwhile
			// are tried once, after the pause, rather than each trying it
			// again at once.
			if retry == nil {
				retry = time.After(wait)
			}
			continue
		}
		for ctx.Err() == nil {
			n, err := e.flushRound(ctx, tick, tick)
			if errors.Is(err, errRelayBusy) {
				// Another relay holds the store's lease, and may have read
				// the store before this executor's rows committed: try
				// again soon rather than at the next tick.
				busyWait = nextBusyWait(busyWait)
				retryTick = retryTick || tick
				if retry == nil {
					retry = time.After(busyWait)
				}
				break
			}
			busyWait = 0
			if err != nil && ctx.Err() == nil {
				failed = time.Now()
				e.log.Debug("audit spool: flush failed; retrying", "error", err)
			}
			if err != nil || n < spoolBatch {
				break
			}
		}
	}
}

// StoreRelayLinger is the relay's linger (Config.RelayLinger) that suits
// an executor over a database, where each append of the trail is a
// transaction of the audit service: it covers the dispatch of a typical
// call, so that its intent and outcome reach the trail in one append,
// and lets one append take the rows of many concurrent calls, far inside
// the second within which a row must be queryable. Side by side with 10ms
// and 25ms (mandate-bench, ticket.search, 16 callers), 50ms cost Postgres
// 0.31 ms of CPU per call against 0.41 and 0.37 ms. In memory (`mandate
// dev`) an append costs little, and a row is readable at once.
const StoreRelayLinger = 50 * time.Millisecond

// linger waits Config.RelayLinger after a wake-up, so that the round it
// starts takes the rows spooled meanwhile too; the wake-ups they sent are
// covered by it. It reports false if stop closed meanwhile.
func (e *Executor) linger(stop <-chan struct{}) bool {
	if e.cfg.RelayLinger <= 0 {
		return true
	}
	t := time.NewTimer(e.cfg.RelayLinger)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-t.C:
	}
	select {
	case <-e.relayWake:
	default:
	}
	return true
}

// relayRetryAfter is how long after a failed round the relay puts off the
// wake-ups of rows spooled meanwhile (its tick still tries): a trail that
// is down is not asked again for every batch the executor commits.
const relayRetryAfter = 100 * time.Millisecond

// FlushSpool appends spooled audit rows to the trail, oldest first, and
// drops those it appended; it returns how many. A row the trail refuses for
// a reason other than its unavailability is tried again at later flushes
// and, after DeadLetterAfter of them, kept in the dead letter (bury).
//
// While another relay holds the store's relay lease (RelayLeaser), it
// waits for it, as long as ctx lets it.
func (e *Executor) FlushSpool(ctx context.Context) (int, error) {
	return e.flushLeased(ctx, true, true)
}

// flushRound is one round of the relay. Only a round that counts (a tick, or a
// FlushSpool) counts the trail's refusals towards DeadLetterAfter: rounds
// woken by every spooled row would otherwise bury a refused row within a
// busy second instead of after DeadLetterAfter ticks. A round that is not
// full relays the rows this executor committed itself (relayOwn), without
// reading them back, while nothing older waits before them; a full round
// (a tick, Close, or any round once the outbox fell behind) reads the
// oldest rows of the store, whoever spooled them; full says which.
// Rounds run one at a time, and, on a store that leases them
// (RelayLeaser), one at a time across the executors that share it: a
// round that does not get the lease sends only the rows held in memory,
// and says errRelayBusy.
func (e *Executor) flushRound(ctx context.Context, counts, full bool) (int, error) {
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	held, err := e.flushHeld(ctx)
	if err != nil {
		return held, err
	}
	own := !full && e.outbox.inOrder()
	if own && e.outbox.pending() == 0 {
		return held, nil // nothing of its own to send: no need of the lease
	}
	// The store's rows are sent by one relay at a time (relaylease.go).
	var rows []SpooledRow
	if own {
		rows = e.outbox.head()
	}
	lease, err := e.relayLease(ctx, rows)
	if err != nil {
		return held, err
	}
	defer lease.Release()
	if own {
		n, older, err := e.relayOwn(ctx, rows, lease)
		if !older && (err == nil || unavailable(err) || ctx.Err() != nil) {
			return held + n, err
		}
		// Rows of other executors wait before this one's, or the trail
		// refused a row of the batch (not for being down): this round
		// sends the store's oldest rows, theirs and its own, in order —
		// one at a time if the batch is refused, so that the rows the
		// trail takes are not held back by the one it refuses.
	}
	mark := e.outbox.mark()
	relayed, read, err := e.flushStoredRows(ctx, counts)
	// Everything read went to the trail, and it was all there was: no row
	// waits before those this executor committed since.
	e.outbox.caughtUp(relayed, err == nil && read < spoolBatch && len(relayed) == read, mark)
	return held + len(relayed), err
}

// flushHeld appends the rows held in memory while the store was down.
func (e *Executor) flushHeld(ctx context.Context) (int, error) {
	e.heldMu.Lock()
	recs := e.held[:min(len(e.held), spoolBatch)]
	e.heldMu.Unlock()
	if len(recs) == 0 {
		return 0, nil
	}
	actx, cancel := context.WithTimeout(ctx, e.cfg.OutcomeAttemptTimeout)
	_, err := e.append(actx, recs...)
	cancel()
	if err != nil && (unavailable(err) || ctx.Err() != nil) {
		return 0, err // all kept; the next flush tries again
	}
	appended := len(recs)
	var keep []*mandatev1.AuditRecord
	if err != nil {
		// Something in the batch is refused: one at a time. A row the
		// trail refuses outright goes to the store's spool, whose flusher
		// tries it again and in the end keeps it in the dead letter; while
		// the store will not take it either, it stays held.
		appended = 0
		for i := range recs {
			actx, cancel := context.WithTimeout(ctx, e.cfg.OutcomeAttemptTimeout)
			_, err := e.append(actx, recs[i])
			cancel()
			switch {
			case err == nil:
				appended++
			case unavailable(err) || ctx.Err() != nil:
				// The next flush tries this row and the rest again (and
				// those appended, appends being idempotent); those moved
				// to the store's spool are no longer held.
				keep = append(keep, recs[i:]...)
				e.heldMu.Lock()
				e.held = append(keep, e.held[len(recs):]...)
				e.heldMu.Unlock()
				return appended, err
			default:
				if serr := e.spoolStored(ctx, recs[i]); serr != nil {
					keep = append(keep, recs[i])
					continue
				}
				e.log.Warn("audit spool: the trail refuses a held row; spooled in the executor's store to be tried again", "tenant", recs[i].GetTenant(),
					"invocation_id", recs[i].GetInvocationId(), "error", err)
			}
		}
	}
	e.heldMu.Lock()
	e.held = append(keep, e.held[len(recs):]...)
	e.heldMu.Unlock()
	return appended, nil
}

// spoolStored spools rec in the executor's store, within spoolStoreTimeout.
func (e *Executor) spoolStored(ctx context.Context, rec *mandatev1.AuditRecord) error {
	return e.storeRow(ctx, rec, spoolStoreTimeout)
}

// storeRow spools rec in the executor's store, within timeout, whether or
// not the caller still waits.
func (e *Executor) storeRow(ctx context.Context, rec *mandatev1.AuditRecord, timeout time.Duration) error {
	b, err := encodeSpooled(rec)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return e.cfg.Store.Spool(sctx, SpooledRow{Tenant: rec.GetTenant(), InvocationID: rec.GetInvocationId(), Record: b, Time: rec.GetTime().AsTime()})
}

// bury keeps a spooled row the trail refuses outright in the dead letter
// (Store.Bury), logs it and counts it; it reports whether the store took
// it (if not, the row stays spooled and the next flush tries again).
func (e *Executor) bury(ctx context.Context, r SpooledRow, reason string) bool {
	err := e.cfg.Store.Bury(ctx, DeadLetter{SpoolID: r.ID, Tenant: r.Tenant, InvocationID: r.InvocationID, Record: r.Record,
		Spooled: r.Time, Dead: e.cfg.Now(), Reason: reason})
	if err != nil {
		e.log.Warn("audit spool: a row the trail refuses could not be moved to the dead letter; it stays spooled", "tenant", r.Tenant,
			"invocation_id", r.InvocationID, "error", err)
		return false
	}
	e.metrics.dead.Add(ctx, 1)
	e.log.Error("audit spool: the trail refuses a row; kept in the dead letter until an operator re-drives it (mandate audit dead-letters)",
		"tenant", r.Tenant, "invocation_id", r.InvocationID, "reason", reason)
	return true
}

// flushStoredRows appends the rows spooled in the store, oldest first,
// whoever spooled them, and says which it relayed and how many it read;
// counts says whether the trail's refusals count towards DeadLetterAfter
// (flush).
func (e *Executor) flushStoredRows(ctx context.Context, counts bool) (relayed []int64, read int, err error) {
	rows, err := e.cfg.Store.Spooled(ctx, spoolBatch)
	if err != nil || len(rows) == 0 {
		return nil, 0, err
	}
	recs := make([]*mandatev1.AuditRecord, 0, len(rows))
	ids := make([]int64, 0, len(rows))
	times := make([]time.Time, 0, len(rows))
	for _, r := range rows {
		rec, err := decodeSpooled(r.Record)
		if err != nil {
			e.bury(ctx, r, "the spooled row cannot be read: "+err.Error())
			continue
		}
		recs = append(recs, rec)
		ids = append(ids, r.ID)
		times = append(times, r.Time)
	}
	actx, cancel := context.WithTimeout(ctx, e.cfg.OutcomeAttemptTimeout)
	_, err = e.append(actx, recs...)
	cancel()
	if err == nil {
		e.metrics.relayed(ctx, e.cfg.Now(), times...)
		return ids, len(rows), e.cfg.Store.Unspool(ctx, ids)
	}
	if unavailable(err) || ctx.Err() != nil {
		return nil, len(rows), err
	}
	// Something in the batch is refused: one at a time.
	ids = ids[:0]
	for _, r := range rows {
		rec, err := decodeSpooled(r.Record)
		if err != nil {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, e.cfg.OutcomeAttemptTimeout)
		_, err = e.append(actx, rec)
		cancel()
		switch {
		case err == nil:
			ids = append(ids, r.ID)
			e.metrics.relayed(ctx, e.cfg.Now(), r.Time)
		case unavailable(err) || ctx.Err() != nil:
		case !counts:
		default:
			e.spoolFailures[r.ID]++
			if e.spoolFailures[r.ID] >= DeadLetterAfter && e.bury(ctx, r, failure.ToStatus(err).Message()) {
				delete(e.spoolFailures, r.ID)
			}
		}
	}
	return ids, len(rows), e.cfg.Store.Unspool(ctx, ids)
}

// recordLag records how long rows, appended to the trail just now, waited
// in the outbox (MetricRelayLag).
func (e *Executor) recordLag(ctx context.Context, rows []SpooledRow) {
	now := e.cfg.Now()
	for _, r := range rows {
		e.metrics.relayed(ctx, now, r.Time)
	}
}

// append appends recs to the trail in one request.
func (e *Executor) append(ctx context.Context, recs ...*mandatev1.AuditRecord) ([]*mandatev1.AuditRecord, error) {
	resp, err := e.cfg.Audit.Append(ctx, &mandatev1.AppendRequest{Records: recs})
	return resp.GetRecords(), err
}

// unavailable reports an audit error that says the trail could not be
// reached or did not answer, as opposed to a row it refused: appending the
// same rows again may succeed (appends are idempotent). The audit service
// says so with a gRPC code, or with a Mandate code whose gRPC code in the
// table of codes is Unavailable (its store is down, or a concurrent writer
// got in the way).
func unavailable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	st := failure.ToStatus(err)
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted,
		// A fault of the trail (its store failing in a way it did not
		// classify) says nothing against the row: keep it and try again.
		codes.Internal, codes.Unknown:
		return true
	}
	fe, ok := failure.FromStatus(st)
	return ok && failure.GRPCCode(fe.Code) == codes.Unavailable
}
