package postgres

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/services/audit"
)

// An append takes one of two paths.
//
// The fast path is for the common case: every tenant of the batch has a cached chain head and
// no other append of this Store is under way for it. The new rows are chained onto the cached
// heads in Go and sent as ONE pipelined implicit transaction: move_heads (which locks the head
// rows and fails with 40001 unless each head is still where the cache says), the multi-row
// INSERT, the pending bookkeeping and NOTIFY, committed together at the pipeline's Sync. That is
// one round trip per batch. A stale cache (another replica appended) or a key that is already
// stored (a retried append) makes the statement fail — move_heads or a unique index — and
// nothing is written.
//
// The locking path is the general one, taken when the fast path is not applicable or failed:
// in a pg.InTx transaction it creates missing heads, locks the heads FOR UPDATE in tenant order,
// reads the rows the batch's keys already have, chains the rest onto the locked heads and writes
// them with the same statements. Its result refreshes the cache.

const (
	// sqlCustomPlans makes the transaction's statements be planned with their actual
	// arguments and the tables' current size. The statements are prepared once per connection;
	// a generic plan cached while the trail was small (a hash join over a sequential scan of
	// records) would otherwise stay in use as it grows, turning every append into a full scan.
	sqlCustomPlans = `SELECT set_config('plan_cache_mode', 'force_custom_plan', true)`
	sqlEnsureHeads = `INSERT INTO audit.heads (tenant, seq, hash)
		SELECT t, 0, $2 FROM unnest($1::text[]) AS t ORDER BY t
		ON CONFLICT (tenant) DO NOTHING`
	sqlLockHeads = `SELECT tenant, seq, hash FROM audit.heads
		WHERE tenant = ANY($1::text[]) ORDER BY tenant FOR UPDATE`
	sqlMoveHeads  = `SELECT audit.move_heads($1::text[], $2::bigint[], $3::bigint[], $4::bytea[])`
	sqlAddPending = `INSERT INTO audit.pending (tenant, invocation_id, seq, time)
		SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[])
		ON CONFLICT DO NOTHING`
	sqlClearPending = `DELETE FROM audit.pending p
		USING unnest($1::text[], $2::text[]) AS d(tenant, invocation_id)
		WHERE p.tenant = d.tenant AND p.invocation_id = d.invocation_id`
	sqlNotify = `SELECT pg_notify('` + Channel + `', t) FROM unnest($1::text[]) AS t`
)

// sqlExistingRows reads the stored rows of a batch's keys, one index probe per key.
var sqlExistingRows = `SELECT ` + rColumnList + `
	FROM unnest($1::text[], $2::text[], $3::text[]) AS k(tenant, invocation_id, phase)
	CROSS JOIN LATERAL (
		SELECT * FROM audit.records
		WHERE tenant = k.tenant AND invocation_id = k.invocation_id AND phase = k.phase
	) r`

// sqlInsertRows inserts a batch of rows from one array per column. Side effects travel as
// array literals and arguments as text, cast back here; only constant column names and types
// are spliced into the text.
var sqlInsertRows = func() string {
	types := map[string]string{
		"seq": "bigint", "time": "timestamptz", "approval_decided_at": "timestamptz",
		"idempotent": "boolean", "reversible": "boolean", "duration_ns": "bigint",
		"prev_hash": "bytea", "hash": "bytea",
	}
	casts := map[string]string{"side_effects": "::text[]", "arguments": "::json"}
	var sel, params []string
	for i, c := range columns {
		t := types[c]
		if t == "" {
			t = "text"
		}
		params = append(params, "$"+strconv.Itoa(i+1)+"::"+t+"[]")
		sel = append(sel, c+casts[c])
	}
	return `INSERT INTO audit.records (` + columnList + `) SELECT ` + strings.Join(sel, ", ") +
		` FROM unnest(` + strings.Join(params, ", ") + `) AS u(` + columnList + `)`
}()

// rowArrays holds a batch's rows column by column, in the order of columns.
type rowArrays struct {
	tenant, inv, phase, channel, command, risk, sideEffects, subject, userID, actor, agent, model, modelVersion,
	conversation, session []string
	seq, duration                             []int64
	time                                      []time.Time
	idempotent, reversible                    []bool
	challenge, approver, approvalChan         []pgtype.Text
	decided                                   []pgtype.Timestamptz
	outcome, stage, code, message             []string
	arguments                                 []pgtype.Text
	argsDigest, resultDigest, trace, manifest []string
	prevHash, hash                            [][]byte
}

