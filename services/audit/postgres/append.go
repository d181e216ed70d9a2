package postgres

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/services/audit"
)

// An append takes one of two paths.
//
// The fast path is the common case: every tenant of the batch has a predicted chain head — the
// head as this Store last committed it, advanced by its batches still in flight. The new rows
// are chained onto the predictions in Go, and the whole transaction is sent in one round trip
// (see appendFast). Its first statement, move_heads, locks the batch's head rows FOR UPDATE (in
// tenant order) and advances them, failing with 40001 unless each is exactly (seq and hash)
// where the rows were chained onto; then the rows are inserted, the pending bookkeeping done,
// and the transaction commits. A stale prediction (another replica appended) or a key that is
// already stored (a retried append: unique index) makes the transaction fail and nothing is
// written; the batch then takes the locking path.
//
// The locking path is the general one: in a pg.InTx transaction it creates missing heads, locks
// the heads FOR UPDATE in tenant order, reads the rows that the batch's keys already have,
// chains the rest onto the locked heads and writes them the same way. Its result becomes the
// prediction.
//
// Both paths lock a tenant's head before they write any of its rows, and lock heads in tenant
// order, so appends to one tenant are serialised across processes and can never deadlock. One
// batch is one transaction: its rows, the heads and the pending bookkeeping commit together or
// not at all.

const (
	// sqlCustomPlans makes the transaction's statements be planned with their actual
	// arguments and the tables' current size. The statements are prepared once per connection;
	// a generic plan cached while the trail was small (a hash join over a sequential scan of
	// records) would otherwise stay in use as it grows, turning every append into a full scan.
	// Only the locking path needs it (sqlExistingRows). The fast path's statements have no plan
	// that depends on a table's size — move_heads and clear_pending probe by key, the INSERTs
	// have no plan to choose — so they keep their cached plans instead of being planned on
	// every append, which cost more than running them.
	sqlCustomPlans = `SELECT set_config('plan_cache_mode', 'force_custom_plan', true)`
	sqlEnsureHeads = `INSERT INTO audit.heads (tenant, seq, hash)
		SELECT t, 0, $2 FROM unnest($1::text[]) AS t ORDER BY t
		ON CONFLICT (tenant) DO NOTHING`
	sqlLockHeads = `SELECT tenant, seq, hash FROM audit.heads
		WHERE tenant = ANY($1::text[]) ORDER BY tenant FOR UPDATE`
	sqlMoveHeads  = `SELECT audit.move_heads($1::text[], $2::bigint[], $3::bytea[], $4::bigint[], $5::bytea[])`
	sqlAddPending = `INSERT INTO audit.pending (tenant, invocation_id, seq, time)
		SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[])
		ON CONFLICT DO NOTHING`
	sqlClearPending = `SELECT audit.clear_pending($1::text[], $2::text[])`
	sqlNotify       = `SELECT pg_notify('` + Channel + `', t) FROM unnest($1::text[]) AS t`
	// sqlAsyncCommit lets the NOTIFY's transaction commit without waiting for its WAL flush:
	// NOTIFY assigns a transaction id, so its commit would otherwise wait for an fsync of its
	// own, competing with the appends' commits for the WAL. It carries no data; a crash that
	// loses it costs remote watchers one poll, as when the process dies before sending it.
	sqlAsyncCommit = `SELECT set_config('synchronous_commit', 'off', true)`
)

// sqlExistingRows reads the stored rows of a batch's keys, one index probe per key.
var sqlExistingRows = `SELECT ` + rColumnList + `
	FROM unnest($1::text[], $2::text[], $3::text[]) AS k(tenant, invocation_id, phase)
	CROSS JOIN LATERAL (
		SELECT * FROM audit.records
		WHERE tenant = k.tenant AND invocation_id = k.invocation_id AND phase = k.phase
	) r`

// batchPlan is what both paths need to know about a batch.
type batchPlan struct {
	recs    []audit.Record
	tenants []string // sorted, distinct
}

