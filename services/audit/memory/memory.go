package memory

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/internal/feed"
)

// DefaultMaxRows is the bound mandate dev gives each tenant's trail.
const DefaultMaxRows = 50_000

// Options tunes a Store.
type Options struct {
	// MaxRows bounds how many rows the store keeps per tenant: past it, each new row evicts
	// the tenant's oldest. Zero or less keeps every row. An evicted row is gone for Query,
	// Get, Verify and Watch, except an intent still waiting for its outcome and an unknown
	// outcome still waiting for its resolution: those are held aside until answered, so
	// PendingIntents and UnresolvedUnknowns keep listing them, Get still returns them and an
	// append of the same key still dedupes against them. The package doc says what else holds.
	MaxRows int
}

// Store is an in-memory audit.Store, safe for concurrent use.
type Store struct {
	opts Options

	mu      sync.RWMutex
	tenants map[string]*tenantLog
	closed  bool

	hub  feed.Hub
	done chan struct{} // closed by Close: ends every Watch
	wg   sync.WaitGroup
}

// tenantLog is one tenant's trail. rows holds the retained rows, first..head.Seq, as a ring
// that starts at rows[oldest]: it grows by append until the bound, then each new row takes
// the place of the oldest, so a bounded trail allocates nothing more once full. byKey indexes
// the retained rows and the evicted rows kept in held.
type tenantLog struct {
	tenant   string
	rows     []audit.Stored
	oldest   int   // index in rows of the row at first
	first    int64 // Seq of the oldest retained row (of the next row while there is none)
	byKey    map[audit.Key]int64
	pending  map[string]int64 // invocation id → Seq of an intent without outcome
	unknowns map[string]int64 // invocation id → Seq of an unknown outcome without resolution
	held     map[int64]audit.Stored
	head     audit.Head
}

func newTenantLog(tenant string) *tenantLog {
	return &tenantLog{
		tenant:   tenant,
		first:    1,
		byKey:    map[audit.Key]int64{},
		pending:  map[string]int64{},
		unknowns: map[string]int64{},
		held:     map[int64]audit.Stored{},
		head:     audit.Head{Hash: audit.GenesisHash()},
	}
}

// at returns the retained row at seq (first <= seq <= head.Seq).
func (l *tenantLog) at(seq int64) *audit.Stored {
	return &l.rows[(l.oldest+int(seq-l.first))%len(l.rows)]
}

// row returns the row at seq: retained, or evicted but held.
func (l *tenantLog) row(seq int64) *audit.Stored {
	if seq >= l.first {
		return l.at(seq)
	}
	r := l.held[seq]
	return &r
}

// add appends a new row (row.Seq == l.head.Seq+1) and indexes it. With maxRows > 0 and that
// many rows retained, the oldest is evicted to make room.
func (l *tenantLog) add(row audit.Stored, maxRows int) {
	if maxRows > 0 && len(l.rows) >= maxRows {
		l.evictOldest()
		l.rows[l.oldest] = row
		l.oldest = (l.oldest + 1) % len(l.rows)
	} else {
		l.rows = append(l.rows, row)
	}
	l.byKey[row.Key()] = row.Seq
	switch row.Phase {
	case audit.PhaseIntent:
		if _, done := l.byKey[l.key(row.InvocationID, audit.PhaseOutcome)]; !done {
			l.pending[row.InvocationID] = row.Seq
		}
	case audit.PhaseOutcome:
		l.settle(l.pending, row.InvocationID)
		if _, resolved := l.byKey[l.key(row.InvocationID, audit.PhaseResolution)]; !resolved && row.Outcome == audit.OutcomeUnknown {
			l.unknowns[row.InvocationID] = row.Seq
		}
	case audit.PhaseResolution:
		l.settle(l.unknowns, row.InvocationID)
	}
	l.head = audit.Head{Seq: row.Seq, Hash: row.Hash}
}

// evictOldest drops the oldest retained row. A row still on an open list (pending or
// unknowns) is moved to held instead of being dropped.
func (l *tenantLog) evictOldest() {
	r := &l.rows[l.oldest]
	if l.pending[r.InvocationID] == r.Seq || l.unknowns[r.InvocationID] == r.Seq {
		l.held[r.Seq] = *r
	} else {
		delete(l.byKey, r.Key())
	}
	l.first++
}

