package tests

import (
	"context"
	"net/http"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpSessionAt connects the official MCP client to the bridge process
// asking for one protocol revision, and checks that it got it.
func (tp *topology) mcpSessionAt(tok, protocol string, opts *mcp.ClientOptions) *mcp.ClientSession {
	tp.t.Helper()
	ep := tp.addr["mcpbridge"]
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "scenario-agent", Version: "1"}, opts).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: "http://" + ep.http + "/mcp", HTTPClient: &http.Client{Transport: bearer{tok}}},
		&mcp.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		tp.t.Fatalf("MCP connect at %s: %v\n%s", protocol, err, tp.logOf("mcpbridge"))
	}
	tp.t.Cleanup(func() { _ = cs.Close() })
	if got := cs.InitializeResult().ProtocolVersion; got != protocol {
		tp.t.Fatalf("negotiated %s, want %s", got, protocol)
	}
	return cs
}

// TestScenarioRefundOverMCP2026: the `mandate mcpbridge` process (its
// requestState key derived from the service secret) serves a 2026-07-28
// client without a session: finance-bot's refund is confirmed by carol in
// the client's form through an input_required round trip, runs once, and
// is audited with carol's approval on mcp_elicitation. A 2025-11-25 client
// of the same process still gets a session.
func TestScenarioRefundOverMCP2026(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	bot := tp.token("acme", "carol", "finance-bot")
	var form approveForm
	cs := tp.mcpSessionAt(bot, "2026-07-28", &mcp.ClientOptions{ElicitationHandler: form.handler})
	if cs.ID() != "" {
		t.Fatalf("2026-07-28 client got session %q", cs.ID())
	}
	res := callTool(t, cs, "ticket.refund", refundInput, mcp.Meta{"mandate.dev/conversation": "conv-2026"})
	if res.IsError || len(form.shown) != 1 {
		t.Fatalf("refund: %s after %d prompts", jsonOf(res.Content), len(form.shown))
	}
	tp.wantRefunds(1, 2500)
	inv, _ := res.Meta["mandate.dev/invocation_id"].(string)
	rows := tp.invocationRows(inv, 2)
	outcome(t, rows, "executed", "", "")
	for _, r := range rows {
		if a := r.GetApproval(); a.GetApprover() != "carol" || a.GetChannel() != "mcp_elicitation" || r.GetChannel() != "mcp" {
			t.Fatalf("audit row %v", r)
		}
	}

	legacy := tp.mcpSessionAt(bot, "2025-11-25", nil)
	if legacy.ID() == "" {
		t.Fatal("2025-11-25 client without a session")
	}
}