func newPlan(recs []audit.Record) *batchPlan {
	p := &batchPlan{recs: recs, tenants: make([]string, 0, len(recs))}
	for i := range recs {
		p.tenants = append(p.tenants, recs[i].Tenant)
	}
	slices.Sort(p.tenants)
	p.tenants = slices.Compact(p.tenants)
	return p
}

// chained is the outcome of chaining a batch onto heads.
type chained struct {
	plan  *batchPlan
	out   []audit.Stored        // aligned with the batch
	fresh []*audit.Stored       // rows to insert, in order
	old   map[string]audit.Head // heads the rows were chained onto (tenants with fresh rows)
	heads map[string]audit.Head // heads after the batch (tenants with fresh rows)

	// Fast path only:
	after []*chained    // batches in flight that this one was chained onto
	ended chan struct{} // closed when this batch has committed or failed
}

// chain assigns Seq, PrevHash and Hash to the records whose key is not in stored, in batch
// order, and fills out. A key seen earlier in the batch gets that earlier row. The rows share
// slices with the records (the Writer hands over copies it owns).
func (p *batchPlan) chain(heads map[string]audit.Head, stored map[audit.Key]*audit.Stored) *chained {
	c := &chained{plan: p, out: make([]audit.Stored, len(p.recs)), old: map[string]audit.Head{}, heads: map[string]audit.Head{},
		fresh: make([]*audit.Stored, 0, len(p.recs))}
	if stored == nil {
		stored = map[audit.Key]*audit.Stored{}
	}
	for i := range p.recs {
		k := p.recs[i].Key()
		if row, ok := stored[k]; ok {
			c.out[i] = *row
			continue
		}
		h, ok := c.heads[k.Tenant]
		if !ok {
			h = heads[k.Tenant]
			c.old[k.Tenant] = h
		}
		c.out[i] = audit.Stored{Record: p.recs[i], Seq: h.Seq + 1, PrevHash: h.Hash}
		row := &c.out[i] // a fresh row lives in out itself (never grown): no slice of its own
		row.Hash = audit.ComputeHash(row.PrevHash, row.Seq, &row.Record)
		c.heads[k.Tenant] = audit.Head{Seq: row.Seq, Hash: row.Hash}
		stored[k] = row
		c.fresh = append(c.fresh, row)
	}
	return c
}

// queueMoveHeads queues move_heads for the tenants that got rows; typed as for queueInsert.
func (c *chained) queueMoveHeads(b *pgx.Batch, typed bool) {
	var t []string
	for _, tenant := range c.plan.tenants {
		if _, ok := c.heads[tenant]; ok {
			t = append(t, tenant)
		}
	}
	if len(t) == 0 {
		return
	}
	n := len(t)
	seqs, hashes := make([]int64, 2*n), make([][]byte, 2*n) // two allocations instead of four
	oldSeq, newSeq := seqs[:n:n], seqs[n:]
	oldHash, newHash := hashes[:n:n], hashes[n:]
	for i, tenant := range t {
		oldSeq[i], oldHash[i] = c.old[tenant].Seq, c.old[tenant].Hash
		newSeq[i], newHash[i] = c.heads[tenant].Seq, c.heads[tenant].Hash
	}
	b.Queue(sqlMoveHeads, textParam(typed, t), int8Param(typed, oldSeq), byteaParam(typed, oldHash),
		int8Param(typed, newSeq), byteaParam(typed, newHash))
}

