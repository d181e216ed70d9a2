package executor

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
)

// intentTimeout bounds the intent's write to the executor's store (and
// OutcomeAttemptTimeout, when shorter): a healthy store takes a row in a
// millisecond or two, even under load.
const intentTimeout = 3 * time.Second

// auditIntent makes the intent row durable, right before dispatch, in the
// executor's own store: one insert into its outbox of audit rows (the
// spool), which the relay appends to the trail right after (FlushSpool,
// woken by the insert). It fails closed — when the store does not take
// the row nothing is dispatched, and the refusal itself is spooled or held
// for the trail. The call does not wait for the trail: an audit service
// that is down delays the rows, not the call.
func (e *Executor) auditIntent(ctx context.Context, inv *invocation) (*Result, error) {
	// The intent of a call a declared condition sent to a human says
	// which: the trail records which conditions decided.
	msg := ""
	if r := askedReason(inv); r != "" {
		msg = "confirmed because " + r
	}
	intent := e.record(inv, contract.PhaseIntent, contract.OutcomePending, "", "", msg)
	intent.Time = timestamppb.New(e.cfg.Now())
	if err := e.stage(ctx, StageAudit, func(ctx context.Context) error {
		// Bounded: a store that does not answer (its database hung)
		// refuses the call within seconds instead of holding it for as
		// long as the caller waits. An intent committed after the
		// executor gave up has the refusal's outcome row after it.
		return e.enqueue(ctx, intent, min(e.cfg.OutcomeAttemptTimeout, intentTimeout))
	}); err != nil {
		e.logger(ctx, inv).Error("audit intent could not be made durable; not dispatching", "error", err)
		fe := failure.Wrap(StageAudit, failure.CodeAuditUnavailable, "the call's audit intent could not be recorded, so nothing was run", err)
		fe.Retriable, fe.Remedy, fe.InvocationID = true, "retry later", inv.id
		inv.ending = ending{outcome: contract.OutcomeFailed, stage: StageAudit, code: failure.CodeAuditUnavailable}
		e.spool(ctx, inv, e.record(inv, contract.PhaseOutcome, contract.OutcomeFailed, StageAudit, failure.CodeAuditUnavailable, fe.Message))
		return nil, fe
	}
	inv.intended = true
	return nil, nil
}
