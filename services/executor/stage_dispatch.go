package executor

import (
	"context"
	"errors"
	"strings"

	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
)

// dispatch sends the call to its backend and records how it ended. It
// settles the idempotency reservation itself: a call that left for the
// backend keeps its key (its response, or its failure, is what a retry
// gets), one that provably never ran gives it back, and the grant it
// redeemed with it. What the call spent of its command's limits is given
// back when it provably never ran or its backend refused it; a call that
// ran, failed or whose effect is unknown keeps its spend. An answer lost on the
// way is settled from the backend's receipt, or recorded as unknown.
func (e *Executor) dispatch(ctx context.Context, inv *invocation) (*Result, error) {
	cmd, msg := inv.cmd, inv.req
	deadline := e.deadline(cmd)
	var out Reply
	disp := Dispatch{
		Command: cmd, Method: inv.method, Request: msg, Wire: inv.canon, InvocationID: inv.id,
		IdempotencyKey: inv.call.IdempotencyKey, Deadline: deadline,
	}
	dispatchErr := e.stage(ctx, StageDispatch, func(ctx context.Context) error {
		var err error
		out, err = e.cfg.Dispatcher.Dispatch(ctx, disp)
		return err
	})
	if dispatchErr != nil {
		fe := backendFailure(dispatchErr)
		fe.InvocationID = inv.id
		outcome := contract.OutcomeFailed
		switch {
		case isRefusalStage(fe.Stage) || clientError(fe.Status):
			outcome = contract.OutcomeRefused
			// The backend refused it: nothing was done, so nothing of
			// the command's limits is spent.
			e.refundSpend(ctx, inv)
		case effectUnknown(fe.Code) && !errors.Is(dispatchErr, ErrNotSent):
			// The call left for the backend and no answer came back: the
			// effect may have happened. The backend's receipt says which;
			// without one the trail says unknown, never failed.
			r, known := e.resolve(ctx, disp)
			switch {
			case known && r.Executed:
				out, dispatchErr = Reply{Message: r.Result}, nil
			case known:
				// The backend never ran it, and has fenced the invocation
				// so that it never will: nothing was done, and a retry
				// with the same key may run.
				fe.Message = strings.TrimSuffix(fe.Message, "; the effect is unknown") + "; the backend did not execute the call, nothing was done"
				fe.Retriable, fe.Remedy = true, "retry; the call did not run"
				e.outcomeAsync(ctx, inv, contract.OutcomeFailed, fe.Stage, fe.Code, fe.Message, nil)
				e.releaseKey(context.WithoutCancel(ctx), inv)
				e.releaseGrant(context.WithoutCancel(ctx), inv)
				e.refundSpend(ctx, inv)
				return nil, fe
			default:
				outcome = contract.OutcomeUnknown
				fe.Message = strings.TrimSuffix(fe.Message, "; the effect is unknown") + "; the effect is unknown"
				if inv.idem != nil {
					// With its key a retry is safe: it asks the backend's
					// receipt before anything runs again (recoverKey), so
					// it learns the result or runs the call once.
					fe.Retriable = true
					fe.Remedy = "retry with the same idempotency key: the backend's receipt is asked first, so the call never runs twice"
				}
			}
		}
		if dispatchErr != nil {
			e.outcomeAsync(ctx, inv, outcome, fe.Stage, fe.Code, fe.Message, nil)
			if errors.Is(dispatchErr, ErrNotSent) {
				// Nothing ran: a retry with the same key may run.
				e.releaseKey(context.WithoutCancel(ctx), inv)
				e.releaseGrant(context.WithoutCancel(ctx), inv)
				e.refundSpend(ctx, inv)
				return nil, fe
			}
			e.finish(ctx, inv, Saved{InvocationID: inv.id, Status: statusBytes(fe)}, nil)
			return nil, fe
		}
	}
	output := out.JSON
	if output == nil {
		var err error
		if output, err = marshalOutput(out.Message); err != nil {
			return nil, e.fault(ctx, inv, StageDispatch, failure.CodeHandlerFailed, err)
		}
	}
	e.outcomeAsync(ctx, inv, contract.OutcomeExecuted, "", "", "", output)
	// The intent's place in the chain is not known yet (the relay appends
	// it after the call): the result names its invocation, by which the
	// trail finds its rows (AuditService.Get).
	e.finish(ctx, inv, Saved{InvocationID: inv.id, Output: output}, output)
	return &Result{InvocationID: inv.id, Output: output, Message: out.Message, Wire: out.Wire}, nil
}