func (l *tenantLog) key(invocationID string, ph audit.Phase) audit.Key {
	return audit.Key{Tenant: l.tenant, InvocationID: invocationID, Phase: ph}
}

// settle drops invocationID from one of the open lists (pending or unknowns); an evicted row
// held only for that list goes for good.
func (l *tenantLog) settle(open map[string]int64, invocationID string) {
	seq, ok := open[invocationID]
	if !ok {
		return
	}
	delete(open, invocationID)
	if r, held := l.held[seq]; held {
		delete(l.held, seq)
		delete(l.byKey, r.Key())
	}
}

var _ audit.Store = (*Store)(nil)

// New returns an empty Store.
func New(opts Options) *Store {
	return &Store{opts: opts, tenants: map[string]*tenantLog{}, done: make(chan struct{})}
}

// Close ends every Watch and makes later calls fail with audit.ErrClosed. It waits for the
// watch goroutines to exit.
func (s *Store) Close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.done)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// AppendBatch implements audit.Store.
func (s *Store) AppendBatch(ctx context.Context, recs []audit.Record) ([]audit.Stored, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for i := range recs {
		if err := recs[i].Validate(); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, audit.ErrClosed
	}
	out := make([]audit.Stored, len(recs))
	type staged struct {
		tenant string
		log    *tenantLog
		rows   []audit.Stored // the deep copies the log will hold
		head   audit.Head
	}
	var one [1]staged
	stages := one[:0]            // most batches hold one tenant: its stage costs no allocation
	byTenant := map[string]int{} // tenant → index in stages
	stage := func(tenant string) *staged {
		if i, ok := byTenant[tenant]; ok {
			return &stages[i]
		}
		l := s.tenants[tenant]
		if l == nil {
			l = newTenantLog(tenant)
		}
		byTenant[tenant] = len(stages)
		stages = append(stages, staged{tenant: tenant, log: l, head: l.head})
		return &stages[len(stages)-1]
	}
	inBatch := map[audit.Key]int{} // key → index in out of its first occurrence
	for i := range recs {
		r := &recs[i]
		k := r.Key()
		if j, ok := inBatch[k]; ok {
			out[i] = out[j]
			continue
		}
		st := stage(r.Tenant)
		inBatch[k] = i
		if seq, ok := st.log.byKey[k]; ok {
			out[i] = st.log.row(seq).Clone()
			continue
		}
		row := audit.Stored{Record: r.Clone(), Seq: st.head.Seq + 1, PrevHash: st.head.Hash}
		row.Hash = audit.ComputeHash(row.PrevHash, row.Seq, &row.Record)
		st.rows = append(st.rows, row)
		st.head = audit.Head{Seq: row.Seq, Hash: row.Hash}
		// The caller gets its own record back with the row's place in the chain: it shares
		// nothing with the copy the log holds, without copying the record a second time. Both
		// hashes share one allocation; each is capped so that an append cannot reach the other.
		hashes := append(append(make([]byte, 0, 2*audit.HashSize), row.PrevHash...), row.Hash...)
		out[i] = audit.Stored{Record: *r, Seq: row.Seq, PrevHash: hashes[:audit.HashSize:audit.HashSize], Hash: hashes[audit.HashSize:]}
	}
	// Publish: nothing above can fail, so the batch is all-or-nothing.
	for i := range stages {
		st := &stages[i]
		s.tenants[st.tenant] = st.log
		for _, row := range st.rows {
			st.log.add(row, s.opts.MaxRows)
		}
	}
	s.mu.Unlock()
	for i := range stages {
		s.hub.Notify(stages[i].tenant)
	}
	return out, nil
}

