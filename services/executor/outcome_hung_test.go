package executor

import (
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/failure"
)

// TestARefusalsRowDoesNotWaitForASilentTrail: the row of a refusal is
// written before the caller hears the refusal. A trail that does not
// answer within an attempt's deadline (its database hung) is not asked
// again, eight times over: the row goes to the spool after the one
// attempt, so the caller waits one attempt, not eight.
func TestARefusalsRowDoesNotWaitForASilentTrail(t *testing.T) {
	h := newStageHarness(t, func(c *Config) { c.OutcomeAttemptTimeout = 200 * time.Millisecond })
	bot := testPrincipal("acme", "carol", "finance-bot")
	_, inv := h.prepared(t, bot, Call{Code: "ticket.refund", Input: []byte(refundArgs), Channel: "mcp"}, StagePermission, false)
	h.audit.hang(true)
	_ = h.e.refuseWith(t.Context(), inv, failure.New(StagePermission, failure.CodeAuthorizationPermissionDenied, "refused"))
	h.audit.hang(false)
	h.audit.mu.Lock()
	asked := h.audit.unanswered
	h.audit.mu.Unlock()
	var spooled []SpooledRow
	h.store.script(func(s *fakeStore) { spooled = s.spooled })
	if len(spooled) != 1 || spooled[0].InvocationID != inv.id {
		t.Fatalf("spooled %+v, want the refusal's row", spooled)
	}
	if asked != 1 {
		t.Errorf("the silent trail was asked %d times for the row, want once", asked)
	}
}
