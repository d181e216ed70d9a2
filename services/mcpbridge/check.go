package mcpbridge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/tooldesc"
)

// CheckTool is the bridge's own tool: it asks whether a call of another
// tool would pass, without running it (ExecutorService.Check). It is
// listed to every caller who has a tool to check, unless the manifest
// declares a command of that name.
const CheckTool = "mandate.check"

// checkArgs are the check tool's arguments: the call it judges.
type checkArgs struct {
	Tool            string          `json:"tool"`
	Arguments       json.RawMessage `json:"arguments,omitempty"`
	IdempotencyKey  string          `json:"idempotency_key,omitempty"`
	ApprovalGrantID string          `json:"approval_grant_id,omitempty"`
}

// CheckResult is the check tool's structuredContent: the verdict, and
// the refusal the call would meet (refused) or what approving it takes
// (approval_required), with the fields a refusal carries.
type CheckResult struct {
	CheckID string   `json:"check_id"`
	Tool    string   `json:"tool"`
	Verdict string   `json:"verdict"`
	Reason  *Refusal `json:"reason,omitempty"`
}

// Verdicts of CheckResult.
const (
	VerdictAllowed          = "allowed"
	VerdictApprovalRequired = "approval_required"
	VerdictRefused          = "refused"
)

// checkTool is the check tool's descriptor.
func checkTool() *mcp.Tool {
	notDestructive, closed := false, false
	return &mcp.Tool{
		Name:  CheckTool,
		Title: "Would this call pass?",
		Description: "Checks, without running it, whether a call of one of your other tools would pass Mandate's governance: " +
			"authentication, permission, the arguments' schema, the tenant, separation of duties, and whether a human must approve it first (and who). " +
			"It answers allowed, approval_required or refused (with the stage, code and remedy the call itself would get). " +
			"Nothing is run, reserved or opened; the check itself is audited. What the backend would answer about its own state is not known until the call.",
		InputSchema: json.RawMessage(`{"type":"object","additionalProperties":false,"required":["tool"],"properties":{` +
			`"tool":{"type":"string","minLength":1,"maxLength":128,"description":"the name of the tool whose call to check"},` +
			`"arguments":{"type":"object","description":"the arguments the call would send"},` +
			`"idempotency_key":{"type":"string","maxLength":255,"description":"the idempotency key the call would carry"},` +
			`"approval_grant_id":{"type":"string","maxLength":128,"description":"the approved challenge id the call would carry"}}}`),
		OutputSchema: json.RawMessage(`{"type":"object","required":["check_id","tool","verdict"],"properties":{` +
			`"check_id":{"type":"string"},"tool":{"type":"string"},` +
			`"verdict":{"type":"string","enum":["allowed","approval_required","refused"]},` +
			`"reason":{"type":"object","description":"the refusal, or what approving the call takes: code, stage, message, remedy, approver_permission, challenge_id, approval_url"}}}`),
		Annotations: &mcp.ToolAnnotations{Title: "Would this call pass?", ReadOnlyHint: true, IdempotentHint: true,
			DestructiveHint: &notDestructive, OpenWorldHint: &closed},
		// Stated as a command's are: a read, for anyone with a tool.
		Meta: mcp.Meta{
			tooldesc.MetaRisk: "L0", tooldesc.MetaIdempotent: true, tooldesc.MetaReversible: false,
			tooldesc.MetaSideEffects: []string{}, tooldesc.MetaPermissions: []string{},
			tooldesc.MetaConfirmationRequired: false, tooldesc.MetaSensitiveFields: []string{},
		},
	}
}

// offersCheck reports whether the bridge lists its check tool: its
// executor checks calls, and the manifest declares no command of that name.
func (b *Bridge) offersCheck() bool {
	_, checks := b.cfg.Executor.(Checker)
	_, taken := b.cfg.Manifest.ByCode(CheckTool)
	return checks && !taken
}

// check runs the check tool: the call it names goes to
// ExecutorService.Check with what the real call would carry. A refusal of
// the checked call is the verdict, not an error; the result is isError only
// when no verdict was reached (arguments of the wrong shape, a caller the
// executor does not accept).
func (b *Bridge) check(ctx context.Context, call toolCall) (*mcp.CallToolResult, error) {
	var args checkArgs
	dec := json.NewDecoder(bytes.NewReader(call.Input))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&args); err != nil || args.Tool == "" {
		fe := failure.New(stageSchema, failure.CodeSchemaInvalid, "the arguments break the check tool's schema: {\"tool\": name, \"arguments\": {…}}")
		fe.Remedy = "name the tool to check in tool, and its arguments in arguments"
		return b.refusal(ctx, CheckTool, fe)
	}
	input := []byte(args.Arguments)
	if s := bytes.TrimSpace(input); len(s) == 0 || string(s) == "null" {
		input = []byte("{}")
	}
	// The checked call carries what the real one would: the key, the
	// grant, and what the bridge relays of this call (its session, the
	// attributes it found malformed).
	req := toolCall{Code: args.Tool, Input: input, IdempotencyKey: args.IdempotencyKey, GrantID: args.ApprovalGrantID,
		ConversationID: call.ConversationID, MCPSessionID: call.MCPSessionID, Invalid: call.Invalid}.request()
	req.ResultAsJson = false
	resp, err := b.cfg.Executor.(Checker).Check(ctx, req)
	if err != nil {
		return b.refusal(ctx, CheckTool, err)
	}
	out := CheckResult{CheckID: resp.GetCheckId(), Tool: args.Tool}
	var text string
	switch resp.GetVerdict() {
	case mandatev1.Verdict_VERDICT_ALLOWED:
		out.Verdict = VerdictAllowed
		text = fmt.Sprintf("%s would run: nothing in its governance refuses it, and no human needs to approve it.", args.Tool)
	case mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED:
		out.Verdict = VerdictApprovalRequired
		text = fmt.Sprintf("%s needs a human's approval before it runs: %s.", args.Tool, resp.GetReason().GetRemedy())
	default:
		out.Verdict = VerdictRefused
		text = fmt.Sprintf("%s would be refused at %s: %s (%s).", args.Tool, resp.GetReason().GetStage(), resp.GetReason().GetMessage(), resp.GetReason().GetCode())
		if r := resp.GetReason().GetRemedy(); r != "" {
			text += " Remedy: " + r + "."
		}
	}
	if ce := resp.GetReason(); ce != nil {
		out.Reason = checkRefusal(ce)
	}
	body, err := json.Marshal(out)
	if err != nil {
		return b.refusal(ctx, CheckTool, failure.Internal(stageDispatch, err))
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: text}, &mcp.TextContent{Text: string(body)}},
		StructuredContent: json.RawMessage(body),
		Meta:              mcp.Meta{MetaInvocation: out.CheckID},
	}, nil
}

// checkRefusal is a CommandError as a Refusal.
func checkRefusal(ce *mandatev1.CommandError) *Refusal {
	r := &Refusal{
		Code: ce.GetCode(), Stage: ce.GetStage(), Message: ce.GetMessage(), Retriable: ce.GetRetriable(), Remedy: ce.GetRemedy(),
		InvocationID: ce.GetInvocationId(), ChallengeID: ce.GetChallengeId(), ApprovalURL: ce.GetApprovalUrl(),
		GrantIn: ce.GetGrantIn(), GrantName: ce.GetGrantName(), ApproverPermission: ce.GetApproverPermission(),
	}
	for _, v := range ce.GetViolations() {
		r.Violations = append(r.Violations, Violation{Pointer: v.GetPointer(), Rule: v.GetRule(), Detail: v.GetMessage()})
	}
	return r
}
