package memory_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/audittest"
	"github.com/mandate-dev/mandate/services/audit/memory"
)

func newBounded(t *testing.T, maxRows int) *memory.Store {
	t.Helper()
	s := memory.New(memory.Options{MaxRows: maxRows})
	t.Cleanup(s.Close)
	return s
}

func rec(tenant, inv string, phase audit.Phase) audit.Record {
	return audittest.Rec(tenant, inv, phase).Normalize(audittest.Base)
}

func unknown(tenant, inv string) audit.Record {
	r := rec(tenant, inv, audit.PhaseOutcome)
	r.Outcome, r.Stage, r.Code, r.Approval = audit.OutcomeUnknown, audit.StageAudit, failure.CodeAuditOutcomeUnknown, nil
	return r
}

func resolution(tenant, inv string) audit.Record {
	r := rec(tenant, inv, audit.PhaseResolution)
	r.Outcome, r.Stage, r.Code, r.Message = audit.OutcomeFailed, audit.StageAudit, failure.CodeAuditResolvedNotExecuted, "the receipt says it never ran"
	r.Approval = nil
	return r
}

func appendAll(t *testing.T, s *memory.Store, recs ...audit.Record) []audit.Stored {
	t.Helper()
	out, err := s.AppendBatch(context.Background(), recs)
	if err != nil {
		t.Fatalf("AppendBatch: %v", err)
	}
	return out
}

// done appends n finished invocations (intent and outcome), one batch each.
func done(t *testing.T, s *memory.Store, tenant, prefix string, n int) {
	t.Helper()
	for i := range n {
		inv := prefix + string(rune('a'+i))
		appendAll(t, s, rec(tenant, inv, audit.PhaseIntent), rec(tenant, inv, audit.PhaseOutcome))
	}
}

func querySeqs(t *testing.T, s *memory.Store, tenant string) []int64 {
	t.Helper()
	page, err := s.Query(context.Background(), audit.Filter{Tenant: tenant, PageSize: 100})
	if err != nil {
		t.Fatalf("Query: %v", err)
	}
	var out []int64
	for _, r := range page.Records {
		out = append(out, r.Seq)
	}
	return out
}

func verify(t *testing.T, s *memory.Store, tenant string, rows, head int64) {
	t.Helper()
	rep, err := s.Verify(context.Background(), tenant)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if !rep.OK || rep.Rows != rows || rep.Head.Seq != head {
		t.Fatalf("Verify = ok=%v rows=%d head=%d break=%+v; want ok, %d rows, head %d", rep.OK, rep.Rows, rep.Head.Seq, rep.Break, rows, head)
	}
}

func TestBoundEvictsOldestPerTenant(t *testing.T) {
	s := newBounded(t, 4)
	done(t, s, "acme", "a-", 4)   // acme: rows 1..8
	done(t, s, "globex", "g-", 1) // globex: rows 1..2, under the bound
	if got, want := querySeqs(t, s, "acme"), []int64{8, 7, 6, 5}; !slices.Equal(got, want) {
		t.Fatalf("acme rows = %v, want %v", got, want)
	}
	if got, want := querySeqs(t, s, "globex"), []int64{2, 1}; !slices.Equal(got, want) {
		t.Fatalf("globex rows = %v, want %v", got, want)
	}
	verify(t, s, "acme", 4, 8)
	verify(t, s, "globex", 2, 2)
	if _, err := s.Get(context.Background(), "acme", "a-a"); !errors.Is(err, audit.ErrNotFound) {
		t.Fatalf("Get(evicted) = %v, want ErrNotFound", err)
	}
	if rows, err := s.Get(context.Background(), "acme", "a-d"); err != nil || len(rows) != 2 {
		t.Fatalf("Get(kept) = %d rows, %v", len(rows), err)
	}
	// Seq keeps counting past the evicted rows; the chain still holds.
	out := appendAll(t, s, rec("acme", "a-z", audit.PhaseIntent))
	if out[0].Seq != 9 {
		t.Fatalf("next seq = %d, want 9", out[0].Seq)
	}
	verify(t, s, "acme", 4, 9)
	// A retry of a kept row dedupes and leaves the chain where it was.
	again := appendAll(t, s, rec("acme", "a-d", audit.PhaseOutcome))
	if again[0].Seq != 8 {
		t.Fatalf("retried kept row got seq %d, want 8", again[0].Seq)
	}
	if got, want := querySeqs(t, s, "acme"), []int64{9, 8, 7, 6}; !slices.Equal(got, want) {
		t.Fatalf("acme rows after retry = %v, want %v", got, want)
	}
}

