package executor

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/facts"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/schema"
)

// An invocation's call is known to have run in one of four ways: its
// backend answered (dispatch); a retry with its idempotency key asked its
// receipt after it died or its answer was lost (recoverKey); the
// reconciler asked its receipt (Reconcile); or an operator said so
// (Resolve). Each way records the same things through settle: the
// execution that separation of duties is checked against (for a command
// some declaration's separation of duties names, with its subject) and the
// domain event — so that a submit settled by its receipt forbids the same
// user's approve as surely as one that returned normally (issue 31 item 8).
// Two ways may settle one invocation (a retry, then the reconciler): the
// store records an invocation's execution and its event once.

// ran is an invocation whose call ran, as far as the executor's store
// records it.
type ran struct {
	cmd    *manifest.Command
	method protoreflect.MethodDescriptor
	// tenant, user and agent are the invocation's principal.
	tenant, user, agent string
	// subject is the value of the command's subject field in the request.
	subject      string
	invocationID string
	// output is the result as JSON; nil when nobody knows it (an
	// operator's verdict that the backend's receipt did not back): the
	// event then carries no result.
	output []byte
}

// settlement is what settle records in one store transaction.
type settlement struct {
	// key and saved complete the invocation's own idempotency reservation
	// (key nil: none, or settled apart).
	key   *IdemKey
	saved Saved
	// ran is the call that ran (nil: it did not, or nobody knows).
	ran *ran
}

// settle records a settlement: the saved response of the key, and for a
// call that ran and changes something (not a read), its execution and its
// domain event. It is idempotent.
func (e *Executor) settle(ctx context.Context, s settlement) error {
	f := Finish{}
	if s.key != nil {
		f.Key, f.Saved = s.key, s.saved
	}
	if r := s.ran; r != nil && !r.cmd.ReadOnly() {
		// Reads change nothing: no domain event, no history to check
		// separation of duties against.
		now := e.cfg.Now()
		if r.subject != "" && e.sodTargets[r.cmd.Code] {
			f.Execution = &Execution{Tenant: r.tenant, User: r.user, Command: r.cmd.Code, Subject: r.subject, InvocationID: r.invocationID, Time: now}
		}
		var result []byte
		if r.output != nil {
			sensitive := e.facts[r.cmd.Code].outputSensitive
			if _, known := e.facts[r.cmd.Code]; !known {
				sensitive = facts.SensitivePaths(r.method.Output())
			}
			result, _ = schema.Redact(r.output, sensitive)
		}
		f.Event = &Event{Tenant: r.tenant, Command: r.cmd.Code, Subject: r.subject, InvocationID: r.invocationID,
			UserID: r.user, AgentID: r.agent, Result: result, Time: now}
	}
	if f.Key == nil && f.Execution == nil && f.Event == nil {
		return nil
	}
	// Bounded: a caller waits for it, and a store that does not answer
	// (its database hung) leaves the key claimed until its lease ends,
	// when a retry settles it from the backend's receipt.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	return e.cfg.Store.Finish(fctx, f)
}

// finishTimeout bounds saving a call's settlement (Store.Finish).
const finishTimeout = 2 * time.Second

// ranOf is inv's call, which ran and returned output (nil: it did not
// run, or its effect is unknown).
func ranOf(inv *invocation, output []byte) *ran {
	if output == nil {
		return nil
	}
	return &ran{cmd: inv.cmd, method: inv.method, tenant: inv.p.Tenant, user: inv.p.UserID, agent: inv.p.AgentID,
		subject: inv.subject, invocationID: inv.id, output: output}
}

// ranOfRow is the call a stored row of the trail describes (its intent,
// or its outcome), which ran and returned output (nil: unknown); false
// when the row's command is not in the manifest.
func (e *Executor) ranOfRow(row *mandatev1.AuditRecord, output []byte) (*ran, bool) {
	cmd, ok := e.cfg.Manifest.ByCode(row.GetCommand())
	if !ok {
		return nil, false
	}
	method, ok := e.cfg.Manifest.Method(cmd.Code)
	if !ok {
		return nil, false
	}
	return &ran{cmd: cmd, method: method, tenant: row.GetTenant(), user: row.GetUserId(), agent: row.GetAgentId(),
		subject: row.GetSubject(), invocationID: row.GetInvocationId(), output: output}, true
}

