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
	// UnresolvedUnknowns lists outcome rows that say unknown and that no
	// resolution row answers yet.
	UnresolvedUnknowns(ctx context.Context, olderThan time.Duration, limit int) ([]audit.Stored, error)
}

// Defaults of the receipt reconciler.
const (
	defaultReconcileAfter    = 2 * time.Minute
	defaultReconcileInterval = 30 * time.Second
	reconcileBatch           = 256
)

// Reconcile settles, from their backends' receipts, what the trail leaves
// open: intents without outcome older than ReconcileAfter (their executor
// stopped before recording how the call ended), before the audit service's
// own reconciler would record them unknown — an executed receipt becomes an
// executed outcome row, a not-executed one (fenced: it never will run) a
// failed one; and outcome rows that say unknown because the backend could
// not answer then, which get a resolution row stating the receipt's
// verdict. What a backend still cannot answer is left for a later round. It
// returns how many rows it appended.
func (e *Executor) Reconcile(ctx context.Context) (int, error) {
	if e.cfg.Intents == nil {
		return 0, nil
	}
	settled := 0
	for _, pass := range []struct {
		list  func(context.Context, time.Duration, int) ([]audit.Stored, error)
		after time.Duration
		row   func(in *audit.Stored, r Receipt) (audit.Record, bool)
	}{
		{e.cfg.Intents.PendingIntents, e.cfg.ReconcileAfter, e.outcomeFromReceipt},
		{e.cfg.Intents.UnresolvedUnknowns, e.cfg.ReconcileInterval, e.resolutionFromReceipt},
	} {
		rows, err := pass.list(ctx, pass.after, reconcileBatch)
		if err != nil {
			return settled, err
		}
		for i := range rows {
			in := &rows[i]
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
			rec, ok := pass.row(in, r)
			if !ok {
				continue
			}
			actx, cancel := context.WithTimeout(ctx, e.cfg.OutcomeAttemptTimeout)
			_, err := e.cfg.Audit.Append(actx, rec)
			cancel()
			if err != nil {
				return settled, err
			}
			settled++
			e.log.Info("reconcile: settled from the backend's receipt", "tenant", rec.Tenant, "invocation_id", rec.InvocationID,
				"command", rec.Command, "phase", rec.Phase, "outcome", rec.Outcome)
		}
	}
	return settled, nil
}

// outcomeFromReceipt is the outcome row of an intent its executor left,
// as the receipt r states it.
func (e *Executor) outcomeFromReceipt(in *audit.Stored, r Receipt) (audit.Record, bool) {
	rec := in.Record.Clone()
	rec.Phase, rec.Time, rec.Arguments, rec.Duration = audit.PhaseOutcome, e.cfg.Now(), nil, 0
	if r.Executed {
		output, err := marshalOutput(r.Result)
		if err != nil {
			return rec, false
		}
		rec.Outcome, rec.Stage, rec.Code = audit.OutcomeExecuted, "", ""
		rec.ResultDigest = digest("result", output)
		rec.Message = "recorded from the backend's receipt: the executor stopped before it recorded the outcome"
		return rec, true
	}
	rec.Outcome, rec.Stage, rec.Code = audit.OutcomeFailed, StageDispatch, "handler.not_executed"
	rec.Message = "the executor stopped before it recorded the outcome; the backend's receipt says the call never ran (it is fenced, so it never will)"
	return rec, true
}

// resolutionFromReceipt is the resolution row of an unknown outcome, as
// the receipt r states it.
func (e *Executor) resolutionFromReceipt(in *audit.Stored, r Receipt) (audit.Record, bool) {
	rec := in.Record.Clone()
	rec.Phase, rec.Time, rec.Arguments, rec.Duration, rec.ResultDigest = audit.PhaseResolution, e.cfg.Now(), nil, 0, ""
	rec.UserID, rec.AgentID, rec.Model, rec.ModelVersion, rec.ActorKind = ServiceName, "", "", "", audit.ActorService
	rec.Stage = audit.StageAudit
	if r.Executed {
		output, err := marshalOutput(r.Result)
		if err != nil {
			return rec, false
		}
		rec.Outcome, rec.Code, rec.ResultDigest = audit.OutcomeExecuted, audit.CodeResolvedExecuted, digest("result", output)
		rec.Message = "the backend's receipt says the call ran"
		return rec, true
	}
	rec.Outcome, rec.Code = audit.OutcomeFailed, audit.CodeResolvedNotExecuted
	rec.Message = "the backend's receipt says the call never ran (it is fenced, so it never will)"
	return rec, true
}
