package executor

import (
	"testing"

	"github.com/mandate-dev/mandate/internal/failure"
)

// TestStageLoad runs load_definition alone. A published command, or a
// deprecated one, is handed on with its definition and its RPC's method
// descriptor; an unknown code, a code that is no command name at all (its
// row says "unknown"), and a draft command are refused as
// command.not_found, and nothing of a definition is kept.
func TestStageLoad(t *testing.T) {
	alice := testPrincipal("acme", "alice", "")
	for _, lifecycle := range []string{"PUBLISHED", "DEPRECATED"} {
		t.Run(lifecycle, func(t *testing.T) {
			h := newStageHarness(t)
			want, _ := h.set.ByCode("ticket.refund")
			want.Lifecycle = lifecycle
			ctx, inv := h.prepared(t, alice, Call{Code: "ticket.refund", Input: []byte(refundArgs), Channel: "grpc"}, StageLoad, false)
			h.passes(t, ctx, inv, StageLoad)
			md, _ := h.set.Method("ticket.refund")
			if inv.cmd != want || inv.method == nil || inv.method.FullName() != md.FullName() {
				t.Errorf("definition %v, method %v; want ticket.refund and %s", inv.cmd, inv.method, md.FullName())
			}
		})
	}

	nothingKept := func(t *testing.T, _ *stageHarness, inv *invocation, _ *failure.Error) {
		if inv.cmd != nil || inv.method != nil {
			t.Errorf("a refused load kept the definition %v, method %v", inv.cmd, inv.method)
		}
	}
	stageRefuses(t, StageLoad, []stageRefusal{
		{name: "unknown code", p: alice, call: Call{Code: "ticket.delete", Input: []byte(`{}`), Channel: "grpc"},
			stage: StageLoad, code: failure.CodeCommandNotFound, check: nothingKept},
		{name: "not a command name", p: alice, call: Call{Code: "drop table\n", Input: []byte(`{}`), Channel: "grpc"},
			stage: StageLoad, code: failure.CodeCommandNotFound, check: nothingKept},
		{name: "draft command", p: alice, call: Call{Code: "ticket.search", Input: []byte(searchArgs), Channel: "grpc"},
			arrange: func(h *stageHarness) {
				cmd, _ := h.set.ByCode("ticket.search")
				cmd.Lifecycle = "DRAFT"
			},
			stage: StageLoad, code: failure.CodeCommandNotFound, check: nothingKept},
	})
}