// queuePending queues the pending bookkeeping: new intents are pending; outcomes clear their
// intent's entry, also when the outcome was already stored (that is how a reconciliation that
// lost to the real outcome cleans up). An intent whose outcome is new in the same batch is never
// pending, so neither is written: no entry added, none cleared (the executor's relay sends a
// call's intent and outcome together whenever the outcome is spooled within its linger). typed
// as for queueInsert.
func (c *chained) queuePending(b *pgx.Batch, typed bool) {
	settled := c.settledInBatch()
	// Sized up front, the four text columns in one allocation: appending to empty slices
	// would reallocate each of them as it grows.
	intents, outcomes := 0, 0
	for _, r := range c.fresh {
		if r.Phase == audit.PhaseIntent && !settled[pendingKey{r.Tenant, r.InvocationID}] {
			intents++
		}
	}
	for i := range c.plan.recs {
		if r := &c.plan.recs[i]; r.Phase == audit.PhaseOutcome && !settled[pendingKey{r.Tenant, r.InvocationID}] {
			outcomes++
		}
	}
	texts := make([]string, 2*intents+2*outcomes)
	pT, pInv := texts[:0:intents], texts[intents:intents:2*intents]
	cT, cInv := texts[2*intents:2*intents:2*intents+outcomes], texts[2*intents+outcomes:2*intents+outcomes]
	pSeq, pTime := make([]int64, 0, intents), make([]time.Time, 0, intents)
	for _, r := range c.fresh {
		if r.Phase == audit.PhaseIntent && !settled[pendingKey{r.Tenant, r.InvocationID}] {
			pT, pInv, pSeq, pTime = append(pT, r.Tenant), append(pInv, r.InvocationID), append(pSeq, r.Seq), append(pTime, r.Time)
		}
	}
	if len(pT) > 0 {
		b.Queue(sqlAddPending, textParam(typed, pT), textParam(typed, pInv), int8Param(typed, pSeq), timeParam(typed, pTime))
	}
	for i := range c.plan.recs {
		if r := &c.plan.recs[i]; r.Phase == audit.PhaseOutcome && !settled[pendingKey{r.Tenant, r.InvocationID}] {
			cT, cInv = append(cT, r.Tenant), append(cInv, r.InvocationID)
		}
	}
	if len(cT) > 0 {
		b.Queue(sqlClearPending, textParam(typed, cT), textParam(typed, cInv))
	}
}

// pendingKey is an invocation of a tenant, as audit.pending keys it.
type pendingKey struct{ tenant, invocation string }

// settledInBatch is the invocations whose intent and outcome are both new rows of this batch
// (nil when there are none): no earlier batch can have left their intent pending, since the
// intent was not stored before.
func (c *chained) settledInBatch() map[pendingKey]bool {
	var fresh map[pendingKey]bool // the batch's new intents: true once their outcome is new too
	for _, r := range c.fresh {
		if r.Phase == audit.PhaseIntent {
			if fresh == nil {
				fresh = make(map[pendingKey]bool, len(c.fresh))
			}
			fresh[pendingKey{r.Tenant, r.InvocationID}] = false
		}
	}
	settled := false
	for _, r := range c.fresh {
		k := pendingKey{r.Tenant, r.InvocationID}
		if _, ok := fresh[k]; ok && r.Phase == audit.PhaseOutcome {
			fresh[k], settled = true, true
		}
	}
	if !settled {
		return nil
	}
	return fresh
}

func (c *chained) touched() []string {
	out := make([]string, 0, len(c.heads))
	for t := range c.heads {
		out = append(out, t)
	}
	return out
}

// AppendBatch implements audit.Store.
func (s *Store) AppendBatch(ctx context.Context, recs []audit.Record) ([]audit.Stored, error) {
	for i := range recs {
		if err := recs[i].Validate(); err != nil {
			return nil, err
		}
	}
	if len(recs) == 0 {
		return nil, nil
	}
	if s.isClosed() {
		return nil, audit.ErrClosed
	}
	p := newPlan(recs)
	if c := s.chainFast(p); c != nil {
		err := s.appendFast(ctx, c)
		s.doneFast(c, err == nil)
		if err == nil {
			s.wake(c)
			return c.out, nil
		}
		if kind := pg.Classify(err); kind != pg.KindUniqueViolation && !kind.Retryable() {
			return nil, mapErr("audit: append", err)
		}
	}
	var err error
	for attempt := 1; ; attempt++ {
		s.beginLocked(p.tenants)
		var c *chained
		var after map[string]audit.Head
		c, after, err = s.appendLocked(ctx, p)
		s.doneLocked(p.tenants, after)
		if err == nil {
			s.wake(c)
			return c.out, nil
		}
		kind := pg.Classify(err)
		if attempt >= s.opts.ConflictAttempts || (kind != pg.KindUniqueViolation && !kind.Retryable()) {
			break
		}
	}
	return nil, mapErr("audit: append", err)
}

