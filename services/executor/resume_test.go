package executor

import (
	"errors"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/protobuf/proto"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/schema"
)

// TestStageSchemaResumes: confirmation_check parks the call whose
// challenge it opens — what schema_validate decided, bound to the
// challenge, the command's declaration, the input as received and the
// invocation digest, for at most MaxParkedFor. schema_validate, given a
// call that carries that grant with the same input, restores exactly what
// the full run decided (the request, its canonical bytes and digest, the
// redacted arguments, the withheld paths, the subject) and marks the
// call's span resumed; in check mode too. A call with a violation the
// channel found is not resumed, and a store that will not park still
// leaves the call refused with confirmation.required.
func TestStageSchemaResumes(t *testing.T) {
	bot := testPrincipal("acme", "carol", "finance-bot")
	refund := func(grant string) Call {
		return Call{Code: "ticket.refund", Input: []byte(refundArgs), Channel: "mcp", GrantID: grant}
	}
	h := newStageHarness(t)
	ctx, asked := h.prepared(t, bot, refund(""), StageConfirmation, false)
	res, err := h.run(t, ctx, asked, StageConfirmation)
	if fe := wantRefusal(t, res, err, asked, StageConfirmation, failure.CodeConfirmationRequired); fe.ChallengeID != "ch-1" {
		t.Fatalf("refusal %+v, want the challenge ch-1", fe)
	}
	p := h.store.parkedCall("acme", "ch-1")
	if p == nil || p.Command != "ticket.refund" || p.DeclarationDigest != h.set.DeclarationDigest("ticket.refund") ||
		p.InputDigest != inputDigest([]byte(refundArgs)) || string(p.Canonical) != string(asked.canon) ||
		p.InvocationDigest != invocationDigest(asked, asked.canon) || p.Arguments != asked.args || p.ArgumentsDigest != asked.argDigest ||
		p.Expires.After(time.Now().Add(MaxParkedFor)) {
		t.Fatalf("parked %+v, want what schema_validate decided for the asked call, bound to it", p)
	}

	for _, checking := range []bool{false, true} {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		ctx := callAs(t, bot)
		ctx, span := tp.Tracer("test").Start(ctx, "mandate.execute")
		inv := h.invocation(refund("ch-1"))
		inv.checking = checking
		h.through(t, ctx, inv, StageSchema)
		h.passes(t, ctx, inv, StageSchema)
		span.End()
		if !inv.resumed || !proto.Equal(inv.req, asked.req) || string(inv.canon) != string(asked.canon) || inv.argDigest != asked.argDigest ||
			inv.args != asked.args || !slices.Equal(inv.withheld, asked.withheld) || inv.subject != asked.subject || inv.subject == "" {
			t.Fatalf("checking=%v: resumed %v, request %v, subject %q: want what the asked call decided", checking, inv.resumed, inv.req, inv.subject)
		}
		attrs := rec.Ended()[0].Attributes()
		if !slices.ContainsFunc(attrs, func(a attribute.KeyValue) bool { return string(a.Key) == AttrResumed && a.Value.AsBool() }) {
			t.Errorf("checking=%v: the call's span carries %v, want %s", checking, attrs, AttrResumed)
		}
	}

	t.Run("a violation the channel found is not resumed", func(t *testing.T) {
		c := refund("ch-1")
		c.InputError = &schema.InvalidError{Violations: []schema.Violation{{Pointer: "/7", Rule: "schema.unknown_field", Message: "unknown field number 7"}}}
		ctx, inv := h.prepared(t, bot, c, StageSchema, false)
		res, err := h.run(t, ctx, inv, StageSchema)
		if fe := wantRefusal(t, res, err, inv, StageSchema, failure.CodeSchemaInvalid); len(fe.Violations) != 1 || inv.resumed {
			t.Error("a call with the channel's violation resumed")
		}
	})

	t.Run("parking fails", func(t *testing.T) {
		h := newStageHarness(t)
		h.store.script(func(s *fakeStore) { s.parkErr = errors.New("disk full") })
		ctx, inv := h.prepared(t, bot, refund(""), StageConfirmation, false)
		res, err := h.run(t, ctx, inv, StageConfirmation)
		if fe := wantRefusal(t, res, err, inv, StageConfirmation, failure.CodeConfirmationRequired); fe.ChallengeID != "ch-1" {
			t.Errorf("refusal %+v, want the challenge", fe)
		}
		if p := h.store.parkedCall("acme", "ch-1"); p != nil {
			t.Errorf("parked %+v", p)
		}
		ctx, inv = h.prepared(t, bot, refund("ch-1"), StageSchema, false)
		h.passes(t, ctx, inv, StageSchema)
		if inv.resumed || inv.req == nil {
			t.Error("a call that was never parked resumed")
		}
	})
}
