package executor

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/failure"
)

// TestStageSoD runs sod_check alone. A command without separation of
// duties is handed on without asking the store; one with it asks whether
// this user ran a conflicting command on the same subject (the field the
// declaration names), and is handed on when another user did, or this
// user did on another subject; it is refused with sod.conflict, naming the
// conflicting command and the field, when this user did; a store that
// cannot be reached is a fault.
func TestStageSoD(t *testing.T) {
	approve := Call{Code: "expense.report.approve", Input: []byte(approveArgs), Channel: "grpc"}
	submitted := func(user, report string) func(h *stageHarness) {
		return func(h *stageHarness) {
			h.store.script(func(s *fakeStore) {
				s.executions = append(s.executions, Execution{Tenant: "acme", User: user, Command: "expense.report.submit",
					Subject: report, InvocationID: "inv_submit", Time: time.Now()})
			})
		}
	}

	t.Run("no separation of duties", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, testPrincipal("acme", "alice", ""), Call{Code: "ticket.search", Input: []byte(searchArgs), Channel: "grpc"}, StageSoD, false)
		h.passes(t, ctx, inv, StageSoD)
		h.store.script(func(s *fakeStore) {
			if len(s.asked) != 0 {
				t.Errorf("the store was asked %+v for a command without separation of duties", s.asked)
			}
		})
	})

	for _, tc := range []struct {
		name, approver, submitter, report string
	}{
		{"another user submitted", "bob", "lena", "ER-2003"},
		{"the same user submitted another report", "lena", "lena", "ER-9999"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newStageHarness(t)
			submitted(tc.submitter, tc.report)(h)
			ctx, inv := h.prepared(t, testPrincipal("acme", tc.approver, ""), approve, StageSoD, false)
			h.passes(t, ctx, inv, StageSoD)
			h.store.script(func(s *fakeStore) {
				want := executedQuery{"acme", tc.approver, []string{"expense.report.submit"}, "ER-2003"}
				if len(s.asked) != 1 || s.asked[0].tenant != want.tenant || s.asked[0].user != want.user ||
					!slices.Equal(s.asked[0].commands, want.commands) || s.asked[0].subject != want.subject {
					t.Errorf("the store was asked %+v, want %+v", s.asked, want)
				}
			})
		})
	}

	stageRefuses(t, StageSoD, []stageRefusal{
		{name: "the same user submitted it", p: testPrincipal("acme", "lena", ""), call: approve, arrange: submitted("lena", "ER-2003"),
			stage: StageSoD, code: failure.CodeSoDConflict,
			check: func(t *testing.T, _ *stageHarness, _ *invocation, fe *failure.Error) {
				if !strings.Contains(fe.Message, "expense.report.submit") || !strings.Contains(fe.Message, "report_id") {
					t.Errorf("the refusal does not name the conflict: %q", fe.Message)
				}
			}},
		{name: "store unreachable", p: testPrincipal("acme", "lena", ""), call: approve,
			arrange: func(h *stageHarness) {
				h.store.script(func(s *fakeStore) { s.down = fmt.Errorf("%w: connection refused", ErrUnavailable) })
			},
			stage: StageSoD, code: failure.CodeSoDUnavailable, failed: true},
	})
}
