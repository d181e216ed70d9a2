package mcpbridge_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// TestPlanToolOverMCP (issue 29 §3): an agent lists mandate.plan with its
// tools, and calling it with the real client answers, in
// structuredContent valid for its outputSchema, exactly its other tools
// (the catalog's list for it) with their verdicts: finance-bot's refund
// runs at once unless its arguments ask a human, which its depends_on
// says. Arguments are refused schema.invalid.
func TestPlanToolOverMCP(t *testing.T) {
	e := start(t)
	bot := e.connect(t, token(t, "acme", "carol", "finance-bot"))
	listed := names(t, bot)
	if !slices.Contains(listed, mcpbridge.PlanTool) {
		t.Fatalf("tools %v without %s", listed, mcpbridge.PlanTool)
	}
	res, err := call(t, bot, mcpbridge.PlanTool, `{}`, nil)
	if err != nil || res.IsError {
		t.Fatalf("plan: %v %+v", err, res)
	}
	b, _ := json.Marshal(res.StructuredContent)
	var plan mcpbridge.PlanResult
	if err := json.Unmarshal(b, &plan); err != nil {
		t.Fatal(err)
	}
	var planned []string
	var refund *mcpbridge.PlanItem
	for i, it := range plan.Tools {
		planned = append(planned, it.Tool)
		if it.Tool == "ticket.refund" {
			refund = &plan.Tools[i]
		}
	}
	slices.Sort(planned)
	own := slices.DeleteFunc(slices.Clone(listed), func(n string) bool { return n == mcpbridge.CheckTool || n == mcpbridge.PlanTool })
	if !slices.Equal(planned, own) {
		t.Fatalf("the plan lists %v; the tools are %v", planned, own)
	}
	if refund == nil || refund.Verdict != mcpbridge.VerdictAllowed ||
		!slices.ContainsFunc(refund.DependsOn, func(s string) bool { return strings.Contains(s, "refund-needs-a-human") }) {
		t.Fatalf("the refund in the plan: %+v", refund)
	}
	bad, err := call(t, bot, mcpbridge.PlanTool, `{"tool":"ticket.refund"}`, nil)
	if err != nil || !bad.IsError || !strings.Contains(resultText(bad), "schema.invalid") {
		t.Fatalf("plan with arguments: %v %+v", err, bad)
	}
}

// resultText is a result's text content, joined.
func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text + "\n")
		}
	}
	return b.String()
}
