package executor

import (
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/callattr"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/manifestcheck"
)

// checkRequest is request_check: the caller's manifest first (a relaying
// service that holds other commands is refused before anything it sent is
// read as this manifest means it), then its attributes.
func (e *Executor) checkRequest(inv *invocation) *failure.Error {
	if fe := manifestcheck.Check(inv.call.ManifestDigest, e.cfg.Manifest.Digest()); fe != nil {
		// Not kept in the call: the refusal's message says it, checked.
		inv.call.ManifestDigest = ""
		return fe
	}
	return checkAttributes(inv)
}

// checkAttributes checks every attribute a caller sent with the
// call is validated before anything else looks at it. A malformed value is
// replaced by its marked rendering in the call, so that the refusal's own
// audit row can hold it. The idempotency key is left to idempotency_check.
func checkAttributes(inv *invocation) *failure.Error {
	var bad []callattr.Invalid
	for _, f := range []struct {
		name string
		v    *string
	}{
		{callattr.Conversation, &inv.call.ConversationID},
		{callattr.MCPSession, &inv.call.MCPSessionID},
		{callattr.ApprovalGrant, &inv.call.GrantID},
		{callattr.TraceParent, &inv.call.TraceParent},
		{callattr.TraceState, &inv.call.TraceState},
	} {
		if p := callattr.Check(f.name, *f.v); p != nil {
			bad = append(bad, *p)
			*f.v = p.Value
		}
	}
	for _, p := range inv.call.Invalid {
		switch p.Name {
		case callattr.IdempotencyKey:
		case callattr.RequestState:
			// The bridge refused an MCP retry's requestState or answer:
			// the refusal is the confirmation's, in the bridge's words.
			spec, ok := failure.Lookup(p.Rule)
			if !ok || !slices.Equal(spec.Stages, []string{StageConfirmation}) {
				// Not a code of the confirmation's own (one the table
				// reports at confirmation_check alone).
				spec, _ = failure.Lookup(failure.CodeConfirmationInvalidState)
			}
			fe := failure.New(StageConfirmation, spec.Code, callattr.Safe(p.Reason, 512))
			fe.Retriable = spec.GRPC == codes.Unavailable
			fe.Remedy = "call the tool again without requestState to get a fresh confirmation"
			return fe
		default:
			bad = append(bad, p)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return invalidAttributes(StageRequest, failure.CodeRequestInvalidMetadata, bad)
}

// checkIdempotencyKey refuses a key that breaks its rules, at
// idempotency_check: before confirmation, so no human approves a call that
// could not be run.
func checkIdempotencyKey(inv *invocation) *failure.Error {
	var bad []callattr.Invalid
	for _, p := range inv.call.Invalid {
		if p.Name == callattr.IdempotencyKey {
			bad = append(bad, p)
		}
	}
	if p := callattr.Check(callattr.IdempotencyKey, inv.call.IdempotencyKey); p != nil {
		bad = append(bad, *p)
	}
	if len(bad) == 0 {
		return nil
	}
	inv.call.IdempotencyKey = ""
	return invalidAttributes(StageIdempotency, failure.CodeIdempotencyInvalidKey, bad)
}

func invalidAttributes(stage, code string, bad []callattr.Invalid) *failure.Error {
	msgs := make([]string, 0, len(bad))
	fe := failure.New(stage, code, "")
	for _, p := range bad {
		msgs = append(msgs, p.Describe()+": "+strconv.Quote(p.Value))
		fe.Violations = append(fe.Violations, failure.Violation{Pointer: "/" + p.Name, Rule: p.Rule, Message: p.Name + " " + p.Reason})
	}
	fe.Message = "the call's " + strings.Join(msgs, "; ")
	fe.Remedy = "send " + bad[0].Name + " within its limits: valid UTF-8 without control or bidi characters, and no longer than the limit"
	return fe
}

// safeRecord is the last line of defence of "every attempt leaves a row":
// whatever a caller or a backend put into a text field, the row keeps a
// marked rendering of it rather than being refused by the audit trail.
func safeRecord(r *mandatev1.AuditRecord) {
	for _, f := range []*string{
		&r.ConversationId, &r.McpSessionId, &r.Subject, &r.UserId, &r.AgentId,
		&r.Model, &r.ModelVersion, &r.TraceId, &r.Stage, &r.Code,
	} {
		*f = callattr.Safe(*f, contract.MaxFieldLen)
	}
	r.Message = safeMessage(r.Message)
	if len(r.ArgumentsJson) > contract.MaxArgumentsLen {
		r.ArgumentsJson = `{"mandate.dev/withheld":"arguments longer than ` + strconv.Itoa(contract.MaxArgumentsLen) +
			` bytes (` + strconv.Itoa(len(r.ArgumentsJson)) + `); their digest is recorded"}`
	}
}

// safeMessage keeps a message readable (newlines and all) but valid UTF-8,
// free of NUL bytes and within the audit trail's limit.
func safeMessage(m string) string {
	m = strings.ReplaceAll(strings.ToValidUTF8(m, "\uFFFD"), "\x00", `\u{0000}`)
	if len(m) <= contract.MaxMessageLen {
		return m
	}
	cut := contract.MaxMessageLen - len("…")
	for cut > 0 && !utf8.RuneStart(m[cut]) {
		cut--
	}
	return m[:cut] + "…"
}

// ResolvedExecuted is the saved response of a key whose call invocation
// an operator resolved as executed (mandate audit resolve), by whom and
// why: a retry replays failure.CodeIdempotencyResolvedExecuted, since the
// call ran and its result was never recorded.
func ResolvedExecuted(invocation, by, reason string) Saved {
	fe := failure.New(StageIdempotency, failure.CodeIdempotencyResolvedExecuted,
		"the call with this idempotency key ("+invocation+") ran, as "+by+" resolved ("+reason+"); its result was never recorded")
	fe.Remedy, fe.InvocationID = "read the effect from the system of record; do not retry", invocation
	return Saved{InvocationID: invocation, Status: statusBytes(fe)}
}
