package executor

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/schema"
)

// TestStageSchema runs schema_validate alone. Valid arguments are handed
// on decoded, with what later stages and the audit rows carry: the
// canonical bytes (the same for the same arguments however the JSON orders
// them) and their digest, the arguments with the sensitive fields
// withheld, and the subject. A rule the arguments break, an unknown
// field, input that is no JSON object, and a violation the channel found
// while decoding are refused with schema.invalid and the violations'
// pointers and rules — and nothing derived from the refused arguments is
// kept for the rows.
func TestStageSchema(t *testing.T) {
	carol := testPrincipal("acme", "carol", "")
	refund := func(input string) Call { return Call{Code: "ticket.refund", Input: []byte(input), Channel: "grpc"} }

	t.Run("valid arguments", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, carol, refund(refundArgs), StageSchema, false)
		h.passes(t, ctx, inv, StageSchema)
		if inv.req == nil || inv.req.Descriptor().FullName() != inv.method.Input().FullName() {
			t.Fatalf("decoded %v, want a %s", inv.req, inv.method.Input().FullName())
		}
		canon, err := proto.MarshalOptions{Deterministic: true}.Marshal(inv.req)
		if err != nil {
			t.Fatal(err)
		}
		if string(inv.canon) != string(canon) || inv.argDigest != digest("ticket.refund", canon) {
			t.Errorf("canonical bytes or digest do not match the request: digest %s", inv.argDigest)
		}
		if strings.Contains(inv.args, "CH4242424242") || !strings.Contains(inv.args, `"cardholder_reference":"[withheld]"`) ||
			!strings.Contains(inv.args, "T-1001") {
			t.Errorf("arguments for the rows %s, want the cardholder reference withheld and the rest kept", inv.args)
		}
		if inv.subject != "T-1001" {
			t.Errorf("subject %q, want the ticket T-1001", inv.subject)
		}

		reordered := `{"cardholder_reference":"CH4242424242","reason":"Customer was charged twice","amount":{"amount_minor":"2500","currency_code":"EUR"},"ticket_id":"T-1001"}`
		ctx, again := h.prepared(t, carol, refund(reordered), StageSchema, false)
		h.passes(t, ctx, again, StageSchema)
		if again.argDigest != inv.argDigest {
			t.Errorf("the same arguments in another order have another digest: %s, %s", again.argDigest, inv.argDigest)
		}
	})

	violations := func(want ...failure.Violation) func(*testing.T, *stageHarness, *invocation, *failure.Error) {
		return func(t *testing.T, _ *stageHarness, inv *invocation, fe *failure.Error) {
			for _, w := range want {
				found := false
				for _, v := range fe.Violations {
					found = found || (v.Pointer == w.Pointer && v.Rule == w.Rule)
				}
				if !found {
					t.Errorf("violations %+v lack %s breaking %s", fe.Violations, w.Pointer, w.Rule)
				}
			}
			if inv.argDigest != "" || inv.args != "" || inv.canon != nil || inv.subject != "" {
				t.Errorf("refused arguments left a digest %q, arguments %q or a subject %q for the rows", inv.argDigest, inv.args, inv.subject)
			}
		}
	}
	stageRefuses(t, StageSchema, []stageRefusal{
		{name: "a rule broken", p: carol, call: refund(strings.Replace(refundArgs, `"2500"`, `"0"`, 1)),
			stage: StageSchema, code: failure.CodeSchemaInvalid,
			check: violations(failure.Violation{Pointer: "/amount/amount_minor", Rule: "int64.gt_lte"})},
		{name: "unknown field", p: carol, call: refund(`{"bogus":1}`),
			stage: StageSchema, code: failure.CodeSchemaInvalid,
			check: violations(failure.Violation{Pointer: "/bogus", Rule: "schema.unknown_field"}, failure.Violation{Pointer: "/cardholder_reference", Rule: "required"})},
		{name: "not JSON", p: carol, call: refund(`{`),
			stage: StageSchema, code: failure.CodeSchemaInvalid, check: violations(failure.Violation{Rule: "schema.syntax"})},
		{name: "not an object", p: carol, call: refund(`[]`),
			stage: StageSchema, code: failure.CodeSchemaInvalid, check: violations(failure.Violation{Rule: "schema.type"})},
		{name: "violation the channel found", p: carol,
			call: func() Call {
				c := refund(refundArgs)
				c.InputError = &schema.InvalidError{Violations: []schema.Violation{{Pointer: "/7", Rule: "schema.unknown_field", Message: "unknown field number 7"}}}
				return c
			}(),
			stage: StageSchema, code: failure.CodeSchemaInvalid,
			check: func(t *testing.T, h *stageHarness, inv *invocation, fe *failure.Error) {
				violations(failure.Violation{Pointer: "/7", Rule: "schema.unknown_field"})(t, h, inv, fe)
				if len(fe.Violations) != 1 || inv.req != nil {
					t.Errorf("the input was decoded despite the channel's violation: %+v, %v", fe.Violations, inv.req)
				}
			}},
	})
}
