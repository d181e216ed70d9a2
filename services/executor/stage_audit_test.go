package executor

import (
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
)

// TestStageAudit runs the audit intent alone. The call is handed on after
// exactly one intent row (pending) describing it — principal, command,
// arguments withheld as for every row, their digest, the subject, the
// approval, the manifest — whose stored copy the invocation keeps for the
// outcome's audit id. A trail that cannot take the row fails the call
// closed with audit.unavailable, retriable, and the refusal's own row
// waits in the spool. In check mode the stage does nothing, even with the
// trail down.
func TestStageAudit(t *testing.T) {
	bot := testPrincipal("acme", "carol", "finance-bot")
	refund := Call{Code: "ticket.refund", Input: []byte(refundArgs), Channel: "mcp", GrantID: "ch-1", ConversationID: "conv-1"}

	t.Run("intent row", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, bot, refund, StageAudit, false)
		mark := h.audit.mark()
		if res, err := h.run(t, ctx, inv, StageAudit); res != nil || err != nil {
			t.Fatalf("audit = (%v, %v), want the call handed on", res, err)
		}
		rows := h.audit.since(mark)
		if len(rows) != 1 {
			t.Fatalf("%d rows, want the intent", len(rows))
		}
		r := rows[0]
		if r.GetPhase() != contract.PhaseIntent || r.GetOutcome() != contract.OutcomePending || r.GetInvocationId() != inv.id ||
			r.GetTenant() != "acme" || r.GetUserId() != "carol" || r.GetAgentId() != "finance-bot" || r.GetActorKind() != contract.ActorAgent ||
			r.GetCommand() != "ticket.refund" || r.GetChannel() != "mcp" || r.GetConversationId() != "conv-1" || r.GetSubject() != "T-1001" ||
			r.GetArgumentsDigest() != inv.argDigest || r.GetArgumentsJson() != inv.args || r.GetRisk() != inv.cmd.Risk ||
			r.GetApproval().GetChallengeId() != "ch-1" || r.GetManifestDigest() != h.set.Digest() || r.GetStage() != "" || r.GetCode() != "" {
			t.Errorf("intent row %v, want the pending intent of %s", r, inv.id)
		}
		if len(inv.intentRows) != 1 || auditID(inv.intentRows) != "acme/"+strconv.FormatInt(r.GetSeq(), 10) {
			t.Errorf("the invocation keeps %v, want the stored intent (audit id %s)", inv.intentRows, auditID(inv.intentRows))
		}
		if h.disp.count() != 0 {
			t.Error("the audit stage dispatched")
		}
	})

	t.Run("trail down: nothing is dispatched", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, bot, refund, StageAudit, false)
		h.audit.takeAway(status.Error(codes.Unavailable, "connection refused"))
		mark := h.audit.mark()
		res, err := h.run(t, ctx, inv, StageAudit)
		fe := wantRefusal(t, res, err, inv, StageAudit, failure.CodeAuditUnavailable)
		if !fe.Retriable || inv.ending.outcome != contract.OutcomeFailed || len(inv.intentRows) != 0 {
			t.Errorf("refusal %+v, ending %+v, intent %v: want retriable, failed, no intent", fe, inv.ending, inv.intentRows)
		}
		if rows := h.audit.since(mark); len(rows) != 0 {
			t.Errorf("the trail is down and holds %d rows", len(rows))
		}
		var spooled []SpooledRow
		h.store.script(func(s *fakeStore) { spooled = s.spooled })
		if len(spooled) != 1 || spooled[0].InvocationID != inv.id || spooled[0].Tenant != "acme" {
			t.Fatalf("spooled %+v, want the refusal's row", spooled)
		}
		rec, err := decodeSpooled(spooled[0].Record)
		if err != nil {
			t.Fatal(err)
		}
		wantOutcomeRow(t, []*mandatev1.AuditRecord{rec}, inv, contract.OutcomeFailed, StageAudit, failure.CodeAuditUnavailable)
	})

	t.Run("trail hung: refused within the attempt timeout", func(t *testing.T) {
		h := newStageHarness(t, func(c *Config) { c.OutcomeAttemptTimeout = 100 * time.Millisecond })
		ctx, inv := h.prepared(t, bot, refund, StageAudit, false)
		h.audit.hang(true)
		done := make(chan struct{})
		var (
			res *Result
			err error
		)
		go func() { defer close(done); res, err = h.run(t, ctx, inv, StageAudit) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the intent's append is still waiting for a trail that does not answer")
		}
		fe := wantRefusal(t, res, err, inv, StageAudit, failure.CodeAuditUnavailable)
		if !fe.Retriable || h.disp.count() != 0 {
			t.Errorf("refusal %+v after %d dispatches: want retriable and none", fe, h.disp.count())
		}
		h.audit.hang(false)
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
				h.audit.takeAway(status.Error(codes.Unavailable, "connection refused"))
			}
			h.passes(t, ctx, inv, StageAudit)
			var spooled int
			h.store.script(func(s *fakeStore) { spooled = len(s.spooled) })
			if len(inv.intentRows) != 0 || spooled != 0 {
				t.Errorf("trail down %v: a check left an intent %v or %d spooled rows", down, inv.intentRows, spooled)
			}
		}
	})
}
