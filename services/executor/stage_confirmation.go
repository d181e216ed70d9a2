package executor

import (
	"context"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
)

// confirmationCheck asks a human where the declaration (or the
// deployment, for side effects) says so: it opens a challenge, or redeems
// the grant the call carries (confirm). Before it opens a challenge it asks
// the command's backend what the call would do (preflight): a call the
// backend would refuse is refused at once with the backend's stage and
// code, and nobody is asked; otherwise the approver is shown the effect
// lines. A call that carries a grant is not previewed again: the backend
// checks its state when the call is dispatched, and refuses one that moved
// since the approval with its own code.
func (e *Executor) confirmationCheck(ctx context.Context, inv *invocation) (*Result, error) {
	if !e.needsConfirmation(inv) {
		return nil, nil
	}
	if inv.call.GrantID == "" {
		if err := e.preflight(ctx, inv); err != nil {
			return nil, err
		}
	}
	return nil, e.confirm(ctx, inv, inv.canon)
}

// needsConfirmation reports whether a human must confirm the call.
func (e *Executor) needsConfirmation(inv *invocation) bool {
	return inv.cmd.ConfirmationRequired || len(inv.askedBy) > 0 || len(inv.escalatedBy) > 0 || (e.cfg.ConfirmSideEffects && len(inv.cmd.SideEffects) > 0)
}

// confirmationMessage is the refusal's message when a human must confirm:
// why, where a declared condition asks.
func confirmationMessage(inv *invocation) string {
	if r := askedReason(inv); r != "" {
		return "a human must confirm this call: " + r
	}
	return "a human must confirm this call"
}

// confirmationVerdict is confirmation_check in check mode. Where the call
// would reach its backend — no confirmation needed, or an approved grant —
// the backend's preview of it is asked (checkPreflight), so that "would
// this pass?" answers the backend's refusal too, as dispatch would meet it.
// Without a grant the call would preview and then open a challenge: the
// verdict is the backend's refusal, or approval required, with who
// approves and how the approved call is sent again. With a grant, the
// challenge is read, not redeemed: approved for exactly this invocation
// lets the call through to the preview; undecided still needs the
// approval; anything else is the refusal Redeem would give.
func (e *Executor) confirmationVerdict(ctx context.Context, inv *invocation) (*Result, error) {
	if !e.needsConfirmation(inv) {
		return nil, e.checkPreflight(ctx, inv)
	}
	if inv.call.GrantID == "" {
		if err := e.checkPreflight(ctx, inv); err != nil {
			return nil, err
		}
		fe := failure.New(StageConfirmation, failure.CodeConfirmationRequired, confirmationMessage(inv))
		fe.Retriable = true
		continueWith(fe, inv)
		inv.needsApproval = fe
		return nil, nil
	}
	var ch *mandatev1.Challenge
	if err := e.stage(ctx, StageConfirmation, func(ctx context.Context) error {
		var err error
		ch, err = e.cfg.Confirm.Get(ctx, &mandatev1.ConfirmServiceGetRequest{ChallengeId: inv.call.GrantID})
		return confirmError(err)
	}); err != nil {
		return nil, e.confirmFailure(ctx, inv, err)
	}
	refuse := func(code, msg string) (*Result, error) {
		return nil, e.confirmFailure(ctx, inv, failure.New(StageConfirmation, code, msg))
	}
	switch was := ch.GetDeclarationDigest(); {
	case ch.GetInvocationDigest() != invocationDigest(inv, inv.canon):
		return refuse(failure.CodeConfirmationGrantMismatch, "the grant was given for another invocation (other arguments, principal or idempotency key)")
	case was != "" && was != e.cfg.Manifest.DeclarationDigest(inv.cmd.Code):
		return refuse(failure.CodeConfirmationDeclarationChanged, "the command's declaration changed since the approval; an approval holds for the declaration it was given under")
	case ch.GetState() == mandatev1.ChallengeState_CHALLENGE_STATE_APPROVED:
		return nil, e.checkPreflight(ctx, inv)
	case ch.GetState() == mandatev1.ChallengeState_CHALLENGE_STATE_PENDING:
		fe := failure.New(StageConfirmation, failure.CodeConfirmationPending, "nobody has decided yet; wait for the approver")
		fe.Retriable, fe.ChallengeID, fe.ApprovalURL = true, ch.GetChallengeId(), ch.GetApprovalUrl()
		continueWith(fe, inv)
		inv.needsApproval = fe
		return nil, nil
	case ch.GetState() == mandatev1.ChallengeState_CHALLENGE_STATE_DECLINED:
		return refuse(failure.CodeConfirmationRefused, "the approver declined this call")
	case ch.GetState() == mandatev1.ChallengeState_CHALLENGE_STATE_EXPIRED:
		return refuse(failure.CodeConfirmationExpired, "nobody decided in time; ask again")
	case ch.GetState() == mandatev1.ChallengeState_CHALLENGE_STATE_REDEEMED:
		return refuse(failure.CodeConfirmationAlreadyRedeemed, "the grant was already used by its call")
	}
	return refuse(failure.CodeConfirmationInvalidState, "the challenge is in no state a call can use")
}
