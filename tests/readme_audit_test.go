package tests

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestREADMEAuditClaims holds the README to what it says the audit row of
// an MCP call records: the conversation as conversation_id, the trace id
// of the traceparent as trace_id, and not the idempotency key, whose
// retry is recorded as replayed. The README's sentence is matched word
// for word, so changing the claim means changing this test.
func TestREADMEAuditClaims(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const claim = "`mandate.dev/conversation` (recorded in\nthe audit row as `conversation_id`), `mandate.dev/idempotency_key` (it scopes\n" +
		"retries; the key itself is not written to the trail, and a retry answered\nfrom it is recorded as `replayed`) and a W3C `traceparent` (its trace id is\nthe row's `trace_id`)."
	if !strings.Contains(string(readme), claim) {
		t.Fatal("the README no longer makes the claim this test checks; update both together")
	}

	dev := startDev(t)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "claims", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: dev.base + "/mcp", HTTPClient: &http.Client{Transport: bearer{dev.tokens["alice"]}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.Close() }()
	const (
		key   = "claims-key-7f3a"
		trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	)
	meta := mcp.Meta{"mandate.dev/conversation": "conv-claims", "mandate.dev/idempotency_key": key, "traceparent": "00-" + trace + "-00f067aa0ba902b7-01"}
	args := `{"title":"Claims","lines":[{"description":"Taxi","amount":{"currency_code":"EUR","amount_minor":1200},"category":"EXPENSE_CATEGORY_TRAVEL"}],"payroll_id":"P-0042"}`
	for range 2 {
		if res := callTool(t, cs, "expense.report.create", args, meta); res.IsError {
			t.Fatalf("create: %s", jsonOf(res))
		}
	}
	code, body := getUntil(t, dev.base+"/v1/audit/records?command=expense.report.create&conversation_id=conv-claims", dev.tokens["olive"],
		func(code int, body map[string]any) bool {
			recs, _ := body["records"].([]any)
			return code != http.StatusOK || len(recs) >= 3
		})
	recs, _ := body["records"].([]any)
	if code != http.StatusOK || len(recs) != 3 { // intent and outcome of the call, and the replay's row
		t.Fatalf("audit rows of the conversation: %d, %d rows: %v", code, len(recs), body)
	}
	replayed := 0
	for _, r := range recs {
		row := jsonOf(r)
		if !strings.Contains(row, `"conversation_id":"conv-claims"`) || !strings.Contains(row, `"trace_id":"`+trace+`"`) {
			t.Errorf("a row lacks the conversation or the trace id: %s", row)
		}
		if strings.Contains(row, key) {
			t.Errorf("a row holds the idempotency key: %s", row)
		}
		if strings.Contains(row, `"code":"idempotency.replayed"`) {
			replayed++
		}
	}
	if replayed != 1 {
		t.Errorf("%d rows record the retry as replayed, want 1: %v", replayed, jsonOf(recs))
	}
}
