package executor

import (
	"context"
	"time"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
)

// intentTimeout bounds the intent's append (and OutcomeAttemptTimeout,
// when shorter): a healthy trail takes a row in milliseconds, even
// batched under load.
const intentTimeout = 3 * time.Second

// auditIntent makes the intent row durable, right before dispatch: it
// fails closed — without the row nothing is dispatched, and the refusal
// itself waits in the spool for the trail.
func (e *Executor) auditIntent(ctx context.Context, inv *invocation) (*Result, error) {
	// The intent of a call a declared condition sent to a human says
	// which: the trail records which conditions decided.
	msg := ""
	if r := askedReason(inv); r != "" {
		msg = "confirmed because " + r
	}
	intent := e.record(inv, contract.PhaseIntent, contract.OutcomePending, "", "", msg)
	if err := e.stage(ctx, StageAudit, func(ctx context.Context) error {
		// Bounded as an outcome's attempt is: a trail that does not answer
		// (its database hung) refuses the call within seconds instead of
		// holding it for as long as the caller waits. An intent committed
		// after the executor gave up has the refusal's outcome row after it.
		actx, cancel := context.WithTimeout(ctx, min(e.cfg.OutcomeAttemptTimeout, intentTimeout))
		defer cancel()
		resp, err := e.cfg.Audit.Append(actx, &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{intent}})
		inv.intentRows = resp.GetRecords()
		return err
	}); err != nil {
		e.logger(ctx, inv).Error("audit intent failed; not dispatching", "error", err)
		fe := failure.Wrap(StageAudit, failure.CodeAuditUnavailable, "the audit trail is unavailable, so nothing was run", err)
		fe.Retriable, fe.Remedy, fe.InvocationID = true, "retry later", inv.id
		inv.ending = ending{outcome: contract.OutcomeFailed, stage: StageAudit, code: failure.CodeAuditUnavailable}
		e.spool(ctx, inv, e.record(inv, contract.PhaseOutcome, contract.OutcomeFailed, StageAudit, failure.CodeAuditUnavailable, fe.Message))
		return nil, fe
	}
	return nil, nil
}
