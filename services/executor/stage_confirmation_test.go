package executor

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
)

// confirmRefusal is the confirm service's refusal with code, as its gRPC
// client returns it.
func confirmRefusal(code string) error {
	return failure.New(StageConfirmation, code, "the confirm service refuses: "+code).GRPCStatus().Err()
}

// TestStageConfirmation runs confirmation_check alone.
//   - A command that needs no confirmation is handed on; the confirm
//     service is not asked. One with side effects needs it when the
//     deployment says so.
//   - Without a grant, a challenge is opened for exactly this invocation
//     (its digest, its id, the arguments with sensitive fields withheld)
//     and the call is refused with confirmation.required, carrying the
//     challenge and where the channel sends the grant; in check mode
//     nothing is opened and the verdict is approval required.
//   - With a grant, it is redeemed for this invocation's digest: the
//     approval is kept for the rows, and an undo registered that gives
//     the grant back (a grant approved in an MCP elicitation carries the
//     tenant's trust ceiling). A grant already redeemed by this key's
//     earlier call that provably never ran is released and redeemed
//     again. In check mode the challenge is read, not redeemed: approved
//     passes, pending is approval required.
//   - A declined, expired, already redeemed grant, one for other
//     arguments, and a confirm service that cannot be reached are refused
//     alike in both modes; a pending grant and a challenge that cannot be
//     opened are refused in a call.
func TestStageConfirmation(t *testing.T) {
	bot := testPrincipal("acme", "carol", "finance-bot")
	refund := func(grant string) Call {
		return Call{Code: "ticket.refund", Input: []byte(refundArgs), Channel: "mcp", GrantID: grant}
	}

	t.Run("no confirmation needed", func(t *testing.T) {
		for _, checking := range []bool{false, true} {
			h := newStageHarness(t)
			ctx, inv := h.prepared(t, testPrincipal("acme", "alice", ""), Call{Code: "expense.report.submit", Input: []byte(`{"report_id":"ER-2001"}`), Channel: "grpc"}, StageConfirmation, checking)
			h.passes(t, ctx, inv, StageConfirmation)
			if c := h.confirm.calls(); c != (confirmCalls{}) || inv.needsApproval != nil {
				t.Errorf("checking=%v: the confirm service was asked %+v, approval %v", checking, c, inv.needsApproval)
			}
		}
	})

	t.Run("a challenge is opened", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, bot, refund(""), StageConfirmation, false)
		mark := h.audit.mark()
		res, err := h.run(t, ctx, inv, StageConfirmation)
		fe := wantRefusal(t, res, err, inv, StageConfirmation, failure.CodeConfirmationRequired)
		h.confirm.script(func(c *fakeConfirm) {
			if len(c.opened) != 1 {
				t.Fatalf("%d challenges opened, want one", len(c.opened))
			}
			o := c.opened[0]
			if o.GetCommand() != "ticket.refund" || o.GetInvocationDigest() != invocationDigest(inv, inv.canon) || o.GetInvocationId() != inv.id ||
				o.GetArgumentsJson() != inv.args || strings.Contains(o.GetArgumentsJson(), "CH4242424242") ||
				!slices.Contains(o.GetWithheldFields(), "/cardholder_reference") {
				t.Errorf("opened %v, want this invocation's digest and id, the arguments with the cardholder reference withheld", o)
			}
		})
		if fe.ChallengeID != "ch-1" || fe.ApprovalURL != "http://approve.test/approve/ch-1" || !fe.Retriable ||
			fe.GrantIn != grantInMCPMeta || fe.GrantName != contract.GrantMeta || !strings.Contains(fe.Remedy, contract.GrantMeta) {
			t.Errorf("refusal %+v, want the challenge, retriable, the grant in _meta", fe)
		}
		wantOutcomeRow(t, h.audit.since(mark), inv, contract.OutcomeRefused, StageConfirmation, failure.CodeConfirmationRequired)
		if inv.redeemedDigest != "" || ownUndo(inv) != 0 {
			t.Errorf("an opened challenge left a redemption %q, %d undo steps", inv.redeemedDigest, ownUndo(inv))
		}
	})

	t.Run("check mode: approval required, nothing opened", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, bot, refund(""), StageConfirmation, true)
		h.passes(t, ctx, inv, StageConfirmation)
		na := inv.needsApproval
		if na == nil || na.Stage != StageConfirmation || na.Code != failure.CodeConfirmationRequired || na.ChallengeID != "" || na.GrantIn != grantInMCPMeta {
			t.Errorf("approval needed %+v, want confirmation.required without a challenge, the grant in _meta", na)
		}
		if c := h.confirm.calls(); c != (confirmCalls{}) {
			t.Errorf("a check asked the confirm service %+v", c)
		}
	})

	t.Run("the deployment confirms side effects", func(t *testing.T) {
		h := newStageHarness(t, func(c *Config) { c.ConfirmSideEffects = true })
		ctx, inv := h.prepared(t, testPrincipal("acme", "alice", ""), Call{Code: "expense.report.submit", Input: []byte(`{"report_id":"ER-2001"}`), Channel: "grpc"}, StageConfirmation, false)
		res, err := h.run(t, ctx, inv, StageConfirmation)
		fe := wantRefusal(t, res, err, inv, StageConfirmation, failure.CodeConfirmationRequired)
		if h.confirm.calls().open != 1 || fe.GrantIn != grantInField || fe.GrantName != contract.GrantField {
			t.Errorf("opened %d challenges, refusal %+v: want one, and the grant in the request's field", h.confirm.calls().open, fe)
		}
	})

	t.Run("a grant is redeemed, and given back by the undo", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, bot, refund("ch-1"), StageConfirmation, false)
		h.passes(t, ctx, inv, StageConfirmation)
		d := invocationDigest(inv, inv.canon)
		h.confirm.script(func(c *fakeConfirm) {
			if len(c.redeemed) != 1 || c.redeemed[0].GetChallengeId() != "ch-1" || c.redeemed[0].GetInvocationDigest() != d {
				t.Errorf("redeemed %v, want ch-1 for this invocation's digest", c.redeemed)
			}
		})
		if a := inv.approval; a == nil || a.GetChallengeId() != "ch-1" || a.GetApprover() != "carol" || a.GetChannel() != "api" || a.GetTrustCeiling() != "" {
			t.Errorf("approval %v, want carol's over the API on ch-1", a)
		}
		if inv.redeemedDigest != d || ownUndo(inv) != 1 {
			t.Fatalf("redeemed digest %q, %d undo steps; want this invocation's, one", inv.redeemedDigest, ownUndo(inv))
		}
		inv.compensate(ctx, h.e)
		h.confirm.script(func(c *fakeConfirm) {
			if len(c.released) != 1 || c.released[0].GetChallengeId() != "ch-1" || c.released[0].GetInvocationDigest() != d {
				t.Errorf("released %v, want ch-1 for this invocation's digest", c.released)
			}
		})
		if inv.redeemedDigest != "" {
			t.Error("the grant given back is still marked redeemed")
		}
	})

	t.Run("a grant approved in an MCP elicitation", func(t *testing.T) {
		h := newStageHarness(t)
		h.confirm.script(func(c *fakeConfirm) { c.grantVia = contract.ChannelMCPElicitation })
		ctx, inv := h.prepared(t, bot, refund("ch-1"), StageConfirmation, false)
		h.passes(t, ctx, inv, StageConfirmation)
		if got := inv.approval.GetTrustCeiling(); got == "" || got != inv.res.TrustCeiling || got != directory.DefaultTrustCeiling {
			t.Errorf("trust ceiling %q, want the tenant's (%q)", got, inv.res.TrustCeiling)
		}
	})

	t.Run("a grant spent by a call that never ran is redeemed again", func(t *testing.T) {
		h := newStageHarness(t)
		h.confirm.script(func(c *fakeConfirm) { c.redeemErr = confirmRefusal(failure.CodeConfirmationAlreadyRedeemed) })
		ctx, inv := h.prepared(t, bot, refund("ch-1"), StageConfirmation, false)
		inv.priorNotRun = true
		h.passes(t, ctx, inv, StageConfirmation)
		if c := h.confirm.calls(); c.redeem != 2 || c.release != 1 || inv.redeemedDigest == "" {
			t.Errorf("confirm calls %+v, redeemed %q: want redeem, release, redeem", c, inv.redeemedDigest)
		}
	})

	// challenge scripts Get to answer the grant in state for digest (""
	// means this invocation's), and Redeem to refuse with code ("" grants).
	challenge := func(state mandatev1.ChallengeState, digest, code string) func(*stageHarness, *invocation) {
		return func(h *stageHarness, inv *invocation) {
			if digest == "" {
				digest = invocationDigest(inv, inv.canon)
			}
			h.confirm.script(func(c *fakeConfirm) {
				c.challenge = &mandatev1.Challenge{ChallengeId: "ch-1", State: state, InvocationDigest: digest, ApprovalUrl: "http://approve.test/approve/ch-1"}
				if code != "" {
					c.redeemErr = confirmRefusal(code)
				}
			})
		}
	}

	t.Run("check mode: an approved grant is read, not redeemed", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, bot, refund("ch-1"), StageConfirmation, true)
		challenge(mandatev1.ChallengeState_CHALLENGE_STATE_APPROVED, "", "")(h, inv)
		h.passes(t, ctx, inv, StageConfirmation)
		if c := h.confirm.calls(); c.get != 1 || c.redeem != 0 || inv.needsApproval != nil || len(inv.undo) != 0 {
			t.Errorf("confirm calls %+v, approval needed %v: want one read and nothing else", c, inv.needsApproval)
		}
	})

	t.Run("a pending grant", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, bot, refund("ch-1"), StageConfirmation, false)
		challenge(mandatev1.ChallengeState_CHALLENGE_STATE_PENDING, "", failure.CodeConfirmationPending)(h, inv)
		mark := h.audit.mark()
		res, err := h.run(t, ctx, inv, StageConfirmation)
		fe := wantRefusal(t, res, err, inv, StageConfirmation, failure.CodeConfirmationPending)
		if !fe.Retriable {
			t.Error("confirmation.pending is not retriable")
		}
		wantOutcomeRow(t, h.audit.since(mark), inv, contract.OutcomeRefused, StageConfirmation, failure.CodeConfirmationPending)

		h = newStageHarness(t)
		ctx, inv = h.prepared(t, bot, refund("ch-1"), StageConfirmation, true)
		challenge(mandatev1.ChallengeState_CHALLENGE_STATE_PENDING, "", failure.CodeConfirmationPending)(h, inv)
		h.passes(t, ctx, inv, StageConfirmation)
		if na := inv.needsApproval; na == nil || na.Code != failure.CodeConfirmationPending || na.ChallengeID != "ch-1" || h.confirm.calls().redeem != 0 {
			t.Errorf("in check mode: approval needed %+v, want confirmation.pending on ch-1 and no redemption", na)
		}
	})

	t.Run("the challenge cannot be opened", func(t *testing.T) {
		h := newStageHarness(t)
		h.confirm.script(func(c *fakeConfirm) { c.openErr = status.Error(codes.Unavailable, "connection refused") })
		ctx, inv := h.prepared(t, bot, refund(""), StageConfirmation, false)
		mark := h.audit.mark()
		res, err := h.run(t, ctx, inv, StageConfirmation)
		if fe := wantRefusal(t, res, err, inv, StageConfirmation, failure.CodeConfirmationUnavailable); !fe.Retriable {
			t.Error("confirmation.unavailable is not retriable")
		}
		wantOutcomeRow(t, h.audit.since(mark), inv, contract.OutcomeFailed, StageConfirmation, failure.CodeConfirmationUnavailable)
	})

	nothingHeld := func(t *testing.T, _ *stageHarness, inv *invocation, _ *failure.Error) {
		if inv.redeemedDigest != "" || inv.approval != nil || ownUndo(inv) != 0 {
			t.Errorf("a refused grant left a redemption %q, approval %v, %d undo steps", inv.redeemedDigest, inv.approval, ownUndo(inv))
		}
	}
	stageRefuses(t, StageConfirmation, []stageRefusal{
		{name: "declined", p: bot, call: refund("ch-1"),
			edit:  challenge(mandatev1.ChallengeState_CHALLENGE_STATE_DECLINED, "", failure.CodeConfirmationRefused),
			stage: StageConfirmation, code: failure.CodeConfirmationRefused, check: nothingHeld},
		{name: "expired", p: bot, call: refund("ch-1"),
			edit:  challenge(mandatev1.ChallengeState_CHALLENGE_STATE_EXPIRED, "", failure.CodeConfirmationExpired),
			stage: StageConfirmation, code: failure.CodeConfirmationExpired, check: nothingHeld},
		{name: "already redeemed", p: bot, call: refund("ch-1"),
			edit:  challenge(mandatev1.ChallengeState_CHALLENGE_STATE_REDEEMED, "", failure.CodeConfirmationAlreadyRedeemed),
			stage: StageConfirmation, code: failure.CodeConfirmationAlreadyRedeemed, check: nothingHeld},
		{name: "for other arguments", p: bot, call: refund("ch-1"),
			edit:  challenge(mandatev1.ChallengeState_CHALLENGE_STATE_APPROVED, "another-digest", failure.CodeConfirmationGrantMismatch),
			stage: StageConfirmation, code: failure.CodeConfirmationGrantMismatch, check: nothingHeld},
		{name: "confirm service unreachable", p: bot, call: refund("ch-1"),
			arrange: func(h *stageHarness) {
				h.confirm.script(func(c *fakeConfirm) {
					c.redeemErr = status.Error(codes.Unavailable, "connection refused")
					c.getErr = c.redeemErr
				})
			},
			stage: StageConfirmation, code: failure.CodeConfirmationUnavailable, failed: true, check: nothingHeld},
	})
}

// ownUndo are the undo steps of inv besides giving back what budget_check
// spent (the sample's refund counts the bot's refunds against a budget).
func ownUndo(inv *invocation) int {
	if inv.spent != nil {
		return len(inv.undo) - 1
	}
	return len(inv.undo)
}
