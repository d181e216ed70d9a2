package mcpbridge_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/services/audit"
)

// TestEnvelopeStrictJSON: a JSON-RPC message with duplicate members (in
// the envelope, in params, in the arguments, in _meta), nested too deep,
// not valid UTF-8 or followed by more data is refused with HTTP 400 and a
// JSON-RPC error naming the rule and pointer, before the SDK reads it:
// nothing is dispatched (no refund), whichever of the duplicates would have
// won. A tools/call with a duplicate in its arguments or _meta is still an
// attempt: the executor refuses it (schema.invalid, or
// request.invalid_metadata) and audits it, and the error's data names the
// invocation. The same session then works as before.
func TestEnvelopeStrictJSON(t *testing.T) {
	e := start(t)
	tok := token(t, "acme", "carol", "finance-bot")
	cs := e.connect(t, tok)
	refund := func(args string) string {
		return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"ticket.refund","arguments":` + args + `}}`
	}
	cases := []struct {
		name, body, rule, pointer string
		code                      int64
		audited                   string // the executor's refusal code, for an audited attempt
	}{
		{"two methods", `{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"ticket.refund","arguments":` + refundInput + `}}`,
			"schema.duplicate_key", "/method", jsonrpc.CodeInvalidRequest, ""},
		{"two params", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ticket.search","arguments":{}},"params":{"name":"ticket.refund","arguments":` + refundInput + `}}`,
			"schema.duplicate_key", "/params", jsonrpc.CodeInvalidRequest, ""},
		{"two ids", `{"jsonrpc":"2.0","id":3,"id":"3","method":"tools/list","params":{}}`,
			"schema.duplicate_key", "/id", jsonrpc.CodeInvalidRequest, ""},
		{"two tool names", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"ticket.search","name":"ticket.refund","arguments":{}}}`,
			"schema.duplicate_key", "/params/name", jsonrpc.CodeInvalidRequest, ""},
		{"duplicate argument", refund(strings.Replace(refundInput, `"amount_minor":"2500"`, `"amount_minor":"1","amount_minor":"2500"`, 1)),
			"schema.duplicate_key", "/params/arguments/amount/amount_minor", jsonrpc.CodeInvalidRequest, "schema.invalid"},
		{"duplicate argument after unescaping", refund(`{"ticket_id":"T-1001","ticket_\u0069d":"T-1002"}`),
			"schema.duplicate_key", "/params/arguments/ticket_id", jsonrpc.CodeInvalidRequest, "schema.invalid"},
		{"duplicate _meta key", `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"ticket.search","arguments":{},"_meta":{"mandate.dev/idempotency-key":"a","mandate.dev/idempotency-key":"b"}}}`,
			"schema.duplicate_key", "/params/_meta/mandate.dev~1idempotency-key", jsonrpc.CodeInvalidRequest, "request.invalid_metadata"},
		{"duplicate in a batch", `[{"jsonrpc":"2.0","id":6,"method":"tools/list","params":{}},{"jsonrpc":"2.0","id":6,"id":8,"method":"tools/list"}]`,
			"schema.duplicate_key", "/1/id", jsonrpc.CodeInvalidRequest, ""},
		{"5000 deep arguments", refund(strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000)),
			"schema.too_deep", "", jsonrpc.CodeInvalidRequest, ""},
		{"invalid UTF-8", refund("{\"reason\":\"\xff\"}"), "schema.utf8", "", jsonrpc.CodeParseError, ""},
		{"trailing bytes", `{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}} xyz`, "schema.syntax", "", jsonrpc.CodeParseError, ""},
		{"two messages", `{"jsonrpc":"2.0","id":10,"method":"tools/list","params":{}}{"jsonrpc":"2.0","id":11,"method":"tools/list","params":{}}`,
			"schema.syntax", "", jsonrpc.CodeParseError, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.post(t, tok, cs, strings.NewReader(tc.body))
			if r.status != http.StatusBadRequest {
				t.Fatalf("HTTP %d %.300q, want 400", r.status, r.body)
			}
			var resp struct {
				JSONRPC string          `json:"jsonrpc"`
				ID      json.RawMessage `json:"id"`
				Error   struct {
					Code    int64  `json:"code"`
					Message string `json:"message"`
					Data    struct {
						Rule         string `json:"rule"`
						Pointer      string `json:"pointer"`
						InvocationID string `json:"invocation_id"`
					} `json:"data"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(r.body), &resp); err != nil {
				t.Fatalf("body %.300q is not a JSON-RPC response: %v", r.body, err)
			}
			if resp.JSONRPC != "2.0" || string(resp.ID) != "null" || resp.Error.Code != tc.code || resp.Error.Message == "" {
				t.Fatalf("response %s, want JSON-RPC error %d with id null", r.body, tc.code)
			}
			if resp.Error.Data.Rule != tc.rule || (tc.pointer != "" && resp.Error.Data.Pointer != tc.pointer) {
				t.Fatalf("data %+v, want rule %s pointer %q", resp.Error.Data, tc.rule, tc.pointer)
			}
			if (tc.audited != "") != (resp.Error.Data.InvocationID != "") {
				t.Fatalf("data %+v: audited attempt %q", resp.Error.Data, tc.audited)
			}
			if tc.audited != "" {
				for _, row := range e.auditRows(t, "acme") {
					if row.InvocationID == resp.Error.Data.InvocationID && (row.Outcome != audit.OutcomeRefused || row.Code != tc.audited) {
						t.Fatalf("the attempt's row: %s %s", row.Outcome, row.Code)
					}
				}
			}
		})
	}
	// Only the three tools/calls with duplicates in arguments or _meta
	// reached the executor, each one refused row.
	rows := waitCount(t, e, "acme", 3)
	for _, row := range rows {
		if row.Phase != audit.PhaseOutcome || row.Outcome != audit.OutcomeRefused {
			t.Fatalf("row %s %s %s", row.Phase, row.Outcome, row.Code)
		}
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("gateway counted %d refunds", n)
	}

	// The same session works, and a well-formed raw body reaches the SDK
	// whole (the check restored what it read).
	r := e.post(t, tok, cs, strings.NewReader(`  {"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"ticket.search","arguments":{"query":"charged twice"}}}`+"\n"))
	if r.status != http.StatusOK || r.rpc == nil || r.rpc.Error != nil || !strings.Contains(string(r.rpc.Result), "T-1001") {
		t.Fatalf("well-formed raw call: HTTP %d %.300s", r.status, r.body)
	}
	waitCount(t, e, "acme", 5)
}

