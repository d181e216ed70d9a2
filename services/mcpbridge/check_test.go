package mcpbridge_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// checkOf calls the check tool with args and decodes its structuredContent.
func checkOf(t *testing.T, cs *mcp.ClientSession, args string) mcpbridge.CheckResult {
	t.Helper()
	res, err := call(t, cs, mcpbridge.CheckTool, args, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("the check failed: %+v", res.Content)
	}
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var out mcpbridge.CheckResult
	if err := json.Unmarshal(raw, &out); err != nil || out.CheckID == "" {
		t.Fatalf("structuredContent %s: %v", raw, err)
	}
	return out
}

// TestCheckToolOverMCP: an agent lists the check tool with its own tools
// and asks, before acting, whether a call would pass: a refusal is the
// verdict with the call's stage, code and remedy; a refund is
// approval_required with who approves; a read is allowed. Nothing runs —
// the payment gateway counts no refund and carol has no challenge to
// decide — and each check leaves its own audit row.
func TestCheckToolOverMCP(t *testing.T) {
	e := start(t)
	bot := e.connect(t, token(t, "acme", "carol", "finance-bot"))
	res, err := bot.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var tool *mcp.Tool
	for _, tl := range res.Tools {
		if tl.Name == mcpbridge.CheckTool {
			tool = tl
		}
	}
	if tool == nil || tool.Annotations == nil || !tool.Annotations.ReadOnlyHint || tool.OutputSchema == nil {
		t.Fatalf("the check tool as listed: %+v", tool)
	}

	asks := checkOf(t, bot, `{"tool":"ticket.refund","arguments":`+refundInput+`}`)
	if asks.Verdict != mcpbridge.VerdictApprovalRequired || asks.Reason == nil || asks.Reason.Code != "confirmation.required" ||
		asks.Reason.ChallengeID != "" || !strings.Contains(asks.Reason.Remedy, "approve") {
		t.Fatalf("a refund: %+v %+v", asks, asks.Reason)
	}
	reads := checkOf(t, bot, `{"tool":"ticket.search","arguments":{"query":"charged twice"}}`)
	if reads.Verdict != mcpbridge.VerdictAllowed || reads.Reason != nil {
		t.Fatalf("a search: %+v", reads)
	}
	support := e.connect(t, token(t, "acme", "alice", "support-bot"))
	denied := checkOf(t, support, `{"tool":"ticket.refund","arguments":`+refundInput+`}`)
	if denied.Verdict != mcpbridge.VerdictRefused || denied.Reason.Stage != "permission_check" || denied.Reason.Code != "authorization.permission_denied" {
		t.Fatalf("a refund by alice's agent: %+v %+v", denied, denied.Reason)
	}
	bad, err := call(t, bot, mcpbridge.CheckTool, `{"tool":"ticket.refund","bogus":1}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := refusalOf(t, bad); r.Code != "schema.invalid" {
		t.Fatalf("the check tool with an unknown argument: %+v", r)
	}

	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("the payment gateway counted %d refunds, want 0", n)
	}
	if pending, err := e.confirm.Pending(context.Background(), carol, 10); err != nil || len(pending) != 0 {
		t.Fatalf("carol has %d challenges to decide (%v), want none", len(pending), err)
	}
	for _, c := range []mcpbridge.CheckResult{asks, reads, denied} {
		var rows []audit.Stored
		waitFor(t, "the check's row", func() bool {
			rows, _ = e.audit.Get(context.Background(), "acme", c.CheckID)
			return len(rows) == 1
		})
		if rows[0].Phase != audit.PhaseCheck || rows[0].Channel != audit.ChannelMCP || rows[0].AgentID == "" {
			t.Fatalf("the check's row: %s %s %s", rows[0].Phase, rows[0].Channel, rows[0].AgentID)
		}
	}
}

// TestCheckToolGoesWithTheTools: a caller without tools is offered no
// check tool either.
func TestCheckToolGoesWithTheTools(t *testing.T) {
	e := start(t)
	res, err := e.connect(t, token(t, "acme", "alice", "rogue-bot")).ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(res.Tools, func(tl *mcp.Tool) bool { return tl.Name == mcpbridge.CheckTool }) {
		t.Fatalf("an inactive agent lists %d tools, the check tool among them", len(res.Tools))
	}
}
