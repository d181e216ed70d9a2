package executor

import (
	"context"
	"time"

	"github.com/mandate-dev/mandate/services/audit"
)

// IntentSource lists the intent rows that have no outcome row: calls whose
// executor stopped before it recorded how they ended. The audit service's
// gRPC client is one (AuditService.PendingIntents).
type IntentSource interface {
	PendingIntents(ctx context.Context, olderThan time.Duration, limit int) ([]audit.Stored, error)
}

// Defaults of the receipt reconciler.
const (
	defaultReconcileAfter    = 2 * time.Minute
	defaultReconcileInterval = 30 * time.Second
	reconcileBatch           = 256
)

// Reconcile settles the intents without outcome older than ReconcileAfter
// from their backends' receipts, before the audit service's own reconciler
// would record them unknown: an executed receipt becomes an executed
// outcome row (with the result's digest), a not-executed one (the backend
// fenced the invocation, so it never will run) a failed outcome that says
// nothing was done. An intent whose backend cannot answer is left for a
// later round. It returns how many it settled.
func (e *Executor) Reconcile(ctx context.Context) (int, error) {
	if e.cfg.Intents == nil {
		return 0, nil
	}
	intents, err := e.cfg.Intents.PendingIntents(ctx, e.cfg.ReconcileAfter, reconcileBatch)
	if err != nil {
		return 0, err
	}
	settled := 0
	for i := range intents {
		in := &intents[i]
		cmd, ok := e.cfg.Manifest.ByCode(in.Command)
		if !ok {
			continue
		}
		method, ok := e.cfg.Manifest.Method(cmd.Code)
		if !ok {
			continue
		}
		r, known := e.resolve(ctx, Dispatch{Command: cmd, Method: method, InvocationID: in.InvocationID, Deadline: e.deadline(cmd)})
		if !known {
			continue
		}
		rec := in.Record.Clone()
		rec.Phase, rec.Time, rec.Arguments, rec.Duration = audit.PhaseOutcome, e.cfg.Now(), nil, 0
		if r.Executed {
			output, err := marshalOutput(r.Result)
			if err != nil {
				continue
			}
			rec.Outcome, rec.Stage, rec.Code = audit.OutcomeExecuted, "", ""
			rec.ResultDigest = digest("result", output)
			rec.Message = "recorded from the backend's receipt: the executor stopped before it recorded the outcome"
		} else {
			rec.Outcome, rec.Stage, rec.Code = audit.OutcomeFailed, StageDispatch, "handler.not_executed"
			rec.Message = "the executor stopped before it recorded the outcome; the backend's receipt says the call never ran (it is fenced, so it never will)"
		}
		actx, cancel := context.WithTimeout(ctx, e.cfg.OutcomeAttemptTimeout)
		_, err := e.cfg.Audit.Append(actx, rec)
		cancel()
		if err != nil {
			return settled, err
		}
		settled++
		e.log.Info("reconcile: intent settled from its receipt", "tenant", rec.Tenant, "invocation_id", rec.InvocationID,
			"command", rec.Command, "outcome", rec.Outcome)
	}
	return settled, nil
}
