package executor

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/schema"
)

// A call that confirmation_check refuses with confirmation.required is
// parked: what schema_validate decided for it (the canonical bytes, the
// redacted arguments, the digests) is kept in the executor's store under
// the challenge, and the approved call — the same input sent again with
// the grant — resumes from it instead of decoding, validating, encoding
// and redacting the arguments again. Every other stage runs again
// (docs/architecture/confirmation.md, "An approved call resumes").

// parkTimeout bounds the write of a parked call: it is on the refusal's
// path, and a store that does not take it in time costs the approved call
// a full run, nothing more.
const parkTimeout = time.Second

// AttrResumed is the attribute the span of an approved call that resumed
// from its parked arguments carries (true).
const AttrResumed = "mandate.resumed"

// inputDigest fingerprints a call's input exactly as received.
func inputDigest(input []byte) string { return digest("mandate.input.v1", input) }

// park keeps what the argument stages decided for inv, whose challenge ch
// was just opened for invocation digest d. A failure is logged: the
// approved call then runs in full.
func (e *Executor) park(ctx context.Context, inv *invocation, ch *mandatev1.Challenge, d string) {
	if inv.req == nil || inv.call.InputError != nil || ch.GetChallengeId() == "" {
		return
	}
	now := e.cfg.Now()
	expires := now.Add(MaxParkedFor)
	if t := ch.GetExpiresAt(); t != nil && t.IsValid() {
		expires = ParkedUntil(t.AsTime(), now)
	}
	p := Parked{
		Tenant: inv.p.Tenant, ChallengeID: ch.GetChallengeId(), Command: inv.cmd.Code,
		DeclarationDigest: e.cfg.Manifest.DeclarationDigest(inv.cmd.Code), InputDigest: inputDigest(inv.call.Input),
		Canonical: inv.canon, Arguments: inv.args, Withheld: inv.withheld, ArgumentsDigest: inv.argDigest,
		InvocationDigest: d, Expires: expires,
	}
	if p.Size() > MaxParkedBytes {
		e.logger(ctx, inv).Info("the call is too large to park; its approved call will run in full", "challenge_id", p.ChallengeID, "bytes", p.Size())
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), parkTimeout)
	defer cancel()
	if err := e.cfg.Store.Park(ctx, p); err != nil {
		e.logger(ctx, inv).Warn("parking a call that needs confirmation failed; its approved call will run in full", "challenge_id", p.ChallengeID, "error", err)
	}
}

// resume restores, for a call that carries a grant, what schema_validate
// decided when the call was parked, and reports whether it did: only from
// an unexpired record of the same tenant and challenge, command and
// declaration, for the same input bytes and the same invocation digest
// (recomputed from the parked bytes with this call's principal and key, so
// that no other user, agent or key rides on the parked state). Anything
// else — no record, another input, a store that cannot be read, bytes that
// do not decode — and the stage decodes the input as for any call.
func (e *Executor) resume(ctx context.Context, inv *invocation) bool {
	p, err := e.cfg.Store.Parked(ctx, inv.p.Tenant, inv.call.GrantID)
	if err != nil {
		e.logger(ctx, inv).Warn("reading the parked call of a grant failed; the call runs in full", "challenge_id", inv.call.GrantID, "error", err)
		return false
	}
	if p == nil || p.Command != inv.cmd.Code || p.DeclarationDigest != e.cfg.Manifest.DeclarationDigest(inv.cmd.Code) ||
		p.InputDigest != inputDigest(inv.call.Input) || p.InvocationDigest != invocationDigest(inv, p.Canonical) {
		return false
	}
	req := dynamicpb.NewMessage(inv.method.Input())
	if err := schema.Unmarshal(proto.UnmarshalOptions{Resolver: e.cfg.Manifest.Types(), AllowPartial: true}, p.Canonical, req); err != nil {
		e.logger(ctx, inv).Warn("the parked call of a grant does not decode; the call runs in full", "challenge_id", inv.call.GrantID, "error", err)
		return false
	}
	inv.req, inv.canon, inv.argDigest = req, p.Canonical, p.ArgumentsDigest
	inv.args, inv.withheld = p.Arguments, p.Withheld
	inv.subject = subjectOf(req, inv.cmd.SubjectField)
	inv.resumed = true
	e.metrics.resumed.Add(ctx, 1, e.metrics.resumedAttrs(inv.cmd.Code))
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attribute.Bool(AttrResumed, true))
	}
	e.logger(ctx, inv).Info("the approved call resumes from its parked arguments", "challenge_id", inv.call.GrantID)
	return true
}

// unpark drops the parked call of the grant inv redeemed, after the reply:
// the grant is spent, and the record holds the arguments as sent.
func (e *Executor) unpark(ctx context.Context, inv *invocation) {
	tenant, challenge := inv.p.Tenant, inv.call.GrantID
	ctx = context.WithoutCancel(ctx)
	e.afterReply(func() {
		ctx, cancel := context.WithTimeout(ctx, parkTimeout)
		defer cancel()
		if err := e.cfg.Store.Unpark(ctx, tenant, challenge); err != nil {
			e.logger(ctx, inv).Warn("dropping the parked call of a redeemed grant failed; it is purged when it expires", "challenge_id", challenge, "error", err)
		}
	})
}
