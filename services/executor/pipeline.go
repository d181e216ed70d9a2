package executor

import (
	"context"
	"errors"
)

// A stage is one named step of the pipeline (docs/architecture/pipeline.md).
// It reads and extends the invocation; it returns a result to end the call
// early with success (a replayed response), an error to end it with that
// refusal or fault (already recorded), or neither to hand the call on.
type stage struct {
	name string
	run  func(e *Executor, ctx context.Context, inv *invocation) (*Result, error)
	// settles marks the stage that decides the fate of the call's
	// idempotency reservation itself (dispatch: a call that left for the
	// backend keeps its key, one that provably never ran gives it back).
	// Before it, the chain undoes every reservation when a stage refuses.
	settles bool
	// check is the stage in check mode (Executor.Check): every decision,
	// no effect. nil means run itself has none (it only reads), so it runs
	// as it is; a stage with an effect (a reservation, a challenge, the
	// intent, the dispatch) has a check of its own, which may do nothing.
	check func(e *Executor, ctx context.Context, inv *invocation) (*Result, error)
}

// pipeline is every governed call's chain of stages, in order. The
// constraints on the order (authenticate first, permission before schema
// and before a human is asked, the declared conditions after the arguments
// are decoded and before a human is asked, the declared limits after the
// idempotency key (a replay never spends) and the conditions (a denied
// call never spends) and before a human is asked (a limit may escalate),
// the audit intent right before dispatch) are
// asserted by TestPipelineOrder.
var pipeline = []stage{
	{name: StageAuthenticate, run: (*Executor).authenticate},
	{name: StageRequest, run: (*Executor).requestCheck},
	{name: StageLoad, run: (*Executor).loadDefinition},
	{name: StageEntitlement, run: (*Executor).entitlementCheck},
	{name: StagePermission, run: (*Executor).permissionCheck},
	{name: StageSchema, run: (*Executor).schemaValidate},
	{name: StageScope, run: (*Executor).scopeCheck},
	{name: StageIdempotency, run: (*Executor).idempotencyCheck, check: (*Executor).idempotencyKeyCheck},
	{name: StageSoD, run: (*Executor).sodCheck},
	{name: StageCondition, run: (*Executor).conditionCheck},
	{name: StageBudget, run: (*Executor).budgetCheck, check: (*Executor).budgetVerdict},
	{name: StageConfirmation, run: (*Executor).confirmationCheck, check: (*Executor).confirmationVerdict},
	{name: StageAudit, run: (*Executor).auditIntent, check: skipInCheck},
	{name: StageDispatch, run: (*Executor).dispatch, settles: true, check: skipInCheck},
}

// skipInCheck is the check mode of a stage that is nothing but an effect.
func skipInCheck(*Executor, context.Context, *invocation) (*Result, error) { return nil, nil }

// errNoResult is the chain's answer if its last stage handed the call on,
// which dispatch never does.
var errNoResult = errors.New("executor: the pipeline ended without a result")

// run takes the call through the pipeline. A refusal before the settling
// stage undoes what earlier stages reserved (compensate), so no stage
// releases by hand.
//
// In check mode (inv.checking) each stage runs its check instead, where it
// has one, and a chain that ends without a result found nothing to refuse.
func (e *Executor) run(ctx context.Context, inv *invocation) (*Result, error) {
	for i := range pipeline {
		s := &pipeline[i]
		body := s.run
		if inv.checking {
			if s.check != nil {
				body = s.check
			}
			if _, err := body(e, ctx, inv); err != nil {
				return nil, err
			}
			continue
		}
		res, err := body(e, ctx, inv)
		if err == nil && res == nil {
			continue
		}
		if err != nil && !s.settles {
			inv.compensate(ctx, e)
		}
		return res, err
	}
	if inv.checking {
		return nil, nil
	}
	return nil, errNoResult
}

// onUndo registers what to undo if a later stage, before dispatch, ends
// the call.
func (inv *invocation) onUndo(undo func(ctx context.Context, e *Executor)) {
	inv.undo = append(inv.undo, undo)
}

// compensate runs the registered undo steps, latest first, once.
func (inv *invocation) compensate(ctx context.Context, e *Executor) {
	for i := len(inv.undo) - 1; i >= 0; i-- {
		inv.undo[i](context.WithoutCancel(ctx), e)
	}
	inv.undo = nil
}
