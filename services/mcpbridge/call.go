package mcpbridge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"unsafe"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/callattr"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/schema"
)

// MetaRefusal is the `_meta` key of an isError tool result that holds its
// Refusal; MetaInvocation names the invocation of every tool result.
const (
	MetaRefusal    = "mandate.dev/refusal"
	MetaInvocation = "mandate.dev/invocation_id"
)

// Refusal is what an isError tool result says, in `_meta` under
// MetaRefusal and as JSON in its second text block: the same code string as
// the gRPC status and the REST problem body (docs/architecture/pipeline.md). It is never the
// result's structuredContent, which clients validate against the tool's
// outputSchema — a refusal is not the tool's output.
type Refusal struct {
	Code         string `json:"code"`
	Stage        string `json:"stage,omitempty"`
	Message      string `json:"message"`
	Retriable    bool   `json:"retriable"`
	Remedy       string `json:"remedy,omitempty"`
	InvocationID string `json:"invocation_id,omitempty"`
	ChallengeID  string `json:"challenge_id,omitempty"`
	ApprovalURL  string `json:"approval_url,omitempty"`
	// GrantIn and GrantName say how to send the call again once approved
	// (over MCP: `_meta`, mandate.dev/approval); ApproverPermission, under
	// four eyes, what the approving user must hold.
	GrantIn            string      `json:"grant_in,omitempty"`
	GrantName          string      `json:"grant_name,omitempty"`
	ApproverPermission string      `json:"approver_permission,omitempty"`
	Violations         []Violation `json:"violations,omitempty"`
	// RetryAfter, for a retriable refusal that says when (rate.limited,
	// budget.exhausted, …), is how many whole seconds to wait: the REST
	// Retry-After and retry_after, the gRPC RetryInfo.
	RetryAfter int `json:"retry_after,omitempty"`
}

// Violation is one broken input rule of a schema.invalid refusal.
type Violation struct {
	Pointer string `json:"pointer"`
	Rule    string `json:"rule"`
	Detail  string `json:"detail"`
}

// toolCall is one tools/call as the bridge relays it to the executor.
type toolCall struct {
	// Code is the tool's name, the command code.
	Code string
	// Input is the arguments as the client sent them ({} when absent).
	Input []byte
	// IdempotencyKey, GrantID and ConversationID come from `_meta`.
	IdempotencyKey string
	GrantID        string
	ConversationID string
	// MCPSessionID is the session the call came on.
	MCPSessionID string
	// Invalid are attributes of the call the bridge found malformed, and
	// InputError what it found wrong with the input: the executor refuses
	// such a call, and audits it.
	Invalid    []callattr.Invalid
	InputError *schema.InvalidError
}

// callResult is what the executor answered to a call it ran.
type callResult struct {
	InvocationID string
	Output       []byte
}

// execute runs c through the executor for the caller in ctx. The input
// travels as the JSON it is (input_json), which the executor's strict
// decoder refuses (and audits) unless it is an object; what the bridge
// found wrong travels in ExecuteRequest.relayed, which the executor honours
// only on calls the bridge relays. Refusals are the executor's status
// errors.
func (b *Bridge) execute(ctx context.Context, c toolCall) (callResult, error) {
	resp, err := b.cfg.Executor.Execute(ctx, c.request())
	if err != nil {
		return callResult{}, err
	}
	out := resp.GetResultJson()
	if out == nil {
		// An executor that predates result_as_json answers with a Struct.
		if out, err = json.Marshal(resp.GetResult().AsMap()); err != nil {
			return callResult{}, failure.Internal(stageDispatch, err)
		}
	}
	return callResult{InvocationID: resp.GetInvocationId(), Output: out}, nil
}

// request is the ExecuteRequest of c: its input as JSON (none when the
// bridge could not read it), and what the executor honours only from the
// bridge in relayed — the call's MCP session, the input's violations and
// the attributes the bridge found malformed.
func (c toolCall) request() *mandatev1.ExecuteRequest {
	req := &mandatev1.ExecuteRequest{
		Code: c.Code, InputJson: c.Input, IdempotencyKey: c.IdempotencyKey,
		ApprovalGrantId: c.GrantID, ConversationId: c.ConversationID,
		ResultAsJson: true,
	}
	r := &mandatev1.Relayed{McpSessionId: c.MCPSessionID}
	if c.InputError != nil {
		req.InputJson = nil
		for _, v := range c.InputError.Violations {
			r.InputViolations = append(r.InputViolations, &mandatev1.Violation{Pointer: v.Pointer, Rule: v.Rule, Message: v.Message})
		}
	}
	for _, inv := range c.Invalid {
		r.InvalidAttributes = append(r.InvalidAttributes, &mandatev1.InvalidAttribute{Name: inv.Name, Rule: inv.Rule, Reason: inv.Reason, Value: inv.Value})
	}
	if r.McpSessionId != "" || len(r.InputViolations) > 0 || len(r.InvalidAttributes) > 0 {
		req.Relayed = r
	}
	return req
}

