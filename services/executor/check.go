package executor

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/codes"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
)

// Verdict is what a check found a call would meet.
type Verdict struct {
	// CheckID is the check's own invocation id, its audit row's.
	CheckID string
	Verdict mandatev1.Verdict
	// Reason is the refusal (VERDICT_REFUSED) or the confirmation the call
	// needs (VERDICT_APPROVAL_REQUIRED); nil when it is allowed.
	Reason *failure.Error
	// Limits are the command's declared limits that count the call, as
	// budget_check found them (nothing spent); nil when none does or the
	// check ended before budget_check.
	Limits []LimitBalance
}

// Check takes the call through the pipeline in check mode: every stage
// decides as it would for the call, and none has an effect — no key
// reserved, no challenge opened, no grant redeemed, no intent, no
// dispatch (each stage's check, docs/architecture/pipeline.md). The check
// leaves one audit row of its own, phase check, whose outcome is the
// verdict. The error is only for a check that could not be made.
func (e *Executor) Check(ctx context.Context, call Call) (*Verdict, error) {
	ctx, inv, span := e.begin(ctx, call, "mandate.check")
	defer span.End()
	inv.checking = true
	_, err := e.run(ctx, inv)
	v := &Verdict{CheckID: inv.id, Verdict: mandatev1.Verdict_VERDICT_ALLOWED, Limits: inv.balances}
	outcome, stage, code, msg := contract.OutcomeAllowed, "", "", ""
	var fe *failure.Error
	switch {
	case err != nil && !errors.As(err, &fe):
		// Every stage returns a *failure.Error; anything else is a bug,
		// and no verdict.
		span.SetStatus(codes.Error, failure.CodeInternalError)
		return nil, failure.Internal(failure.StageDecode, err)
	case err != nil:
		v.Verdict, v.Reason = mandatev1.Verdict_VERDICT_REFUSED, fe
		outcome, stage, code, msg = contract.OutcomeRefused, fe.Stage, fe.Code, fe.Message
		if inv.ending.outcome == contract.OutcomeFailed {
			outcome = contract.OutcomeFailed
		}
	case inv.needsApproval != nil:
		na := inv.needsApproval
		v.Verdict, v.Reason = mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED, na
		outcome, stage, code, msg = contract.OutcomeApprovalRequired, na.Stage, na.Code, na.Message
	}
	if v.Reason != nil {
		v.Reason.InvocationID = inv.id
	}
	// Written after the answer, as a dispatched call's outcome is:
	// retried until it lands, spooled when the trail cannot take it.
	rec := e.record(inv, contract.PhaseCheck, outcome, stage, code, msg)
	e.afterReply(func() { e.appendRow(ctx, inv, rec, afterTheReply) })
	return v, nil
}
