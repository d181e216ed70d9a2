package executor

import (
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/failure"
)

// TestStagePermission runs permission_check alone. A user holding every
// permission the command declares, and an agent acting for such a user,
// are handed on; a user or agent lacking one is refused with
// authorization.permission_denied, naming what is missing — before the
// arguments are parsed, so that even a call with arguments the schema
// refuses learns nothing about the schema (no violations, nothing
// decoded).
func TestStagePermission(t *testing.T) {
	for _, tc := range []struct {
		name        string
		user, agent string
		code, input string
	}{
		{"user holds the permission", "carol", "", "ticket.refund", refundArgs},
		{"agent acting for a user who holds it", "carol", "finance-bot", "ticket.refund", refundArgs},
		{"user granted it by another role", "lena", "", "expense.report.approve", approveArgs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newStageHarness(t)
			ctx, inv := h.prepared(t, testPrincipal("acme", tc.user, tc.agent), Call{Code: tc.code, Input: []byte(tc.input), Channel: "grpc"}, StagePermission, false)
			h.passes(t, ctx, inv, StagePermission)
		})
	}

	denied := func(perm string) func(*testing.T, *stageHarness, *invocation, *failure.Error) {
		return func(t *testing.T, _ *stageHarness, inv *invocation, fe *failure.Error) {
			if !strings.Contains(fe.Message, perm) {
				t.Errorf("the refusal does not name %s: %q", perm, fe.Message)
			}
			if len(fe.Violations) != 0 || inv.req != nil || inv.args != "" || inv.argDigest != "" {
				t.Errorf("the arguments were looked at before permission: violations %v, request %v, args %q", fe.Violations, inv.req, inv.args)
			}
		}
	}
	stageRefuses(t, StagePermission, []stageRefusal{
		{name: "agent whose user lacks it", p: testPrincipal("acme", "alice", "support-bot"),
			call:  Call{Code: "ticket.refund", Input: []byte(refundArgs), Channel: "mcp"},
			stage: StagePermission, code: failure.CodeAuthorizationPermissionDenied, check: denied("payment.refund")},
		{name: "before parsing", p: testPrincipal("acme", "alice", "support-bot"),
			call:  Call{Code: "ticket.refund", Input: []byte(`{"bogus":1}`), Channel: "mcp"},
			stage: StagePermission, code: failure.CodeAuthorizationPermissionDenied, check: denied("payment.refund")},
		{name: "user who lacks it", p: testPrincipal("acme", "bob", ""),
			call:  Call{Code: "expense.report.create", Input: []byte(createArgs), Channel: "grpc"},
			stage: StagePermission, code: failure.CodeAuthorizationPermissionDenied, check: denied("expense.report.submit")},
	})
}
