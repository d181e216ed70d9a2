package executor

import (
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/failure"
)

// TestStageEntitlement runs entitlement_check alone. A command whose
// required feature the tenant holds, and one that requires none, are
// handed on; a command the tenant is not entitled to is refused with
// entitlement.missing, naming the feature.
func TestStageEntitlement(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    []string
		code string
	}{
		{"tenant holds the feature", []string{"acme", "alice", ""}, "expense.report.create"},
		{"command requires none", []string{"globex", "dave", ""}, "ticket.search"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newStageHarness(t)
			ctx, inv := h.prepared(t, testPrincipal(tc.p[0], tc.p[1], tc.p[2]), Call{Code: tc.code, Input: []byte(`{}`), Channel: "grpc"}, StageEntitlement, false)
			h.passes(t, ctx, inv, StageEntitlement)
		})
	}
	stageRefuses(t, StageEntitlement, []stageRefusal{
		{name: "tenant lacks the feature", p: testPrincipal("globex", "dave", ""),
			call:  Call{Code: "expense.report.create", Input: []byte(createArgs), Channel: "grpc"},
			stage: StageEntitlement, code: failure.CodeEntitlementMissing,
			check: func(t *testing.T, _ *stageHarness, _ *invocation, fe *failure.Error) {
				if !strings.Contains(fe.Message, "expenses") {
					t.Errorf("the refusal does not name the feature: %q", fe.Message)
				}
			}},
	})
}