// TestEnvelopeAuthenticatedFirst: without a token the answer is 401 from
// the bearer check, whatever the body holds.
func TestEnvelopeAuthenticatedFirst(t *testing.T) {
	e := start(t)
	r := e.post(t, "", nil, strings.NewReader(`{"jsonrpc":"2.0","id":1,"id":2,"method":"initialize","params":{}}`))
	if r.status != http.StatusUnauthorized {
		t.Fatalf("HTTP %d %q, want 401", r.status, r.body)
	}
}

// TestEnvelopeOverLimit: a body over the SDK's size limit is refused for a
// rule it breaks within the limit (400, as for any body), and otherwise
// left to the SDK, which answers 413.
func TestEnvelopeOverLimit(t *testing.T) {
	e := start(t)
	tok := token(t, "acme", "carol", "finance-bot")
	cs := e.connect(t, tok)
	pad := strings.Repeat("x", mcp.DefaultMaxRequestBodyBytes)

	r := e.post(t, tok, cs, strings.NewReader(`{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list","params":{"pad":"`+pad+`"}}`))
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, `"pointer":"/id"`) {
		t.Fatalf("duplicate within the limit: HTTP %d %.300q, want 400 naming /id", r.status, r.body)
	}
	r = e.post(t, tok, cs, strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"pad":"`+pad+`"}}`))
	if r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("well-formed over the limit: HTTP %d %.300q, want 413", r.status, r.body)
	}
}
