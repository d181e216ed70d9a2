package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAttackHostileInputNever5xx drives `mandate dev` as an attacker with
// hostile REST paths, queries and bodies and hostile MCP envelopes. No
// answer is a 5xx; each carries a stable code; and every attempt that
// authenticates against a command route leaves exactly one refused audit
// row (schema_validate, schema.invalid), while requests that do not
// authenticate, target no command, or are not readable JSON-RPC leave none.
func TestAttackHostileInputNever5xx(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dev := startDev(t)
	tok := dev.tokens
	refund := `{"amount":{"currency_code":"EUR","amount_minor":"100"},"reason":"dup","cardholder_reference":"CH4242424242"}`
	deep := strings.Repeat("[", 5000) + strings.Repeat("]", 5000)

	rest := []struct {
		name, user, method, path, body string
		status                         int
		code, rule, pointer            string
		command                        string // the command whose refusal is audited; "" = no row
	}{
		{"query %ff", "alice", http.MethodGet, "/v1/tickets?query=%ff", "",
			400, "schema.invalid", "schema.utf8", "/query", "ticket.search"},
		{"path parameter %ff", "carol", http.MethodPost, "/v1/tickets/%ff:refund", refund,
			400, "schema.invalid", "schema.utf8", "/ticket_id", "ticket.refund"},
		{"path parameter %ff on a read", "alice", http.MethodGet, "/v1/tickets/%ff", "",
			400, "schema.invalid", "schema.utf8", "/ticket_id", "ticket.get"},
		{"5,000-deep body", "carol", http.MethodPost, "/v1/tickets/T-1001:refund", deep,
			400, "schema.invalid", "schema.too_deep", "", "ticket.refund"},
		{"5,000-deep input", "alice", http.MethodPost, "/v1/commands/ticket.search:execute", `{"input":{"query":` + deep + `}}`,
			400, "schema.invalid", "schema.too_deep", "", "ticket.search"},
		{"trailing bytes", "alice", http.MethodPost, "/v1/commands/ticket.search:execute", `{"input":{"query":"x"}} xyz`,
			400, "schema.invalid", "schema.syntax", "", "ticket.search"},
		{"two JSON values", "alice", http.MethodPost, "/v1/commands/ticket.search:execute", `{}{}`,
			400, "schema.invalid", "schema.syntax", "", "ticket.search"},
		{"duplicate key", "carol", http.MethodPost, "/v1/tickets/T-1001:refund", strings.Replace(refund, `"reason":"dup"`, `"reason":"a","reason":"dup"`, 1),
			400, "schema.invalid", "schema.duplicate_key", "/reason", "ticket.refund"},
		{"duplicate key in the input", "alice", http.MethodPost, "/v1/commands/ticket.search:execute", `{"input":{"query":"x","query":"y"}}`,
			400, "schema.invalid", "schema.duplicate_key", "/input/query", "ticket.search"},
		{"invalid UTF-8 in the body", "carol", http.MethodPost, "/v1/tickets/T-1001:refund", strings.Replace(refund, "dup", "\xff", 1),
			400, "schema.invalid", "schema.utf8", "", "ticket.refund"},
		{"unauthenticated deep body", "", http.MethodPost, "/v1/tickets/T-1001:refund", strings.Repeat("[", 5000),
			401, "authentication.missing_credentials", "", "", ""},
		{"bad token, deep body", "garbage", http.MethodPost, "/v1/commands/ticket.search:execute", strings.Repeat("[", 5000),
			401, "", "", "", ""},
		{"query value not of its field's type", "alice", http.MethodGet, "/v1/tickets?query=x&page_size=many", "",
			400, "schema.invalid", "schema.decode", "", "ticket.search"},
		{"query %ff on a route that is no command", "olive", http.MethodGet, "/v1/audit/records?command=%ff", "",
			400, "schema.invalid", "schema.utf8", "/command", ""},
	}
	for _, tc := range rest {
		t.Run("REST/"+tc.name, func(t *testing.T) {
			before := auditCount(t, dev)
			bearer := tok[tc.user]
			if tc.user == "garbage" {
				bearer = "garbage"
			}
			status, body := do(t, tc.method, dev.base+tc.path, bearer, tc.body)
			if status >= 500 || status != tc.status {
				t.Fatalf("HTTP %d %v, want %d", status, body, tc.status)
			}
			if tc.code != "" && body["code"] != tc.code {
				t.Fatalf("code %v, want %s: %v", body["code"], tc.code, body)
			}
			if status == 401 && !strings.HasPrefix(fmt.Sprint(body["code"]), "authentication.") {
				t.Fatalf("401 without an authentication code: %v", body)
			}
			if tc.rule != "" {
				errs, _ := body["errors"].([]any)
				v, _ := firstOf(errs).(map[string]any)
				if len(errs) != 1 || v["rule"] != tc.rule || (tc.pointer != "" && v["pointer"] != tc.pointer) {
					t.Fatalf("violations %v, want rule %s pointer %q", body["errors"], tc.rule, tc.pointer)
				}
			}
			if tc.command == "" {
				if got := settledNewRows(t, dev, before); got != 0 {
					t.Fatalf("%d audit rows for an attempt that should leave none", got)
				}
				return
			}
			if body["stage"] != "schema_validate" || body["invocation_id"] == nil {
				t.Fatalf("refusal %v, want stage schema_validate with an invocation id", body)
			}
			rows := newRows(t, dev, before, 1)
			row := rows[0]
			if row["invocation_id"] != body["invocation_id"] || row["command"] != tc.command || row["phase"] != "outcome" ||
				row["outcome"] != "refused" || row["stage"] != "schema_validate" || row["code"] != "schema.invalid" || row["channel"] != "rest" {
				t.Fatalf("audit row %v, want the refused %s attempt", row, tc.command)
			}
		})
	}

	// An envelope the transport cannot read leaves no row; a tools/call
	// whose arguments or _meta repeat a member is an attempt to call the
	// tool, refused by the executor and audited (its code in audited).
	mcpCases := []struct {
		name, body, rule, audited string
	}{
		{"duplicate method", `{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"ticket.search","arguments":{}}}`, "schema.duplicate_key", ""},
		{"duplicate params", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ticket.search","arguments":{}},"params":{"name":"ticket.get","arguments":{"ticket_id":"T-1001"}}}`, "schema.duplicate_key", ""},
		{"duplicate id", `{"jsonrpc":"2.0","id":3,"id":4,"method":"tools/list","params":{}}`, "schema.duplicate_key", ""},
		{"duplicate key in tools/call arguments", `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"ticket.search","arguments":{"query":"a","query":"b"}}}`, "schema.duplicate_key", "schema.invalid"},
		{"duplicate key in _meta", `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"ticket.search","arguments":{},"_meta":{"k":1,"k":2}}}`, "schema.duplicate_key", "request.invalid_metadata"},
	}
	for _, tc := range mcpCases {
		t.Run("MCP/"+tc.name, func(t *testing.T) {
			before := auditCount(t, dev)
			status, resp := mcpPost(t, dev.base+"/mcp", tok["support-bot@alice"], tc.body)
			if status != http.StatusBadRequest {
				t.Fatalf("HTTP %d %v, want 400", status, resp)
			}
			e, _ := resp["error"].(map[string]any)
			data, _ := e["data"].(map[string]any)
			if resp["jsonrpc"] != "2.0" || e["code"] != float64(-32600) || data["rule"] != tc.rule {
				t.Fatalf("response %v, want JSON-RPC -32600 with rule %s", resp, tc.rule)
			}
			if tc.audited == "" {
				if got := settledNewRows(t, dev, before); got != 0 {
					t.Fatalf("%d audit rows for a refused envelope", got)
				}
				return
			}
			row := newRows(t, dev, before, 1)[0]
			if row["invocation_id"] != data["invocation_id"] || row["outcome"] != "refused" || row["code"] != tc.audited || row["channel"] != "mcp" {
				t.Fatalf("audit row %v, want the refused attempt %v with %s", row, data["invocation_id"], tc.audited)
			}
		})
	}
}

func firstOf(xs []any) any {
	if len(xs) == 0 {
		return nil
	}
	return xs[0]
}

// auditRecords returns tenant acme's audit rows, newest first, as olive
// (the auditor) reads them over REST.
func auditRecords(t *testing.T, dev *devProcess) []map[string]any {
	t.Helper()
	status, body := do(t, http.MethodGet, dev.base+"/v1/audit/records?page_size=1000", dev.tokens["olive"], "")
	if status != http.StatusOK {
		t.Fatalf("audit query: HTTP %d %v", status, body)
	}
	recs, _ := body["records"].([]any)
	out := make([]map[string]any, 0, len(recs))
	for _, r := range recs {
		m, _ := r.(map[string]any)
		out = append(out, m)
	}
	return out
}

func auditCount(t *testing.T, dev *devProcess) int { return len(auditRecords(t, dev)) }

// newRows waits until exactly n rows were added after the first before,
// and returns them (newest first); more than n fails.
func newRows(t *testing.T, dev *devProcess, before, n int) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		recs := auditRecords(t, dev)
		if got := len(recs) - before; got > n {
			t.Fatalf("%d new audit rows, want %d: %v", got, n, recs[:got])
		} else if got == n {
			return recs[:n]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d new audit rows after 5s, want %d", len(recs)-before, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settledNewRows returns how many rows were added since before, after a
// short settle (rows of refused attempts are written before the reply;
// the wait catches one written late).
func settledNewRows(t *testing.T, dev *devProcess, before int) int {
	t.Helper()
	time.Sleep(100 * time.Millisecond)
	return auditCount(t, dev) - before
}

// mcpPost sends one raw JSON-RPC body to the MCP endpoint.
func mcpPost(t *testing.T, url, tok, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return resp.StatusCode, m
}