func (a *rowArrays) add(r *audit.Stored) {
	var challenge, approver, approvalChan pgtype.Text
	var decided pgtype.Timestamptz
	if ap := r.Approval; ap != nil {
		challenge = pgtype.Text{String: ap.ChallengeID, Valid: true}
		approver = pgtype.Text{String: ap.Approver, Valid: true}
		approvalChan = pgtype.Text{String: ap.Channel, Valid: true}
		decided = pgtype.Timestamptz{Time: ap.DecidedAt, Valid: !ap.DecidedAt.IsZero()}
	}
	a.tenant = append(a.tenant, r.Tenant)
	a.seq = append(a.seq, r.Seq)
	a.inv = append(a.inv, r.InvocationID)
	a.phase = append(a.phase, string(r.Phase))
	a.time = append(a.time, r.Time)
	a.channel = append(a.channel, string(r.Channel))
	a.command = append(a.command, r.Command)
	a.risk = append(a.risk, string(r.Risk))
	a.sideEffects = append(a.sideEffects, arrayLiteral(r.SideEffects))
	a.idempotent = append(a.idempotent, r.Idempotent)
	a.reversible = append(a.reversible, r.Reversible)
	a.subject = append(a.subject, r.Subject)
	a.userID = append(a.userID, r.UserID)
	a.actor = append(a.actor, string(r.ActorKind))
	a.agent = append(a.agent, r.AgentID)
	a.model = append(a.model, r.Model)
	a.modelVersion = append(a.modelVersion, r.ModelVersion)
	a.conversation = append(a.conversation, r.ConversationID)
	a.session = append(a.session, r.MCPSessionID)
	a.challenge = append(a.challenge, challenge)
	a.approver = append(a.approver, approver)
	a.approvalChan = append(a.approvalChan, approvalChan)
	a.decided = append(a.decided, decided)
	a.outcome = append(a.outcome, string(r.Outcome))
	a.stage = append(a.stage, r.Stage)
	a.code = append(a.code, r.Code)
	a.message = append(a.message, r.Message)
	a.arguments = append(a.arguments, pgtype.Text{String: string(r.Arguments), Valid: len(r.Arguments) > 0})
	a.argsDigest = append(a.argsDigest, r.ArgumentsDigest)
	a.resultDigest = append(a.resultDigest, r.ResultDigest)
	a.duration = append(a.duration, int64(r.Duration))
	a.trace = append(a.trace, r.TraceID)
	a.manifest = append(a.manifest, r.ManifestDigest)
	a.prevHash = append(a.prevHash, r.PrevHash)
	a.hash = append(a.hash, r.Hash)
}

// args returns the arrays in the order of columns.
func (a *rowArrays) args() []any {
	return []any{
		a.tenant, a.seq, a.inv, a.phase, a.time, a.channel, a.command, a.risk, a.sideEffects,
		a.idempotent, a.reversible, a.subject, a.userID, a.actor, a.agent, a.model, a.modelVersion,
		a.conversation, a.session, a.challenge, a.approver, a.approvalChan,
		a.decided, a.outcome, a.stage, a.code, a.message, a.arguments, a.argsDigest,
		a.resultDigest, a.duration, a.trace, a.manifest, a.prevHash, a.hash,
	}
}

