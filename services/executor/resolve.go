package executor

import (
	"context"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// Permissions an operator needs to resolve an unknown outcome
// (Executor.Resolve): ResolvePermission to decide, and the audit service's
// audit.read to read the invocation's rows, which the executor fetches on
// the operator's behalf.
const (
	ResolvePermission = "audit.resolve"
	readPermission    = "audit.read"
)

// Verdicts of a resolution and what a receipt said.
const (
	VerdictExecuted    = "executed"
	VerdictNotExecuted = "not_executed"
)

// MaxResolveReason bounds the reason of a resolution, in bytes.
const MaxResolveReason = 500

// TrailReader reads the rows of one invocation (AuditService.Get), on
// behalf of the caller whose token the context carries. The audit
// service's client implements it beside AuditClient; Resolve needs it.
type TrailReader interface {
	Get(ctx context.Context, in *mandatev1.GetRequest, opts ...grpc.CallOption) (*mandatev1.GetResponse, error)
}

// Resolution is an operator's verdict on an invocation whose outcome row
// says unknown.
type Resolution struct {
	InvocationID string
	// Verdict is VerdictExecuted or VerdictNotExecuted.
	Verdict string
	// Reason says why; recorded. One line, see CheckReason.
	Reason string
	// OverrideReceipt records the verdict even where the backend's receipt
	// says the opposite.
	OverrideReceipt bool
}

// Resolved is what a resolution recorded and did.
type Resolved struct {
	// Row is the resolution row as stored.
	Row *mandatev1.AuditRecord
	// Receipt is what the backend's receipt said (VerdictExecuted or
	// VerdictNotExecuted), or "" when the backend could not answer.
	Receipt string
	// Key is "released", "settled" or "none": what became of the call's
	// idempotency key.
	Key string
}

// Resolve records an operator's verdict on an invocation of p's tenant
// whose outcome is unknown, as a resolution row naming p's user, and
// settles the idempotency key the call holds. It is an operator's
// decision, so p must be a user acting directly (no agent, no relaying
// service) who is active and holds ResolvePermission (and audit.read, to
// read the rows). The backend's receipt is asked first: where it answers
// and contradicts the verdict, the resolution is refused
// (audit.contradicts_receipt) unless OverrideReceipt, which the row
// records; where it agrees, the row says so; where the backend cannot
// answer (it keeps no receipts, or is unreachable) the operator's word is
// all there is, and the row says that too.
func (e *Executor) Resolve(ctx context.Context, p identity.Principal, r Resolution) (Resolved, error) {
	if err := e.mayResolve(ctx, p); err != nil {
		return Resolved{}, err
	}
	if r.Verdict != VerdictExecuted && r.Verdict != VerdictNotExecuted {
		return Resolved{}, failure.New(failure.StageSchema, failure.CodeSchemaInvalid, "verdict must be executed or not_executed")
	}
	if err := CheckReason(r.Reason); err != nil {
		return Resolved{}, err
	}
	reader, ok := e.cfg.Audit.(TrailReader)
	if !ok {
		return Resolved{}, failure.New(StageAudit, failure.CodeAuditUnavailable, "this executor cannot read the audit trail")
	}
	resp, err := reader.Get(ctx, &mandatev1.GetRequest{InvocationId: r.InvocationID})
	if err != nil {
		return Resolved{}, err
	}
	var unknown *mandatev1.AuditRecord
	for _, row := range resp.GetRecords() {
		switch {
		case row.GetPhase() == contract.PhaseResolution:
			return Resolved{}, failure.New(StageAudit, failure.CodeAuditNotResolvable,
				"invocation "+r.InvocationID+" was resolved already, by "+row.GetUserId())
		case row.GetPhase() == contract.PhaseOutcome && row.GetOutcome() == contract.OutcomeUnknown:
			unknown = row
		}
	}
	if unknown == nil {
		return Resolved{}, failure.New(StageAudit, failure.CodeAuditNotResolvable,
			"invocation "+r.InvocationID+" has no unknown outcome to resolve")
	}
	receipt, result := e.receiptVerdict(ctx, unknown)
	if receipt != "" && receipt != r.Verdict && !r.OverrideReceipt {
		fe := failure.New(StageAudit, failure.CodeAuditContradictsReceipt,
			"the backend's receipt says the call "+says(receipt)+"; the verdict "+r.Verdict+" contradicts it")
		fe.Remedy, fe.InvocationID = "check the system of record; to record the verdict anyway, resolve again overriding the receipt (recorded)", r.InvocationID
		return Resolved{}, fe
	}

	rec := fromStored(unknown, contract.PhaseResolution, e.cfg.Now())
	rec.ResultDigest = ""
	rec.UserId, rec.AgentId, rec.Model, rec.ModelVersion, rec.ActorKind = p.UserID, "", "", "", contract.ActorUser
	rec.Stage = contract.StageAudit
	var saved *Saved
	if r.Verdict == VerdictExecuted {
		rec.Outcome, rec.Code = contract.OutcomeExecuted, failure.CodeAuditResolvedExecuted
		v := ResolvedExecuted(r.InvocationID, p.UserID, r.Reason)
		saved = &v
	} else {
		rec.Outcome, rec.Code = contract.OutcomeFailed, failure.CodeAuditResolvedNotExecuted
	}
	rec.Message = "resolved by " + p.UserID + " as " + r.Verdict + ": " + r.Reason + "; " + receiptNote(receipt, r.Verdict)
	if r.Verdict == VerdictExecuted {
		// The call ran, on the operator's word: it is settled as one that
		// returned (its execution, for separation of duties, and its
		// event, with the receipt's result where the receipt agrees) before
		// the row that makes the resolution final is appended.
		var output []byte
		if receipt == VerdictExecuted {
			if output, err = marshalOutput(result); err != nil {
				return Resolved{}, failure.Internal(StageAudit, err)
			}
		}
		if run, ok := e.ranOfRow(unknown, output); ok {
			if err := e.settle(ctx, settlement{ran: run}); err != nil {
				e.log.ErrorContext(ctx, "resolve: recording the execution failed; nothing was resolved",
					"tenant", unknown.GetTenant(), "invocation_id", r.InvocationID, "err", err)
				return Resolved{}, failure.Internal(StagePublish, err)
			}
		}
	}
	stored, err := e.append(ctx, rec)
	if err != nil {
		return Resolved{}, err
	}
	// The trail may answer only where it stored the row (AuditStream
	// appends brief): the row is what was sent, at that place.
	out := Resolved{Row: rec, Receipt: receipt, Key: "none"}
	if len(stored) > 0 {
		rec.Seq, rec.Hash = stored[0].GetSeq(), stored[0].GetHash()
		if stored[0].GetPrevHash() != "" {
			rec.PrevHash = stored[0].GetPrevHash()
		}
	}
	held, err := e.cfg.Store.Resolve(ctx, unknown.GetTenant(), r.InvocationID, saved)
	if err != nil {
		e.log.ErrorContext(ctx, "resolve: the resolution is recorded, but settling the idempotency key failed",
			"tenant", unknown.GetTenant(), "invocation_id", r.InvocationID, "err", err)
		return out, failure.Internal(StageIdempotency, err)
	}
	if held {
		out.Key = "released"
		if saved != nil {
			out.Key = "settled"
		}
	}
	e.log.InfoContext(ctx, "resolve: an operator resolved an unknown outcome", "tenant", unknown.GetTenant(),
		"invocation_id", r.InvocationID, "command", unknown.GetCommand(), "by", p.UserID, "verdict", r.Verdict,
		"receipt", receipt, "override_receipt", r.OverrideReceipt, "key", out.Key)
	return out, nil
}

// mayResolve admits an operator: a user acting directly, active, holding
// ResolvePermission and audit.read.
func (e *Executor) mayResolve(ctx context.Context, p identity.Principal) error {
	switch {
	case p.Tenant == "" || p.UserID == "":
		return failure.New(failure.StageAuthenticate, failure.CodeAuthenticationMissingCredentials, "a user's token is needed")
	case p.Kind != identity.KindUser || p.AgentID != "":
		return failure.New(failure.StagePermission, failure.CodeAuthorizationPermissionDenied, "resolving an outcome is an operator's decision: agents never resolve, a human must")
	case p.Via != "":
		return failure.New(failure.StagePermission, failure.CodeAuthorizationPermissionDenied, "resolving an outcome is not relayed: the operator calls the executor directly")
	}
	res, err := e.activeResolution(ctx, p, failure.StagePermission)
	if err != nil {
		return err
	}
	for _, perm := range []string{ResolvePermission, readPermission} {
		if !res.HasPermission(perm) {
			fe := failure.New(failure.StagePermission, failure.CodeAuthorizationPermissionDenied, "resolving an unknown outcome needs "+ResolvePermission+" and "+readPermission)
			fe.Remedy = "ask an operator who holds " + ResolvePermission
			return fe
		}
	}
	return nil
}

// receiptVerdict asks the backend of the unknown row's command whether it
// ran: VerdictExecuted with the call's result, VerdictNotExecuted, or ""
// when it cannot answer.
func (e *Executor) receiptVerdict(ctx context.Context, unknown *mandatev1.AuditRecord) (string, proto.Message) {
	cmd, ok := e.cfg.Manifest.ByCode(unknown.GetCommand())
	if !ok {
		return "", nil
	}
	method, ok := e.cfg.Manifest.Method(cmd.Code)
	if !ok {
		return "", nil
	}
	r, known := e.resolve(ctx, Dispatch{Command: cmd, Method: method, InvocationID: unknown.GetInvocationId(), Deadline: e.deadline(cmd)})
	switch {
	case !known:
		return "", nil
	case r.Executed:
		return VerdictExecuted, r.Result
	}
	return VerdictNotExecuted, nil
}

func says(receipt string) string {
	if receipt == VerdictExecuted {
		return "ran"
	}
	return "never ran (the backend fenced it, so it never will)"
}

// receiptNote is what the row says about the receipt.
func receiptNote(receipt, verdict string) string {
	switch receipt {
	case "":
		return "the backend could not say (no receipt)"
	case verdict:
		return "the backend's receipt agrees"
	}
	return "OVERRIDING the backend's receipt, which says the call " + says(receipt)
}

// CheckReason refuses a reason that is empty, longer than
// MaxResolveReason bytes, not UTF-8, or that holds control characters
// (newlines included) or bidirectional formatting characters: the reason
// is shown in terminals and pages, where such characters can disguise
// what it says.
func CheckReason(reason string) error {
	bad := func(msg string) error {
		fe := failure.New(failure.StageSchema, failure.CodeSchemaInvalid, "reason "+msg)
		fe.Remedy = "give one line of plain text, at most 500 bytes"
		return fe
	}
	switch {
	case strings.TrimSpace(reason) == "":
		return bad("is required")
	case len(reason) > MaxResolveReason:
		return bad("is longer than 500 bytes")
	case !utf8.ValidString(reason):
		return bad("is not valid UTF-8")
	}
	for _, c := range reason {
		if unicode.IsControl(c) || unicode.Is(unicode.Bidi_Control, c) || c == '\u2028' || c == '\u2029' {
			return bad(fmt.Sprintf("holds a control or bidirectional formatting character (U+%04X)", c))
		}
	}
	return nil
}

// Get reads the rows of one invocation through the audit client the
// stream was built on (AuditService.Get, relaying the caller), so that an
// executor whose trail is an AuditStream can Resolve.
func (a *AuditStream) Get(ctx context.Context, in *mandatev1.GetRequest, opts ...grpc.CallOption) (*mandatev1.GetResponse, error) {
	r, ok := a.client.(TrailReader)
	if !ok {
		return nil, failure.New(StageAudit, failure.CodeAuditUnavailable, "this executor cannot read the audit trail")
	}
	return r.Get(ctx, in, opts...)
}

// activeResolution is p's directory resolution, refused at stage when the
// directory does not answer or p is not active (disabled, or its token
// issued before a revocation): the operator's and the plan's check of who
// asks, outside the pipeline.
func (e *Executor) activeResolution(ctx context.Context, p identity.Principal, stage string) (directory.Resolution, error) {
	res, err := e.cfg.Directory.Resolve(ctx, p.Tenant, p.UserID, p.AgentID)
	if err != nil {
		return res, failure.New(stage, failure.CodeDirectoryUnavailable, "the directory is unavailable")
	}
	res = res.Admit(p.IssuedAt)
	if !res.Active {
		return res, failure.New(stage, failure.CodeAuthorizationPrincipalInactive, "the principal is not active ("+res.Reason+")")
	}
	return res, nil
}