// TestBoundVerifiesAcrossBatches appends batches larger and smaller than the bound: the kept
// rows always verify.
func TestBoundVerifiesAcrossBatches(t *testing.T) {
	s := newBounded(t, 5)
	var head int64
	for i, n := range []int{3, 7, 1, 5, 2} {
		var recs []audit.Record
		for j := range n {
			recs = append(recs, rec("acme", string(rune('a'+i))+string(rune('a'+j)), audit.PhaseOutcome))
		}
		appendAll(t, s, recs...)
		head += int64(n)
		verify(t, s, "acme", min(head, 5), head)
	}
}

func TestBoundKeepsOpenIntents(t *testing.T) {
	s := newBounded(t, 2)
	intent := appendAll(t, s, rec("acme", "open", audit.PhaseIntent))[0]
	done(t, s, "acme", "d-", 3) // "open" falls out of the kept rows
	if got := querySeqs(t, s, "acme"); slices.Contains(got, intent.Seq) {
		t.Fatalf("rows = %v, want the intent evicted from the window", got)
	}
	verify(t, s, "acme", 2, 7)
	pending, err := s.PendingIntents(context.Background(), audittest.Base.Add(time.Hour), 10)
	if err != nil || len(pending) != 1 || pending[0].InvocationID != "open" || pending[0].Seq != intent.Seq {
		t.Fatalf("PendingIntents = %+v, %v; want the open intent", pending, err)
	}
	// A retry of the held intent dedupes against it.
	if again := appendAll(t, s, rec("acme", "open", audit.PhaseIntent)); again[0].Seq != intent.Seq {
		t.Fatalf("retried intent got seq %d, want %d", again[0].Seq, intent.Seq)
	}
	if rows, err := s.Get(context.Background(), "acme", "open"); err != nil || len(rows) != 1 {
		t.Fatalf("Get(open) = %d rows, %v; want the held intent", len(rows), err)
	}
	// Its outcome settles it: the intent is gone for good.
	appendAll(t, s, rec("acme", "open", audit.PhaseOutcome))
	if pending, err := s.PendingIntents(context.Background(), audittest.Base.Add(time.Hour), 10); err != nil || len(pending) != 0 {
		t.Fatalf("PendingIntents after the outcome = %+v, %v", pending, err)
	}
	if rows, err := s.Get(context.Background(), "acme", "open"); err != nil || len(rows) != 1 || rows[0].Phase != audit.PhaseOutcome {
		t.Fatalf("Get(open) after the outcome = %+v, %v; want only the outcome", rows, err)
	}
	verify(t, s, "acme", 2, 8)
}

func TestBoundKeepsUnresolvedUnknowns(t *testing.T) {
	s := newBounded(t, 2)
	appendAll(t, s, unknown("acme", "lost"))
	done(t, s, "acme", "d-", 2)
	list := func() []string {
		t.Helper()
		rows, err := s.UnresolvedUnknowns(context.Background(), audittest.Base.Add(time.Hour), 10)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range rows {
			ids = append(ids, r.InvocationID)
		}
		return ids
	}
	if got := list(); !slices.Equal(got, []string{"lost"}) {
		t.Fatalf("UnresolvedUnknowns = %v, want [lost]", got)
	}
	appendAll(t, s, resolution("acme", "lost"))
	if got := list(); len(got) != 0 {
		t.Fatalf("UnresolvedUnknowns after the resolution = %v, want none", got)
	}
	verify(t, s, "acme", 2, 6)
}

// TestBoundWatchFromEvicted: a watch from before the kept rows starts at the oldest kept row.
func TestBoundWatchFromEvicted(t *testing.T) {
	s := newBounded(t, 3)
	done(t, s, "acme", "d-", 3) // rows 1..6, kept 4..6
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := s.Watch(ctx, "acme", 1)
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for r := range ch {
		got = append(got, r.Seq)
		if len(got) == 3 {
			cancel()
			break
		}
	}
	if want := []int64{4, 5, 6}; !slices.Equal(got, want) {
		t.Fatalf("watched %v, want %v", got, want)
	}
}

func TestUnbounded(t *testing.T) {
	s := newBounded(t, 0)
	done(t, s, "acme", "d-", 5)
	verify(t, s, "acme", 10, 10)
	if got := querySeqs(t, s, "acme"); len(got) != 10 {
		t.Fatalf("rows = %v, want all 10", got)
	}
}
