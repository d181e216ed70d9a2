package postgres

import (
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/audittest"
)

// TestPendingOfOneBatch holds the pending bookkeeping to what a batch needs: an intent whose
// outcome is a new row of the same batch is neither added to audit.pending nor cleared from it
// (the relay sends most calls' two rows together), while an intent without its outcome is
// added, and an outcome whose intent came in an earlier batch clears it.
func TestPendingOfOneBatch(t *testing.T) {
	rec := func(inv string, phase audit.Phase) audit.Record {
		return audittest.Rec("acme", inv, phase).Normalize(audittest.Base)
	}
	cases := []struct {
		name           string
		recs           []audit.Record
		added, cleared []string
	}{
		{name: "intent and outcome", recs: []audit.Record{rec("a", audit.PhaseIntent), rec("a", audit.PhaseOutcome)}},
		{name: "the outcome twice", recs: []audit.Record{rec("a", audit.PhaseIntent), rec("a", audit.PhaseOutcome), rec("a", audit.PhaseOutcome)}},
		{name: "an intent alone", recs: []audit.Record{rec("a", audit.PhaseIntent), rec("b", audit.PhaseIntent), rec("b", audit.PhaseOutcome)},
			added: []string{"a"}},
		{name: "an earlier intent's outcome", recs: []audit.Record{rec("c", audit.PhaseOutcome), rec("b", audit.PhaseIntent), rec("b", audit.PhaseOutcome)},
			cleared: []string{"c"}},
		{name: "no outcome", recs: []audit.Record{rec("a", audit.PhaseIntent), rec("b", audit.PhaseIntent)}, added: []string{"a", "b"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newPlan(tc.recs).chain(map[string]audit.Head{}, nil)
			b := &pgx.Batch{}
			c.queuePending(b, false)
			var added, cleared []string
			for _, q := range b.QueuedQueries {
				switch q.SQL {
				case sqlAddPending:
					added = q.Arguments[1].([]string)
				case sqlClearPending:
					cleared = q.Arguments[1].([]string)
				default:
					t.Fatalf("unexpected statement %q", q.SQL)
				}
			}
			if !slices.Equal(added, tc.added) || !slices.Equal(cleared, tc.cleared) {
				t.Fatalf("pending added %v, cleared %v; want added %v, cleared %v", added, cleared, tc.added, tc.cleared)
			}
		})
	}
}