// callTool runs tools/call for any published command, listed for the
// caller or not: the executor decides, refuses and audits. It never returns
// a plain Go error (the SDK would send it with code 0). A W3C traceparent
// in `_meta` parents the call's span (trace.go), so the executor's spans
// and audit rows carry the client's trace id.
func (b *Bridge) callTool(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	if req == nil || req.Params == nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "missing params"}
	}
	name := req.Params.Name
	_, known := b.cfg.Manifest.ByCode(name)
	if cmd, ok := b.cfg.Manifest.ByCode(name); ok && !cmd.Published() {
		known = false
	}
	var ti = req.Extra
	if ti == nil || ti.TokenInfo == nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "request is not authenticated"}
	}
	ctx, p, ok := withCaller(ctx, ti.TokenInfo)
	if !ok {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "request is not authenticated"}
	}
	ctx, span := b.startCallSpan(ctx, req)
	defer span.End()

	input := []byte(req.Params.Arguments)
	if s := bytes.TrimSpace(input); len(s) == 0 || string(s) == "null" {
		input = []byte("{}")
	}
	call := toolCall{Code: name, Input: input}
	meta := req.Params.Meta
	call.IdempotencyKey = metaAttr(meta, MetaIdempotencyKey, callattr.IdempotencyKey, &call)
	call.GrantID = metaAttr(meta, MetaApproval, callattr.ApprovalGrant, &call)
	call.ConversationID = metaAttr(meta, MetaConversation, callattr.Conversation, &call)
	// The trace context parents the bridge's span (which the executor's
	// spans follow); a malformed one is relayed as invalid to be refused.
	for _, tc := range []struct{ key, name string }{{MetaTraceparent, callattr.TraceParent}, {MetaTracestate, callattr.TraceState}} {
		if v := metaAttr(meta, tc.key, tc.name, &call); v != "" {
			if p := callattr.Check(tc.name, v); p != nil {
				call.Invalid = append(call.Invalid, *p)
			}
		}
	}
	if req.Session != nil {
		call.MCPSessionID = req.Session.ID()
	}
	if !known && name == CheckTool && b.offersCheck() {
		return b.check(ctx, call)
	}
	if !known && name == PlanTool && b.offersPlan() {
		return b.plan(ctx, call)
	}
	if !known {
		// Not a tool of this server: the executor refuses it at
		// load_definition, so the attempt is audited, and the client gets
		// the JSON-RPC error the protocol prescribes.
		_, _ = b.execute(ctx, call)
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("unknown tool %q", name)}
	}
	if req.Params.RequestState != "" {
		// The retry of an input_required result (2026-07-28 MRTR).
		return b.resume(ctx, req, p, call)
	}
	res, err := b.execute(ctx, call)
	if err != nil {
		if tp := probeOf(ctx); tp != nil {
			// A task-augmented call (tasks.go): the task waits for the
			// confirmation instead of asking for it here (2025-11-25), or
			// after it was asked here (2026, tasks2026.go).
			tp.call, tp.refused = call, err
			if !tp.observe {
				return b.refusal(ctx, call.Code, err)
			}
		}
		return b.confirmation(ctx, req, p, call, err)
	}
	return b.result(ctx, req, call, res), nil
}

