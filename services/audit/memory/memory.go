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

// Store is an in-memory audit.Store, safe for concurrent use.
type Store struct {
	mu      sync.RWMutex
	tenants map[string]*tenantLog
	closed  bool

	hub  feed.Hub
	done chan struct{} // closed by Close: ends every Watch
	wg   sync.WaitGroup
}

type tenantLog struct {
	rows    []audit.Stored // rows[i].Seq == i+1
	byKey   map[audit.Key]int64
	pending map[string]int64 // invocation id → Seq of an intent without outcome
	head    audit.Head
}

var _ audit.Store = (*Store)(nil)

// New returns an empty Store.
func New() *Store {
	return &Store{tenants: map[string]*tenantLog{}, done: make(chan struct{})}
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
		log  *tenantLog
		rows []audit.Stored
		head audit.Head
	}
	stage := map[string]*staged{}
	inBatch := map[audit.Key]int{} // key → index in out of its first occurrence
	for i := range recs {
		r := &recs[i]
		k := r.Key()
		if j, ok := inBatch[k]; ok {
			out[i] = out[j]
			continue
		}
		st := stage[r.Tenant]
		if st == nil {
			l := s.tenants[r.Tenant]
			if l == nil {
				l = &tenantLog{byKey: map[audit.Key]int64{}, pending: map[string]int64{}, head: audit.Head{Hash: audit.GenesisHash()}}
			}
			st = &staged{log: l, head: l.head}
			stage[r.Tenant] = st
		}
		inBatch[k] = i
		if seq, ok := st.log.byKey[k]; ok {
			out[i] = st.log.rows[seq-1]
			continue
		}
		row := audit.Stored{Record: r.Clone(), Seq: st.head.Seq + 1, PrevHash: st.head.Hash}
		row.Hash = audit.ComputeHash(row.PrevHash, row.Seq, &row.Record)
		st.rows = append(st.rows, row)
		st.head = audit.Head{Seq: row.Seq, Hash: row.Hash}
		out[i] = row
	}
	// Publish: nothing above can fail, so the batch is all-or-nothing.
	var touched []string
	for tenant, st := range stage {
		l := st.log
		s.tenants[tenant] = l
		for _, row := range st.rows {
			l.rows = append(l.rows, row)
			l.byKey[row.Key()] = row.Seq
			if row.Phase == audit.PhaseIntent {
				if _, done := l.byKey[audit.Key{Tenant: tenant, InvocationID: row.InvocationID, Phase: audit.PhaseOutcome}]; !done {
					l.pending[row.InvocationID] = row.Seq
				}
			}
		}
		l.head = st.head
		touched = append(touched, tenant)
	}
	// Outcomes clear pending intents even when they were already stored.
	for i := range recs {
		if recs[i].Phase == audit.PhaseOutcome {
			delete(s.tenants[recs[i].Tenant].pending, recs[i].InvocationID)
		}
	}
	s.mu.Unlock()
	for _, t := range touched {
		s.hub.Notify(t)
	}
	for i := range out {
		out[i] = out[i].Clone()
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
	end := int64(len(l.rows))
	if p.BeforeSeq > 0 {
		end = min(end, p.BeforeSeq-1)
	}
	for seq := end; seq >= 1; seq-- {
		row := &l.rows[seq-1]
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
		for _, ph := range []audit.Phase{audit.PhaseIntent, audit.PhaseOutcome, audit.PhaseResolution} {
			if seq, ok := l.byKey[audit.Key{Tenant: tenant, InvocationID: invocationID, Phase: ph}]; ok {
				out = append(out, l.rows[seq-1].Clone())
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
	v := audit.NewChainVerifier(tenant)
	l := s.tenants[tenant]
	if l == nil {
		return v.Finish(audit.Head{}, false), nil
	}
	for i := range l.rows {
		if !v.Add(&l.rows[i]) {
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
		if l == nil || after >= int64(len(l.rows)) {
			return nil, nil
		}
		rows := l.rows[after:min(int64(len(l.rows)), after+int64(limit))]
		res := make([]audit.Stored, len(rows))
		for i := range rows {
			res[i] = rows[i].Clone()
		}
		return res, nil
	}
	go func() {
		defer s.wg.Done()
		feed.Tail(ctx, s.done, out, afterSeq, fetch, func() <-chan struct{} { return s.hub.Wait(tenant) }, feed.TailOptions{})
	}()
	return out, nil
}

// PendingIntents implements audit.Store.
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
	for tenant, l := range s.tenants {
		for i := range l.rows {
			row := &l.rows[i]
			if row.Phase != audit.PhaseOutcome || row.Outcome != audit.OutcomeUnknown || !row.Time.Before(before) {
				continue
			}
			if _, resolved := l.byKey[audit.Key{Tenant: tenant, InvocationID: row.InvocationID, Phase: audit.PhaseResolution}]; !resolved {
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
			if row := &l.rows[seq-1]; row.Time.Before(before) {
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
