package executor

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
)

// IntentSource lists the rows the trail leaves open: intents without an
// outcome row (calls whose executor stopped before it recorded how they
// ended) and, with unknown_outcomes, outcome rows that say unknown and that
// no resolution row answers yet. It is the part of the audit service's API
// the reconciler uses (AuditService.PendingIntents), called on the
// executor's own authority.
type IntentSource interface {
	PendingIntents(ctx context.Context, in *mandatev1.PendingIntentsRequest, opts ...grpc.CallOption) (*mandatev1.PendingIntentsResponse, error)
}

// Defaults of the receipt reconciler. The audit service's own reconciler,
// which records what is still open as unknown, waits longer by default
// (audit.DefaultReconcileAfter, 15m): an executor settles an intent from
// its receipt first, and a retry that finds the intent's key abandoned
// settles it at once (recoverKey).
const (
	DefaultReconcileAfter    = 2 * time.Minute
	DefaultReconcileInterval = 30 * time.Second
	reconcileBatch           = 256
)

// Reconcile settles, from their backends' receipts, what the trail leaves
// open: intents without outcome older than ReconcileAfter (their executor
// stopped before recording how the call ended), before the audit service's
// own reconciler would record them unknown — an executed receipt becomes an
// executed outcome row, a not-executed one (fenced: it never will run) a
// failed one; and outcome rows that say unknown because the backend could
// not answer then, which get a resolution row stating the receipt's
// verdict. A call the receipt says ran is settled like one that returned
// (its execution, for separation of duties, and its event: settle) before
// its row is appended. What a backend still cannot answer is left for a
// later round. It returns how many rows it appended.
func (e *Executor) Reconcile(ctx context.Context) (int, error) {
	if e.cfg.Intents == nil {
		return 0, nil
	}
	settled := 0
	for _, pass := range []struct {
		unknown bool
		after   time.Duration
	}{
		{false, e.cfg.ReconcileAfter},
		{true, e.cfg.ReconcileInterval},
	} {
		resp, err := e.cfg.Intents.PendingIntents(ctx, &mandatev1.PendingIntentsRequest{
			OlderThan: durationpb.New(pass.after), Limit: reconcileBatch, UnknownOutcomes: pass.unknown,
		})
		if err != nil {
			return settled, err
		}
		waiting, err := e.stillSpooled(ctx, resp.GetRecords())
		if err != nil {
			return settled, err
		}
		for _, in := range resp.GetRecords() {
			if waiting[spooledKey{in.GetTenant(), in.GetInvocationId()}] {
				// Its next row is still in the executor's outbox, on its
				// way to the trail: the call is not lost.
				continue
			}
			cmd, ok := e.cfg.Manifest.ByCode(in.GetCommand())
			if !ok {
				continue
			}
			method, ok := e.cfg.Manifest.Method(cmd.Code)
			if !ok {
				continue
			}
			r, known := e.resolve(ctx, Dispatch{Command: cmd, Method: method, InvocationID: in.GetInvocationId(), Deadline: e.deadline(cmd)})
			if !known {
				continue
			}
			rec, err := e.settleFromReceipt(ctx, in, r)
			if err != nil {
				return settled, err
			}
			if rec != nil {
				settled++
			}
		}
	}
	return settled, nil
}

// spooledKey names a tenant's invocation.
type spooledKey struct{ tenant, invocation string }

// stillSpooled says which of the open rows' invocations have a row still
// in the executor's outbox (Store.Spooling): an intent relayed while its
// outcome waits behind it — the trail was down for longer than
// ReconcileAfter, and the rows keep the time they were made durable — is
// not a call whose executor died.
func (e *Executor) stillSpooled(ctx context.Context, rows []*mandatev1.AuditRecord) (map[spooledKey]bool, error) {
	byTenant := map[string][]string{}
	for _, r := range rows {
		byTenant[r.GetTenant()] = append(byTenant[r.GetTenant()], r.GetInvocationId())
	}
	out := map[spooledKey]bool{}
	for tenant, ids := range byTenant {
		waiting, err := e.cfg.Store.Spooling(ctx, tenant, ids)
		if err != nil {
			return nil, err
		}
		for _, id := range waiting {
			out[spooledKey{tenant, id}] = true
		}
	}
	return out, nil
}

// fromStored is the row to append about the stored row in: its content,
// without its place in the chain, at time now.
func fromStored(in *mandatev1.AuditRecord, phase string, now time.Time) *mandatev1.AuditRecord {
	rec := proto.CloneOf(in)
	rec.Seq, rec.PrevHash, rec.Hash = 0, "", ""
	rec.Phase, rec.Time, rec.ArgumentsJson, rec.Duration = phase, timestamppb.New(now), "", nil
	return rec
}

// outcomeFromReceipt is the outcome row of an intent its executor left,
// as the receipt r states it.
func (e *Executor) outcomeFromReceipt(in *mandatev1.AuditRecord, r Receipt) (*mandatev1.AuditRecord, bool) {
	rec := fromStored(in, contract.PhaseOutcome, e.cfg.Now())
	if r.Executed {
		output, err := marshalOutput(r.Result)
		if err != nil {
			return rec, false
		}
		rec.Outcome, rec.Stage, rec.Code = contract.OutcomeExecuted, "", ""
		rec.ResultDigest = digest("result", output)
		rec.Message = "recorded from the backend's receipt: the executor stopped before it recorded the outcome"
		return rec, true
	}
	rec.Outcome, rec.Stage, rec.Code = contract.OutcomeFailed, StageDispatch, failure.CodeHandlerNotExecuted
	rec.Message = "the executor stopped before it recorded the outcome; the backend's receipt says the call never ran (it is fenced, so it never will)"
	return rec, true
}

// resolutionFromReceipt is the resolution row of an unknown outcome, as
// the receipt r states it.
func (e *Executor) resolutionFromReceipt(in *mandatev1.AuditRecord, r Receipt) (*mandatev1.AuditRecord, bool) {
	rec := fromStored(in, contract.PhaseResolution, e.cfg.Now())
	rec.ResultDigest = ""
	rec.UserId, rec.AgentId, rec.Model, rec.ModelVersion, rec.ActorKind = ServiceName, "", "", "", contract.ActorService
	rec.Stage = contract.StageAudit
	if r.Executed {
		output, err := marshalOutput(r.Result)
		if err != nil {
			return rec, false
		}
		rec.Outcome, rec.Code, rec.ResultDigest = contract.OutcomeExecuted, failure.CodeAuditResolvedExecuted, digest("result", output)
		rec.Message = "the backend's receipt says the call ran"
		return rec, true
	}
	rec.Outcome, rec.Code = contract.OutcomeFailed, failure.CodeAuditResolvedNotExecuted
	rec.Message = "the backend's receipt says the call never ran (it is fenced, so it never will)"
	return rec, true
}