// result is the tool result of a call the executor ran: its output as
// structuredContent and a text block, narrated when it is an ops.review
// that asked for narration (narrate.go).
func (b *Bridge) result(ctx context.Context, req *mcp.CallToolRequest, call toolCall, res callResult) *mcp.CallToolResult {
	out := json.RawMessage(res.Output)
	if len(bytes.TrimSpace(out)) == 0 {
		out = json.RawMessage("{}")
	}
	rr := &ranResult{out: out}
	// The text block is the output's bytes as a string, not a copy of
	// them: nothing writes to them once the executor has answered (they
	// are the structuredContent too), so the string stays immutable.
	rr.text.Text = unsafe.String(unsafe.SliceData(out), len(out)) //nolint:gosec // see above: the bytes are never written again
	rr.content[0] = &rr.text
	r := &rr.res
	r.Content = rr.content[:]
	r.StructuredContent = &rr.out // a pointer into rr: boxing the slice header would allocate
	r.Meta = mcp.Meta{MetaInvocation: res.InvocationID}
	if req != nil && wantsNarration(call) {
		b.narrate(ctx, req, r, out)
	}
	return r
}

// ranResult is the tool result of a call the executor ran with the parts
// every such result has, in one allocation instead of four: its output,
// the text block holding it and the one-element content slice.
type ranResult struct {
	res     mcp.CallToolResult
	text    mcp.TextContent
	content [1]mcp.Content
	out     json.RawMessage
}

// refusal turns an executor error into a tool execution error (isError),
// or, for faults that are not the caller's to fix, a JSON-RPC error.
func (b *Bridge) refusal(ctx context.Context, name string, err error) (*mcp.CallToolResult, error) {
	st := failure.ToStatus(err)
	switch st.Code() {
	case codes.Canceled:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "request cancelled"}
	case codes.Internal, codes.Unknown:
		b.log.ErrorContext(ctx, "mcpbridge: tools/call fault", "tool", name, "error", err)
	}
	p := failure.Problem(st, "")
	markRefused(ctx, p.Code)
	r := Refusal{
		Code: p.Code, Stage: p.Stage, Message: p.Detail, Retriable: p.Retriable, Remedy: p.Remedy,
		InvocationID: p.InvocationID, ChallengeID: p.ChallengeID, ApprovalURL: p.ApprovalURL,
		GrantIn: p.GrantIn, GrantName: p.GrantName, ApproverPermission: p.ApproverPermission,
		RetryAfter: p.RetryAfter,
	}
	if r.Message == "" {
		r.Message = p.Title
	}
	for _, v := range p.Errors {
		r.Violations = append(r.Violations, Violation(v))
	}
	body, mErr := json.Marshal(r)
	if mErr != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "encoding refusal"}
	}
	text := fmt.Sprintf("%s refused at %s: %s (%s).", name, r.Stage, r.Message, r.Code)
	if r.Remedy != "" {
		text += " Remedy: " + r.Remedy + "."
	}
	if r.RetryAfter > 0 {
		text += fmt.Sprintf(" Retry after %d seconds.", r.RetryAfter)
	}
	if r.Code == failure.CodeConfirmationRequired && r.ApprovalURL != "" {
		who := "Ask your user to open " + r.ApprovalURL + " and approve it"
		if r.ApproverPermission != "" {
			who = "Another person, who holds " + r.ApproverPermission + " (not your user), must open " + r.ApprovalURL + " and approve it; tell your user so"
		}
		text = fmt.Sprintf("%s needs a human's approval before it runs. %s, "+
			"then call %s again with the same arguments and _meta {%q: %q}.",
			name, who, name, MetaApproval, r.ChallengeID)
	}
	return refusalResult(text, r, body), nil
}

// refusalResult is the isError result of a refusal: a sentence for the
// model, the refusal as JSON text, and the refusal in `_meta` — no
// structuredContent.
func refusalResult(text string, r Refusal, body []byte) *mcp.CallToolResult {
	meta := mcp.Meta{MetaRefusal: json.RawMessage(body)}
	if r.InvocationID != "" {
		meta[MetaInvocation] = r.InvocationID
	}
	return &mcp.CallToolResult{
		IsError: true,
		Content: []mcp.Content{&mcp.TextContent{Text: text}, &mcp.TextContent{Text: string(body)}},
		Meta:    meta,
	}
}

// metaString reads a string `_meta` value; anything else counts as absent.
func metaString(m mcp.Meta, key string) string {
	s, _ := m[key].(string)
	return s
}

// metaAttr reads a string `_meta` value the executor checks. A value of
// any other JSON type is never ignored: it is added to call.Invalid, so the
// executor refuses the call (and audits the attempt).
func metaAttr(m mcp.Meta, key, name string, call *toolCall) string {
	v, ok := m[key]
	if !ok || v == nil {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	raw, _ := json.Marshal(v)
	call.Invalid = append(call.Invalid, *callattr.TypeError(name, string(raw)))
	return ""
}
