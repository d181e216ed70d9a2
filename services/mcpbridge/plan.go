package mcpbridge

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/tooldesc"
)

// PlanTool is the bridge's other tool: "what may I do now?" — for each of
// the caller's tools, whether a call runs at once or waits for a human, and
// who approves (ExecutorService.Plan). It is listed with the check tool.
const PlanTool = "mandate.plan"

// PlanResult is the plan tool's structuredContent.
type PlanResult struct {
	Tools []PlanItem `json:"tools"`
}

// PlanItem is one tool of the plan.
type PlanItem struct {
	Tool  string `json:"tool"`
	Title string `json:"title,omitempty"`
	Risk  string `json:"risk"`
	// Verdict is VerdictAllowed or VerdictApprovalRequired.
	Verdict string `json:"verdict"`
	// ApproverPermission, under four eyes, is what the approving user
	// must hold; empty when the caller's user approves.
	ApproverPermission string `json:"approver_permission,omitempty"`
	// DependsOn says in words what a call's arguments decide.
	DependsOn []string `json:"depends_on,omitempty"`
}

// planTool is the plan tool's descriptor.
func planTool() *mcp.Tool {
	notDestructive, closed := false, false
	return &mcp.Tool{
		Name:  PlanTool,
		Title: "What may I do now?",
		Description: "Lists, for each of your other tools, whether a call runs at once or needs a human's approval first (and who approves), " +
			"and what its arguments decide (declared conditions, separation of duties). Read it before planning; ask mandate.check about one exact call. " +
			"Nothing is run, reserved or opened.",
		InputSchema: json.RawMessage(`{"type":"object","additionalProperties":false,"properties":{}}`),
		OutputSchema: json.RawMessage(`{"type":"object","required":["tools"],"properties":{"tools":{"type":"array","items":{"type":"object",` +
			`"required":["tool","risk","verdict"],"properties":{"tool":{"type":"string"},"title":{"type":"string"},"risk":{"type":"string"},` +
			`"verdict":{"type":"string","enum":["allowed","approval_required"]},"approver_permission":{"type":"string"},` +
			`"depends_on":{"type":"array","items":{"type":"string"}}}}}}}`),
		Annotations: &mcp.ToolAnnotations{Title: "What may I do now?", ReadOnlyHint: true, IdempotentHint: true,
			DestructiveHint: &notDestructive, OpenWorldHint: &closed},
		Meta: mcp.Meta{
			tooldesc.MetaRisk: "L0", tooldesc.MetaIdempotent: true, tooldesc.MetaReversible: false,
			tooldesc.MetaSideEffects: []string{}, tooldesc.MetaPermissions: []string{},
			tooldesc.MetaConfirmationRequired: false, tooldesc.MetaSensitiveFields: []string{},
		},
	}
}

// offersPlan reports whether the bridge lists its plan tool: its executor
// plans, and the manifest declares no command of that name.
func (b *Bridge) offersPlan() bool {
	_, plans := b.cfg.Executor.(Planner)
	_, taken := b.cfg.Manifest.ByCode(PlanTool)
	return plans && !taken
}

// plan runs the plan tool for the caller.
func (b *Bridge) plan(ctx context.Context, call toolCall) (*mcp.CallToolResult, error) {
	var args map[string]json.RawMessage
	if len(call.Input) > 0 {
		if err := json.Unmarshal(call.Input, &args); err != nil {
			args = map[string]json.RawMessage{"": nil}
		}
	}
	if len(args) > 0 {
		fe := failure.New(stageSchema, failure.CodeSchemaInvalid, "the plan tool takes no arguments")
		fe.Remedy = "call it with {}"
		return b.refusal(ctx, PlanTool, fe)
	}
	resp, err := b.cfg.Executor.(Planner).Plan(ctx, &mandatev1.PlanRequest{})
	if err != nil {
		return b.refusal(ctx, PlanTool, err)
	}
	out := PlanResult{Tools: []PlanItem{}}
	var text strings.Builder
	for _, c := range resp.GetCommands() {
		item := PlanItem{Tool: c.GetCommand(), Title: c.GetTitle(), Risk: c.GetRisk(), Verdict: VerdictAllowed,
			ApproverPermission: c.GetApproverPermission(), DependsOn: c.GetDependsOn()}
		how := "runs at once"
		if c.GetVerdict() == mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED {
			item.Verdict, how = VerdictApprovalRequired, "needs your user's approval first"
			if p := c.GetApproverPermission(); p != "" {
				how = "needs the approval of another user holding " + p + " first"
			}
		}
		fmt.Fprintf(&text, "%s (%s): %s", item.Tool, item.Risk, how)
		if len(item.DependsOn) > 0 {
			text.WriteString("; " + strings.Join(item.DependsOn, "; "))
		}
		text.WriteString(".\n")
		out.Tools = append(out.Tools, item)
	}
	body, err := json.Marshal(out)
	if err != nil {
		return b.refusal(ctx, PlanTool, failure.Internal(stageDispatch, err))
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: strings.TrimSpace(text.String())}, &mcp.TextContent{Text: string(body)}},
		StructuredContent: json.RawMessage(body),
	}, nil
}
