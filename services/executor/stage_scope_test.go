package executor

import (
	"testing"

	"github.com/mandate-dev/mandate/internal/failure"
)

// TestStageScope runs scope_check alone. A call that names no tenant, or
// the principal's own, is handed on; one that names another tenant is
// refused with scope.tenant_mismatch.
func TestStageScope(t *testing.T) {
	alice := testPrincipal("acme", "alice", "")
	for _, tenant := range []string{"", "acme"} {
		t.Run("tenant "+tenant, func(t *testing.T) {
			h := newStageHarness(t)
			ctx, inv := h.prepared(t, alice, Call{Code: "ticket.search", Input: []byte(searchArgs), Channel: "rest", Tenant: tenant}, StageScope, false)
			h.passes(t, ctx, inv, StageScope)
		})
	}
	stageRefuses(t, StageScope, []stageRefusal{
		{name: "another tenant named", p: alice, call: Call{Code: "ticket.search", Input: []byte(searchArgs), Channel: "rest", Tenant: "globex"},
			stage: StageScope, code: failure.CodeScopeTenantMismatch},
	})
}
