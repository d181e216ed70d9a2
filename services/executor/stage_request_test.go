package executor

import (
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/callattr"
	"github.com/mandate-dev/mandate/internal/failure"
)

// TestStageRequest runs request_check alone. A call whose attributes are
// within their rules, and that names the executor's own manifest, is
// handed on unchanged; a malformed idempotency key is left to
// idempotency_check. A relaying service running another manifest is
// refused with manifest.mismatch (its digest not kept in the call); a
// conversation, grant id or traceparent that breaks its rule, and an
// attribute the channel could not read, are refused with
// request.invalid_metadata, each named by a violation, the value in the
// call replaced by its marked rendering (what the audit row holds); a
// requestState the bridge refused is the confirmation's refusal, at
// confirmation_check with the bridge's code.
func TestStageRequest(t *testing.T) {
	alice := testPrincipal("acme", "alice", "")
	call := func(edit func(c *Call)) Call {
		c := Call{Code: "ticket.search", Input: []byte(searchArgs), Channel: "mcp"}
		if edit != nil {
			edit(&c)
		}
		return c
	}

	t.Run("clean attributes", func(t *testing.T) {
		h := newStageHarness(t)
		c := call(func(c *Call) {
			c.ConversationID, c.MCPSessionID, c.GrantID = "conv-1", "session-1", "ch-1"
			c.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
			c.TraceState = "vendor=value"
			c.ManifestDigest = h.set.Digest()
		})
		inv := h.invocation(c)
		ctx := callAs(t, alice)
		h.through(t, ctx, inv, StageRequest)
		h.passes(t, ctx, inv, StageRequest)
		if inv.call.ConversationID != c.ConversationID || inv.call.MCPSessionID != c.MCPSessionID || inv.call.GrantID != c.GrantID ||
			inv.call.TraceParent != c.TraceParent || inv.call.ManifestDigest != c.ManifestDigest {
			t.Errorf("the call changed: %+v, was %+v", inv.call, c)
		}
	})

	t.Run("idempotency key left to idempotency_check", func(t *testing.T) {
		h := newStageHarness(t)
		inv := h.invocation(call(func(c *Call) {
			c.IdempotencyKey = "bad\x00key"
			c.Invalid = []callattr.Invalid{*callattr.TypeError(callattr.IdempotencyKey, "42")}
		}))
		ctx := callAs(t, alice)
		h.through(t, ctx, inv, StageRequest)
		h.passes(t, ctx, inv, StageRequest)
		if inv.call.IdempotencyKey != "bad\x00key" {
			t.Errorf("request_check rewrote the idempotency key: %q", inv.call.IdempotencyKey)
		}
	})

	violation := func(pointer, rule string) func(*testing.T, *stageHarness, *invocation, *failure.Error) {
		return func(t *testing.T, _ *stageHarness, _ *invocation, fe *failure.Error) {
			if len(fe.Violations) != 1 || fe.Violations[0].Pointer != pointer || fe.Violations[0].Rule != rule {
				t.Errorf("violations %+v, want one at %s breaking %s", fe.Violations, pointer, rule)
			}
		}
	}
	marked := func(pointer, rule string, field func(*invocation) string) func(*testing.T, *stageHarness, *invocation, *failure.Error) {
		return func(t *testing.T, h *stageHarness, inv *invocation, fe *failure.Error) {
			violation(pointer, rule)(t, h, inv, fe)
			if v := field(inv); !strings.HasPrefix(v, "[invalid] ") {
				t.Errorf("the call keeps %q, want the marked rendering", v)
			}
		}
	}
	stageRefuses(t, StageRequest, []stageRefusal{
		{name: "another manifest", p: alice,
			call:  call(func(c *Call) { c.ManifestDigest = "sha256:" + strings.Repeat("0", 64) }),
			stage: StageRequest, code: failure.CodeManifestMismatch,
			check: func(t *testing.T, _ *stageHarness, inv *invocation, fe *failure.Error) {
				if inv.call.ManifestDigest != "" || !strings.Contains(fe.Message, strings.Repeat("0", 64)) {
					t.Errorf("the call kept the digest %q, or the refusal does not name it: %q", inv.call.ManifestDigest, fe.Message)
				}
			}},
		{name: "malformed manifest digest", p: alice,
			call:  call(func(c *Call) { c.ManifestDigest = "md5:\x00" }),
			stage: StageRequest, code: failure.CodeManifestMismatch,
			check: func(t *testing.T, _ *stageHarness, _ *invocation, fe *failure.Error) {
				if strings.Contains(fe.Message, "md5") {
					t.Errorf("the refusal echoes a malformed digest: %q", fe.Message)
				}
			}},
		{name: "conversation with a NUL", p: alice, call: call(func(c *Call) { c.ConversationID = "conv\x00x" }),
			stage: StageRequest, code: failure.CodeRequestInvalidMetadata,
			check: marked("/"+callattr.Conversation, callattr.RuleControl, func(inv *invocation) string { return inv.call.ConversationID })},
		{name: "conversation too long", p: alice, call: call(func(c *Call) { c.ConversationID = strings.Repeat("c", callattr.MaxConversation+1) }),
			stage: StageRequest, code: failure.CodeRequestInvalidMetadata,
			check: marked("/"+callattr.Conversation, callattr.RuleTooLong, func(inv *invocation) string { return inv.call.ConversationID })},
		{name: "grant id that is a path", p: alice, call: call(func(c *Call) { c.GrantID = "../../etc/passwd" }),
			stage: StageRequest, code: failure.CodeRequestInvalidMetadata,
			check: marked("/"+callattr.ApprovalGrant, callattr.RuleFormat, func(inv *invocation) string { return inv.call.GrantID })},
		{name: "MCP session with a bidi override", p: alice, call: call(func(c *Call) { c.MCPSessionID = "a\u202eb" }),
			stage: StageRequest, code: failure.CodeRequestInvalidMetadata,
			check: marked("/"+callattr.MCPSession, callattr.RuleControl, func(inv *invocation) string { return inv.call.MCPSessionID })},
		{name: "malformed traceparent", p: alice, call: call(func(c *Call) { c.TraceParent = "00-not-a-trace" }),
			stage: StageRequest, code: failure.CodeRequestInvalidMetadata,
			check: marked("/"+callattr.TraceParent, callattr.RuleFormat, func(inv *invocation) string { return inv.call.TraceParent })},
		{name: "attribute the channel could not read", p: alice,
			call:  call(func(c *Call) { c.Invalid = []callattr.Invalid{*callattr.TypeError(callattr.Conversation, "42")} }),
			stage: StageRequest, code: failure.CodeRequestInvalidMetadata,
			check: violation("/"+callattr.Conversation, callattr.RuleType)},
		{name: "requestState the bridge refused", p: alice,
			call: call(func(c *Call) {
				c.Invalid = []callattr.Invalid{{Name: callattr.RequestState, Rule: failure.CodeConfirmationExpired, Reason: "the confirmation expired"}}
			}),
			stage: StageConfirmation, code: failure.CodeConfirmationExpired},
	})
}