// wake tells local watchers at once and other processes through NOTIFY.
func (s *Store) wake(c *chained) {
	touched := c.touched()
	for _, t := range touched {
		s.hub.Notify(t)
	}
	s.announce(touched)
}

// chainFast chains the batch onto the predicted heads when every tenant of it has one, and
// advances the predictions, so that the next batch can be chained (and sent) before this one
// has committed. It returns nil when the fast path does not apply.
func (s *Store) chainFast(p *batchPlan) *chained {
	s.headMu.Lock()
	defer s.headMu.Unlock()
	// A locking-path append in flight is about to establish the heads (it is rare: the first
	// append of a tenant, or one after a failure); wait for it rather than take the locking
	// path too, which would keep the next batch off the fast path as well.
	for {
		busy := false
		for _, t := range p.tenants {
			busy = busy || s.locking[t] > 0
		}
		if !busy {
			break
		}
		s.headCond.Wait()
	}
	heads := make(map[string]audit.Head, len(p.tenants))
	for _, t := range p.tenants {
		h, ok := s.heads[t]
		if !ok {
			return nil
		}
		heads[t] = h
	}
	for i := range p.recs {
		// The same key in two batches in flight: the later one would wait for the earlier one's
		// unique-index entry while the earlier one may wait for the later one's... let the
		// locking path, which reads what committed, handle it.
		if s.keys[p.recs[i].Key()] > 0 {
			return nil
		}
	}
	for i := range p.recs {
		s.keys[p.recs[i].Key()]++
	}
	c := p.chain(heads, nil)
	c.ended = make(chan struct{})
	seen := map[*chained]bool{}
	for _, t := range p.tenants {
		if prev := s.last[t]; prev != nil && !seen[prev] {
			seen[prev] = true
			c.after = append(c.after, prev)
		}
		s.last[t] = c
		s.fast[t]++
	}
	for t, h := range c.heads {
		s.heads[t] = h
	}
	return c
}

// doneFast ends a fast-path append. A failed one forgets the predicted heads of its tenants:
// batches chained onto them fail too (move_heads), and the next append reads the heads under
// lock.
func (s *Store) doneFast(c *chained, ok bool) {
	close(c.ended)
	s.headMu.Lock()
	defer s.headMu.Unlock()
	for _, t := range c.plan.tenants {
		if s.last[t] == c {
			delete(s.last, t)
		}
		if s.fast[t]--; s.fast[t] <= 0 {
			delete(s.fast, t)
		}
		if !ok {
			delete(s.heads, t)
		}
	}
	for i := range c.plan.recs {
		k := c.plan.recs[i].Key()
		if s.keys[k]--; s.keys[k] <= 0 {
			delete(s.keys, k)
		}
	}
	s.headCond.Broadcast()
}

// beginLocked registers a locking-path append and waits until no fast-path append of its
// tenants is in flight: those are chained onto predictions that the locking append may
// invalidate, and the next prediction comes from whichever finishes last.
func (s *Store) beginLocked(tenants []string) {
	s.headMu.Lock()
	defer s.headMu.Unlock()
	for _, t := range tenants {
		s.locking[t]++ // from now on no new fast batch starts for t
	}
	for {
		busy := false
		for _, t := range tenants {
			if s.fast[t] > 0 {
				busy = true
				break
			}
		}
		if !busy {
			return
		}
		s.headCond.Wait()
	}
}

