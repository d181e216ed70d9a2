package executor

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
)

// TestStageAudit runs the audit intent alone. The call is handed on after
// exactly one intent row (pending) describing it — principal, command,
// arguments withheld as for every row, their digest, the subject, the
// approval, the manifest — made durable in the executor's own outbox (the
// spool), not sent to the trail on the call's path: a trail that is down
// does not stop the call. A store that cannot take the row fails the call
// closed with audit.unavailable, retriable, nothing dispatched, and the
// refusal's own row is held for the trail. In check mode the stage does
// nothing, even with the store down.
func TestStageAudit(t *testing.T) {
	bot := testPrincipal("acme", "carol", "finance-bot")
	refund := Call{Code: "ticket.refund", Input: []byte(refundArgs), Channel: "mcp", GrantID: "ch-1", ConversationID: "conv-1"}

	for _, trailDown := range []bool{false, true} {
		t.Run(fmt.Sprintf("intent row in the outbox, trail down %v", trailDown), func(t *testing.T) {
			h := newStageHarness(t)
			ctx, inv := h.prepared(t, bot, refund, StageAudit, false)
			if trailDown {
				h.audit.takeAway(status.Error(codes.Unavailable, "connection refused"))
			}
			mark := h.audit.mark()
			if res, err := h.run(t, ctx, inv, StageAudit); res != nil || err != nil {
				t.Fatalf("audit = (%v, %v), want the call handed on", res, err)
			}
			if rows := h.audit.since(mark); len(rows) != 0 {
				t.Errorf("the intent went to the trail on the call's path: %v", rows)
			}
			rows := h.store.outbox(t)
			if len(rows) != 1 {
				t.Fatalf("%d rows in the outbox, want the intent", len(rows))
			}
			r := rows[0]
			if r.GetPhase() != contract.PhaseIntent || r.GetOutcome() != contract.OutcomePending || r.GetInvocationId() != inv.id ||
				r.GetTenant() != "acme" || r.GetUserId() != "carol" || r.GetAgentId() != "finance-bot" || r.GetActorKind() != contract.ActorAgent ||
				r.GetCommand() != "ticket.refund" || r.GetChannel() != "mcp" || r.GetConversationId() != "conv-1" || r.GetSubject() != "T-1001" ||
				r.GetArgumentsDigest() != inv.argDigest || r.GetArgumentsJson() != inv.args || r.GetRisk() != inv.cmd.Risk ||
				r.GetApproval().GetChallengeId() != "ch-1" || r.GetManifestDigest() != h.set.Digest() || r.GetStage() != "" || r.GetCode() != "" ||
				r.GetTime() == nil {
				t.Errorf("intent row %v, want the pending intent of %s, timed", r, inv.id)
			}
			if !inv.intended {
				t.Error("the invocation does not know its intent is durable")
			}
			if h.disp.count() != 0 {
				t.Error("the audit stage dispatched")
			}
		})
	}

	t.Run("store down: nothing is dispatched", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, bot, refund, StageAudit, false)
		h.store.script(func(s *fakeStore) { s.down = errors.New("connection refused") })
		h.audit.takeAway(status.Error(codes.Unavailable, "connection refused"))
		res, err := h.run(t, ctx, inv, StageAudit)
		fe := wantRefusal(t, res, err, inv, StageAudit, failure.CodeAuditUnavailable)
		if !fe.Retriable || inv.ending.outcome != contract.OutcomeFailed || inv.intended || h.disp.count() != 0 {
			t.Errorf("refusal %+v, ending %+v, intended %v, %d dispatches: want retriable, failed, no intent, none", fe, inv.ending, inv.intended, h.disp.count())
		}
		if rows := h.store.outbox(t); len(rows) != 0 {
			t.Errorf("the store is down and holds %d rows", len(rows))
		}
		h.e.heldMu.Lock()
		held := slices.Clone(h.e.held)
		h.e.heldMu.Unlock()
		wantOutcomeRow(t, held, inv, contract.OutcomeFailed, StageAudit, failure.CodeAuditUnavailable)
	})

	t.Run("store hung: refused within the attempt timeout", func(t *testing.T) {
		h := newStageHarness(t, func(c *Config) { c.OutcomeAttemptTimeout = 100 * time.Millisecond })
		ctx, inv := h.prepared(t, bot, refund, StageAudit, false)
		h.store.script(func(s *fakeStore) { s.spoolHung = true })
		done := make(chan struct{})
		var (
			res *Result
			err error
		)
		go func() { defer close(done); res, err = h.run(t, ctx, inv, StageAudit) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the intent's write is still waiting for a store that does not answer")
		}
		fe := wantRefusal(t, res, err, inv, StageAudit, failure.CodeAuditUnavailable)
		if !fe.Retriable || h.disp.count() != 0 {
			t.Errorf("refusal %+v after %d dispatches: want retriable and none", fe, h.disp.count())
		}
	})

	t.Run("check mode: no intent", func(t *testing.T) {
		for _, down := range []bool{false, true} {
			h := newStageHarness(t)
			// Without a grant: the check would say approval required, and
			// hands the call on.
			unapproved := refund
			unapproved.GrantID = ""
			ctx, inv := h.prepared(t, bot, unapproved, StageAudit, true)
			if down {
				h.store.script(func(s *fakeStore) { s.down = errors.New("connection refused") })
			}
			h.passes(t, ctx, inv, StageAudit)
			var spooled int
			h.store.script(func(s *fakeStore) { spooled = len(s.spooled) })
			if inv.intended || spooled != 0 {
				t.Errorf("store down %v: a check left an intent (%v) or %d spooled rows", down, inv.intended, spooled)
			}
		}
	})
}