// settleFromReceipt closes the trail of the invocation whose open row in
// is — an intent without outcome (its executor stopped first), or an
// outcome that says unknown — as its receipt r says: a call that ran is
// settled first (its execution and event), then the outcome or resolution
// row is appended. Reconcile and a retry that finds the invocation's key
// abandoned (recoverKey) both come here, and may both for one invocation:
// the trail keeps one outcome and one resolution per invocation, and
// settle is idempotent. It returns the appended row, or nil when the
// receipt gives nothing to record.
func (e *Executor) settleFromReceipt(ctx context.Context, in *mandatev1.AuditRecord, r Receipt) (*mandatev1.AuditRecord, error) {
	row := e.outcomeFromReceipt
	if in.GetPhase() == contract.PhaseOutcome {
		row = e.resolutionFromReceipt
	}
	rec, ok := row(in, r)
	if !ok {
		return nil, nil
	}
	if r.Executed {
		output, err := marshalOutput(r.Result)
		if err != nil {
			return nil, err
		}
		if run, ok := e.ranOfRow(in, output); ok {
			if err := e.settle(ctx, settlement{ran: run}); err != nil {
				return nil, err
			}
		}
	}
	actx, cancel := context.WithTimeout(ctx, e.cfg.OutcomeAttemptTimeout)
	defer cancel()
	if _, err := e.append(actx, rec); err != nil {
		return nil, err
	}
	e.log.Info("settled from the backend's receipt", "tenant", rec.GetTenant(), "invocation_id", rec.GetInvocationId(),
		"command", rec.GetCommand(), "phase", rec.GetPhase(), "outcome", rec.GetOutcome())
	return rec, nil
}

// openRowsTimeout bounds how long a retry that found its key's holder dead
// waits to read that invocation's open rows before it answers; without
// them it settles from what it knows itself, and the reconciler closes the
// trail later.
const openRowsTimeout = 2 * time.Second

// intentSource is where the open rows of the trail are read: the
// reconciler's source, or the audit client when it can list them too.
func (e *Executor) intentSource() IntentSource {
	if e.cfg.Intents != nil {
		return e.cfg.Intents
	}
	if s, ok := e.cfg.Audit.(IntentSource); ok {
		return s
	}
	return nil
}

// openRows are the rows of tenant's invocation that the trail leaves open:
// its intent without outcome and its unknown outcome without resolution
// (at most one of them). They are read on the executor's own authority —
// a caller who retries needs no right to read the trail — so the context
// keeps only ctx's trace.
func (e *Executor) openRows(ctx context.Context, tenant, invocationID string) ([]*mandatev1.AuditRecord, error) {
	src := e.intentSource()
	if src == nil {
		return nil, errors.New("executor: this executor cannot list the trail's open rows")
	}
	own := trace.ContextWithSpanContext(context.Background(), trace.SpanContextFromContext(ctx))
	own, cancel := context.WithTimeout(own, min(e.cfg.OutcomeAttemptTimeout, openRowsTimeout))
	defer cancel()
	var rows []*mandatev1.AuditRecord
	for _, unknown := range []bool{false, true} {
		resp, err := src.PendingIntents(own, &mandatev1.PendingIntentsRequest{
			OlderThan: durationpb.New(0), Tenant: tenant, InvocationId: invocationID, UnknownOutcomes: unknown,
		})
		if err != nil {
			return nil, err
		}
		rows = append(rows, resp.GetRecords()...)
	}
	return rows, nil
}

// settleTrail closes the open rows of tenant's invocation from its receipt
// r, in the background (the retry that learnt r answers without waiting
// for the trail); what it cannot append, the reconciler appends at its
// next round.
func (e *Executor) settleTrail(ctx context.Context, rows []*mandatev1.AuditRecord, r Receipt) {
	if len(rows) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for _, in := range rows {
			if _, err := e.settleFromReceipt(ctx, in, r); err != nil {
				e.log.Warn("settling a dead invocation's trail from its receipt failed; the reconciler will",
					"tenant", in.GetTenant(), "invocation_id", in.GetInvocationId(), "error", err)
			}
		}
	}()
}

// PendingIntents lists the trail's open rows through the audit client the
// stream was built on (AuditService.PendingIntents, on the executor's own
// authority), so that a retry can settle a dead invocation's trail at
// once.
func (a *AuditStream) PendingIntents(ctx context.Context, in *mandatev1.PendingIntentsRequest, opts ...grpc.CallOption) (*mandatev1.PendingIntentsResponse, error) {
	s, ok := a.client.(IntentSource)
	if !ok {
		return nil, errors.New("executor: the audit client cannot list pending intents")
	}
	return s.PendingIntents(ctx, in, opts...)
}