// doneLocked ends a locking-path append; its committed heads (after) become the prediction.
// Locking-path appends of one tenant serialise on the head lock, so the last to commit carries
// the highest Seq.
func (s *Store) doneLocked(tenants []string, after map[string]audit.Head) {
	s.headMu.Lock()
	defer s.headMu.Unlock()
	for _, t := range tenants {
		if s.locking[t]--; s.locking[t] <= 0 {
			delete(s.locking, t)
		}
		h, ok := after[t]
		if cur, cached := s.heads[t]; ok && (!cached || h.Seq > cur.Seq) {
			s.heads[t] = h
		} else if after == nil {
			delete(s.heads, t)
		}
	}
	// Bound the cache: an evicted tenant only costs its next append the locking path.
	for t := range s.heads {
		if len(s.heads) <= maxCachedHeads {
			break
		}
		if s.fast[t] == 0 && s.locking[t] == 0 {
			delete(s.heads, t)
		}
	}
	s.headCond.Broadcast()
}

// maxCachedHeads bounds the head cache.
const maxCachedHeads = 100_000

// appendFast writes a batch chained by chainFast in one round trip: move_heads, the rows and
// the pending bookkeeping are pipelined behind a single Sync and, with no BEGIN, run as one
// implicit transaction that commits at the Sync or, when any statement fails, rolls back
// entirely (pgx ends a batch with one Sync in every query exec mode; the simple protocol joins
// the statements into one query, which is an implicit transaction too). move_heads comes first,
// so the head locks are taken before any row is written.
//
// A batch chained onto batches still in flight is sent once they have ended: sent earlier, its
// move_heads could take the head locks first and find the heads not yet advanced.
func (s *Store) appendFast(ctx context.Context, c *chained) error {
	for _, prev := range c.after {
		select {
		case <-prev.ended:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 4)} // move_heads, insert, pending: one allocation, not three
	c.queueMoveHeads(b, s.typed)
	queueInsert(b, c.fresh, s.typed)
	c.queuePending(b, s.typed)
	return s.pool.SendBatch(ctx, b).Close()
}

// appendLocked runs the batch in a transaction that locks the heads and looks up existing
// keys. It returns the chained batch and the heads after it, for every tenant of the batch.
func (s *Store) appendLocked(ctx context.Context, p *batchPlan) (*chained, map[string]audit.Head, error) {
	var lt, li, lp []string
	seen := map[audit.Key]bool{}
	for i := range p.recs {
		if k := p.recs[i].Key(); !seen[k] {
			seen[k] = true
			lt, li, lp = append(lt, k.Tenant), append(li, k.InvocationID), append(lp, string(k.Phase))
		}
	}
	var (
		c     *chained
		after map[string]audit.Head
	)
	err := pg.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(sqlCustomPlans)
		b.Queue(sqlEnsureHeads, p.tenants, audit.GenesisHash())
		b.Queue(sqlLockHeads, p.tenants)
		b.Queue(sqlExistingRows, lt, li, lp)
		br := tx.SendBatch(ctx, b)
		defer func() { _ = br.Close() }() // already closed on success; this covers early returns
		for range 2 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		heads := map[string]audit.Head{}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		var (
			t string
			h audit.Head
		)
		if _, err := pgx.ForEachRow(rows, []any{&t, &h.Seq, &h.Hash}, func() error {
			heads[t] = audit.Head{Seq: h.Seq, Hash: h.Hash}
			return nil
		}); err != nil {
			return err
		}
		rows, err = br.Query()
		if err != nil {
			return err
		}
		existing, err := pgx.CollectRows(rows, scanRow)
		if err != nil {
			return err
		}
		if err := br.Close(); err != nil {
			return err
		}
		if len(heads) != len(p.tenants) {
			return errors.New("audit: a chain head is missing after creating it") // cannot happen
		}
		stored := make(map[audit.Key]*audit.Stored, len(existing))
		for i := range existing {
			stored[existing[i].Key()] = &existing[i]
		}
		c = p.chain(heads, stored)
		b = &pgx.Batch{}
		queueInsert(b, c.fresh, s.typed)
		c.queuePending(b, s.typed)
		c.queueMoveHeads(b, s.typed)
		if b.Len() > 0 {
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
		}
		after = heads
		for t, h := range c.heads {
			after[t] = h
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return c, after, nil
}