// Query implements audit.Store.
func (s *Store) Query(ctx context.Context, f audit.Filter) (audit.Page, error) {
	p, err := f.Prepare()
	if err != nil {
		return audit.Page{}, err
	}
	if err := ctx.Err(); err != nil {
		return audit.Page{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return audit.Page{}, audit.ErrClosed
	}
	var page audit.Page
	l := s.tenants[p.Tenant]
	if l == nil {
		return page, nil
	}
	end := l.head.Seq
	if p.BeforeSeq > 0 {
		end = min(end, p.BeforeSeq-1)
	}
	for seq := end; seq >= l.first; seq-- {
		row := l.at(seq)
		if !p.Match(row) {
			continue
		}
		if len(page.Records) == p.PageSize {
			page.NextPageToken = p.NextPageToken(page.Records[len(page.Records)-1].Seq)
			break
		}
		page.Records = append(page.Records, row.Clone())
	}
	return page, nil
}

// Get implements audit.Store.
func (s *Store) Get(ctx context.Context, tenant, invocationID string) ([]audit.Stored, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, audit.ErrClosed
	}
	var out []audit.Stored
	if l := s.tenants[tenant]; l != nil {
		for _, ph := range []audit.Phase{audit.PhaseIntent, audit.PhaseOutcome, audit.PhaseResolution, audit.PhaseCheck, audit.PhaseDecision} {
			if seq, ok := l.byKey[audit.Key{Tenant: tenant, InvocationID: invocationID, Phase: ph}]; ok {
				out = append(out, l.row(seq).Clone())
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: invocation %q", audit.ErrNotFound, invocationID)
	}
	slices.SortFunc(out, func(a, b audit.Stored) int { return int(a.Seq - b.Seq) })
	return out, nil
}

// Verify implements audit.Store.
func (s *Store) Verify(ctx context.Context, tenant string) (audit.Report, error) {
	if err := ctx.Err(); err != nil {
		return audit.Report{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return audit.Report{}, audit.ErrClosed
	}
	l := s.tenants[tenant]
	if l == nil {
		return audit.NewChainVerifier(tenant).Finish(audit.Head{}, false), nil
	}
	v := audit.NewChainVerifier(tenant)
	if l.first > 1 {
		// Rows were evicted (a new row only ever replaces one): the walk starts at the oldest kept
		// row, from the PrevHash it was chained with.
		v = audit.NewChainVerifierAt(tenant, l.first, l.at(l.first).PrevHash)
	}
	for seq := l.first; seq <= l.head.Seq; seq++ {
		if !v.Add(l.at(seq)) {
			break
		}
	}
	return v.Finish(audit.Head{Seq: l.head.Seq, Hash: slices.Clone(l.head.Hash)}, true), nil
}

// Watch implements audit.Store.
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
	s.wg.Add(1)
	s.mu.Unlock()
	out := make(chan audit.Stored)
	fetch := func(ctx context.Context, after int64, limit int) ([]audit.Stored, error) {
		s.mu.RLock()
		defer s.mu.RUnlock()
		l := s.tenants[tenant]
		if l == nil || after >= l.head.Seq {
			return nil, nil
		}
		from := max(after+1, l.first) // evicted rows are skipped
		to := min(l.head.Seq, from+int64(limit)-1)
		res := make([]audit.Stored, 0, to-from+1)
		for seq := from; seq <= to; seq++ {
			res = append(res, l.at(seq).Clone())
		}
		return res, nil
	}
	go func() {
		defer s.wg.Done()
		feed.Tail(ctx, s.done, out, afterSeq, fetch, func() <-chan struct{} { return s.hub.Wait(tenant) }, feed.TailOptions{})
	}()
	return out, nil
}

// UnresolvedUnknowns implements audit.Store.
func (s *Store) UnresolvedUnknowns(ctx context.Context, before time.Time, limit int) ([]audit.Stored, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, audit.ErrClosed
	}
	var out []audit.Stored
	for _, l := range s.tenants {
		for _, seq := range l.unknowns {
			if row := l.row(seq); row.Time.Before(before) {
				out = append(out, row.Clone())
			}
		}
	}
	return oldestFirst(out, limit), nil
}

// PendingIntents implements audit.Store.
func (s *Store) PendingIntents(ctx context.Context, before time.Time, limit int) ([]audit.Stored, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, audit.ErrClosed
	}
	var out []audit.Stored
	for _, l := range s.tenants {
		for _, seq := range l.pending {
			if row := l.row(seq); row.Time.Before(before) {
				out = append(out, row.Clone())
			}
		}
	}
	return oldestFirst(out, limit), nil
}

// oldestFirst orders rows by time, tenant and seq, and keeps at most limit
// (all when limit <= 0).
func oldestFirst(out []audit.Stored, limit int) []audit.Stored {
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Time.Equal(out[j].Time) {
			return out[i].Time.Before(out[j].Time)
		}
		if out[i].Tenant != out[j].Tenant {
			return out[i].Tenant < out[j].Tenant
		}
		return out[i].Seq < out[j].Seq
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}
