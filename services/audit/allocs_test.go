package audit_test

import (
	"context"
	"testing"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/audittest"
	"github.com/mandate-dev/mandate/services/audit/memory"
)

// TestAppendAllocs guards the allocations of one Append of one record by a lone caller over
// the memory store (mandate dev's path, twice per governed call): the copy Normalize makes,
// the store's copy and its hash, the row returned, and the batch of one around them. The
// ceilings sit just above what this costs today; BenchmarkWriterAppend shows where it goes.
func TestAppendAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	if testing.Short() {
		t.Skip("measures many appends")
	}
	st := memory.New(memory.Options{MaxRows: 100})
	t.Cleanup(st.Close)
	w := newWriter(t, st, audit.WriterOptions{})
	const runs = 300
	recs := benchRecords(2 * (runs + 1))
	ctx := context.Background()
	next := 0
	appendOne := func() {
		if _, err := w.Append(ctx, recs[next]); err != nil {
			t.Fatal(err)
		}
		next++
	}
	for next < runs { // fills the store's ring: its maps and rows reach their steady size
		appendOne()
	}
	got := testing.AllocsPerRun(runs, appendOne)
	t.Logf("%.1f allocations per Append", got)
	const ceiling = 15
	if got > ceiling {
		t.Errorf("%.1f allocations per Append, ceiling %d", got, ceiling)
	}

	r := audittest.Rec("acme", "inv-1", audit.PhaseOutcome).Normalize(audittest.Base)
	prev := audit.GenesisHash()
	if got := testing.AllocsPerRun(100, func() { audit.ComputeHash(prev, 1, &r) }); got != 1 {
		t.Errorf("ComputeHash: %.1f allocations, want 1 (the hash it returns)", got)
	}
}