// arrayLiteral renders a text[] literal with every element quoted, so no value can be read as
// NULL or split; validated records hold no NUL bytes.
func arrayLiteral(vals []string) string {
	if len(vals) == 0 {
		return "{}"
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range vals {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, c := range []byte(v) {
			if c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(c)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// batchPlan is what both paths need to know about a batch.
type batchPlan struct {
	recs    []audit.Record
	tenants []string // sorted, distinct
}

func newPlan(recs []audit.Record) *batchPlan {
	p := &batchPlan{recs: recs}
	for i := range recs {
		p.tenants = append(p.tenants, recs[i].Tenant)
	}
	slices.Sort(p.tenants)
	p.tenants = slices.Compact(p.tenants)
	return p
}

// chained is the outcome of chaining a batch onto heads.
type chained struct {
	plan   *batchPlan
	after  []chan struct{} // fast path: locked channels of the batches this one was chained onto
	locked chan struct{}   // fast path: closed once this batch holds its head locks, or failed
	once   sync.Once
	out    []audit.Stored        // aligned with the batch
	fresh  []*audit.Stored       // rows to insert, in order
	old    map[string]audit.Head // heads the rows were chained onto (tenants with fresh rows)
	heads  map[string]audit.Head // heads after the batch (tenants with fresh rows)
}

// chain assigns Seq, PrevHash and Hash to the records whose key is not in stored, in batch
// order, and fills out. A key seen earlier in the batch gets that earlier row.
func (p *batchPlan) chain(heads map[string]audit.Head, stored map[audit.Key]*audit.Stored) *chained {
	c := &chained{plan: p, out: make([]audit.Stored, len(p.recs)), old: map[string]audit.Head{}, heads: map[string]audit.Head{}}
	if stored == nil {
		stored = map[audit.Key]*audit.Stored{}
	}
	for i := range p.recs {
		k := p.recs[i].Key()
		if row, ok := stored[k]; ok {
			c.out[i] = row.Clone()
			continue
		}
		h, ok := c.heads[k.Tenant]
		if !ok {
			h = heads[k.Tenant]
			c.old[k.Tenant] = h
		}
		row := &audit.Stored{Record: p.recs[i].Clone(), Seq: h.Seq + 1, PrevHash: h.Hash}
		row.Hash = audit.ComputeHash(row.PrevHash, row.Seq, &row.Record)
		c.heads[k.Tenant] = audit.Head{Seq: row.Seq, Hash: row.Hash}
		stored[k] = row
		c.fresh = append(c.fresh, row)
		c.out[i] = row.Clone()
	}
	return c
}

// queueWrites queues the statements that write c: rows, pending, notify and, last, the heads.
// Moving the heads last lets a pipelined batch insert its rows while the batch before it (whose
// new heads it was chained onto) is still committing; move_heads then waits for that commit
// and fails unless it happened.
func (p *batchPlan) queueWrites(b *pgx.Batch, c *chained) {
	var t []string
	if len(c.fresh) > 0 {
		var rows rowArrays
		var pT, pInv []string
		var pSeq []int64
		var pTime []time.Time
		for _, r := range c.fresh {
			rows.add(r)
			if r.Phase == audit.PhaseIntent {
				pT, pInv, pSeq, pTime = append(pT, r.Tenant), append(pInv, r.InvocationID), append(pSeq, r.Seq), append(pTime, r.Time)
			}
		}
		b.Queue(sqlInsertRows, rows.args()...)
		if len(pT) > 0 {
			b.Queue(sqlAddPending, pT, pInv, pSeq, pTime)
		}
		for _, tenant := range p.tenants {
			if _, ok := c.heads[tenant]; ok {
				t = append(t, tenant)
			}
		}
		b.Queue(sqlNotify, t)
	}
	// Outcomes clear their intent's pending entry, also when the outcome was already stored
	// (that is how a reconciliation that lost to the real outcome cleans up).
	var cT, cInv []string
	for i := range p.recs {
		if p.recs[i].Phase == audit.PhaseOutcome {
			cT, cInv = append(cT, p.recs[i].Tenant), append(cInv, p.recs[i].InvocationID)
		}
	}
	if len(cT) > 0 {
		b.Queue(sqlClearPending, cT, cInv)
	}
	if len(t) > 0 {
		oldSeq := make([]int64, len(t))
		newSeq := make([]int64, len(t))
		newHash := make([][]byte, len(t))
		for i, tenant := range t {
			oldSeq[i], newSeq[i], newHash[i] = c.old[tenant].Seq, c.heads[tenant].Seq, c.heads[tenant].Hash
		}
		b.Queue(sqlMoveHeads, t, oldSeq, newSeq, newHash)
	}
}

func (c *chained) unlock() {
	if c.locked != nil {
		c.once.Do(func() { close(c.locked) })
	}
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

func (s *Store) wake(c *chained) {
	for _, t := range c.touched() {
		s.hub.Notify(t)
	}
}

// chainFast chains the batch onto the predicted heads when every tenant of it has one and no
// locking-path append is under way for it, and advances the predictions, so that the next
// batch can be chained (and sent) before this one has committed. It returns nil when the fast
// path does not apply.
func (s *Store) chainFast(p *batchPlan) *chained {
	s.headMu.Lock()
	defer s.headMu.Unlock()
	heads := make(map[string]audit.Head, len(p.tenants))
	for _, t := range p.tenants {
		h, ok := s.heads[t]
		if !ok || s.locking[t] > 0 {
			return nil
		}
		heads[t] = h
	}
	c := p.chain(heads, nil)
	c.locked = make(chan struct{})
	seen := map[chan struct{}]bool{}
	for _, t := range p.tenants {
		if g := s.gates[t]; g != nil && !seen[g] {
			seen[g] = true
			c.after = append(c.after, g)
		}
		s.gates[t] = c.locked
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
	c.unlock()
	s.headMu.Lock()
	defer s.headMu.Unlock()
	for _, t := range c.plan.tenants {
		if s.gates[t] == c.locked {
			delete(s.gates, t)
		}
		if s.fast[t]--; s.fast[t] <= 0 {
			delete(s.fast, t)
		}
		if !ok {
			delete(s.heads, t)
		}
	}
	s.headCond.Broadcast()
}

// beginLocked registers a locking-path append and waits until no fast-path append of its
// tenants is in flight. The two must not overlap in one process: a fast batch inserts its rows
// before it locks the heads, so a locking append that chained onto the same head would wait for
// those rows while the fast batch waits for its head lock — a deadlock.
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

// appendFast writes a batch chained by chainFast as one pipelined implicit transaction. It is
// sent only once the fast batches it was chained onto hold their head locks (their move_heads
// has run), so that its own move_heads, which comes last, waits for their commit instead of
// overtaking them; its rows are inserted meanwhile, overlapping their commit.
func (s *Store) appendFast(ctx context.Context, c *chained) error {
	for _, g := range c.after {
		select {
		case <-g:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b := &pgx.Batch{}
	b.Queue(sqlCustomPlans)
	c.plan.queueWrites(b, c)
	// Without BEGIN, every statement up to the pipeline's Sync runs in one implicit
	// transaction: all commit together or none does.
	br := s.pool.SendBatch(ctx, b)
	for range b.Len() {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return err
		}
	}
	c.unlock() // move_heads, the last statement, has run: the heads are locked until commit
	return br.Close()
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
		defer func() { _ = br.Close() }()
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
		p.queueWrites(b, c)
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
