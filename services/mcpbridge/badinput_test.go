package mcpbridge_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/audit"
)

// reply is one raw HTTP answer of the MCP endpoint, with the JSON-RPC
// response it carried (in a JSON body or an SSE event), if any.
type reply struct {
	status int
	header http.Header
	body   string
	rpc    *rpcResponse
}

type rpcResponse struct {
	ID     any             `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// post sends one raw POST to the MCP endpoint. A non-empty session adds
// Mcp-Session-Id and the negotiated protocol version, as a client would
// after initialize.
func (e *env) post(t *testing.T, tok string, cs *mcp.ClientSession, body io.Reader) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/mcp", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if cs != nil {
		req.Header.Set("Mcp-Session-Id", cs.ID())
		req.Header.Set("Mcp-Protocol-Version", cs.InitializeResult().ProtocolVersion)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	r := reply{status: resp.StatusCode, header: resp.Header}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		// The call's stream ends after its response.
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 64<<10), 8<<20)
		var sb strings.Builder
		for sc.Scan() {
			line := sc.Text()
			sb.WriteString(line + "\n")
			if data, ok := strings.CutPrefix(line, "data:"); ok {
				var m rpcResponse
				if json.Unmarshal([]byte(strings.TrimSpace(data)), &m) == nil && (m.Result != nil || m.Error != nil) {
					r.rpc = &m
				}
			}
		}
		r.body = sb.String()
		return r
	}
	b, _ := io.ReadAll(resp.Body)
	r.body = string(b)
	var m rpcResponse
	if json.Unmarshal(b, &m) == nil && (m.Result != nil || m.Error != nil) {
		r.rpc = &m
	}
	return r
}

// noCodeZero fails if a reply carries a JSON-RPC error with code 0 (what
// the SDK sends for a plain Go error).
func noCodeZero(t *testing.T, name string, r reply) {
	t.Helper()
	if r.rpc != nil && r.rpc.Error != nil && r.rpc.Error.Code == 0 {
		t.Errorf("%s: JSON-RPC error with code 0: %s", name, r.body)
	}
}

// auditRows returns every audit row of a tenant.
func (e *env) auditRows(t *testing.T, tenant string) []audit.Stored {
	t.Helper()
	page, err := e.audit.Query(context.Background(), audit.Filter{Tenant: tenant, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return page.Records
}

// TestMalformedJSONRPC: bodies that are not JSON, not JSON-RPC, or carry
// params of the wrong types are answered by the transport (HTTP 400) or
// with a JSON-RPC error of a proper code, never code 0; nothing reaches
// the executor.
func TestMalformedJSONRPC(t *testing.T) {
	e := start(t)
	tok := token(t, "acme", "alice", "support-bot")
	cs := e.connect(t, tok)

	http400 := []struct{ name, body string }{
		{"invalid JSON", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{`},
		{"not an object", `"tools/call"`},
		{"JSON but not JSON-RPC", `{"hello":"world"}`},
		{"wrong jsonrpc version", `{"jsonrpc":"1.0","id":1,"method":"tools/list","params":{}}`},
		{"unknown method", `{"jsonrpc":"2.0","id":2,"method":"tools/run","params":{}}`},
		{"call without an id", `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"ticket.search","arguments":{}}}`},
		{"tools/call without params", `{"jsonrpc":"2.0","id":3,"method":"tools/call"}`},
		{"batch", `[{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"ticket.search","arguments":{}}}]`},
		{"empty body", ``},
	}
	for _, tc := range http400 {
		r := e.post(t, tok, cs, strings.NewReader(tc.body))
		if r.status != http.StatusBadRequest {
			t.Errorf("%s: HTTP %d %q, want 400", tc.name, r.status, r.body)
		}
		t.Logf("%s: HTTP %d %q", tc.name, r.status, strings.TrimSpace(r.body))
		noCodeZero(t, tc.name, r)
	}

	// Well-formed JSON-RPC whose params do not decode: a JSON-RPC error
	// with the proper code in the call's stream.
	badParams := []struct {
		name, body string
		code       int64
	}{
		{"name is a number", `{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":5,"arguments":{}}}`, jsonrpc.CodeInvalidParams},
		{"params is an array", `{"jsonrpc":"2.0","id":11,"method":"tools/call","params":["ticket.search"]}`, jsonrpc.CodeInvalidParams},
		{"params is null", `{"jsonrpc":"2.0","id":12,"method":"tools/call","params":null}`, jsonrpc.CodeInvalidRequest},
		{"_meta is a string", `{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"ticket.search","arguments":{},"_meta":"x"}}`, jsonrpc.CodeInvalidParams},
		{"no tool name", `{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"arguments":{}}}`, jsonrpc.CodeInvalidParams},
		{"resources/read uri is a number", `{"jsonrpc":"2.0","id":15,"method":"resources/read","params":{"uri":7}}`, jsonrpc.CodeInvalidParams},
	}
	for _, tc := range badParams {
		r := e.post(t, tok, cs, strings.NewReader(tc.body))
		noCodeZero(t, tc.name, r)
		if r.rpc == nil || r.rpc.Error == nil {
			t.Errorf("%s: HTTP %d %q, want a JSON-RPC error", tc.name, r.status, r.body)
			continue
		}
		t.Logf("%s: HTTP %d, JSON-RPC %d %q", tc.name, r.status, r.rpc.Error.Code, r.rpc.Error.Message)
		if r.rpc.Error.Code != tc.code {
			t.Errorf("%s: JSON-RPC error %d %q, want %d", tc.name, r.rpc.Error.Code, r.rpc.Error.Message, tc.code)
		}
	}

	// A well-formed raw call on the same session works: the refusals above
	// are about the bodies, not the session or the headers.
	r := e.post(t, tok, cs, strings.NewReader(`{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"ticket.search","arguments":{"query":"charged twice"}}}`))
	if r.status != http.StatusOK || r.rpc == nil || r.rpc.Error != nil || !strings.Contains(string(r.rpc.Result), "T-1001") {
		t.Fatalf("well-formed raw call: HTTP %d %s", r.status, r.body)
	}
	// Only two calls reached the executor: the one without a tool name,
	// refused at load_definition (an attempt, so audited), and that call,
	// with one intent and one outcome.
	rows := waitCount(t, e, "acme", 3)
	for _, row := range rows {
		unnamed := row.Command == "unknown" && row.Stage == "load_definition" && row.Code == "command.not_found"
		if !unnamed && row.Command != "ticket.search" || row.Channel != audit.ChannelMCP {
			t.Errorf("unexpected audit row %+v", row.Record)
		}
	}
}

// waitCount waits until a tenant has at least n audit rows (outcome rows
// of successful calls are written after the reply) and returns them; more
// than n fails.
func waitCount(t *testing.T, e *env, tenant string, n int) []audit.Stored {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		rows := e.auditRows(t, tenant)
		if len(rows) > n {
			for _, r := range rows {
				t.Logf("row %d: %s %s %s %s %s", r.Seq, r.Phase, r.Command, r.Outcome, r.Stage, r.Code)
			}
			t.Fatalf("%d audit rows in %s, want %d", len(rows), tenant, n)
		}
		if len(rows) == n {
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d audit rows in %s after 5s, want %d", len(rows), tenant, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestUnknownTools: names that are no published command get JSON-RPC
// -32602 from the bridge, and each attempt is refused by the executor at
// load_definition and audited (every attempt leaves a row); a published
// command the caller cannot see reaches it and is refused and audited as
// an attempt.
func TestUnknownTools(t *testing.T) {
	e := start(t)
	cs := e.connect(t, token(t, "acme", "alice", "support-bot"))
	for _, name := range []string{"no.such.tool", "", "Ticket.Search", "ticket.search ", "examples.helpdesk.v1.HelpdeskService/SearchTickets", strings.Repeat("x", 4096)} {
		_, err := call(t, cs, name, `{}`, nil)
		var je *jsonrpc.Error
		if !errors.As(err, &je) || je.Code != jsonrpc.CodeInvalidParams {
			t.Errorf("tool %.40q: %v, want JSON-RPC -32602", name, err)
		}
	}
	rows := waitCount(t, e, "acme", 6)
	for _, row := range rows {
		if row.Phase != audit.PhaseOutcome || row.Outcome != audit.OutcomeRefused || row.Stage != "load_definition" || row.Code != "command.not_found" {
			t.Errorf("unknown tool's row: %s %s %s %s", row.Phase, row.Outcome, row.Stage, row.Code)
		}
	}
	before := len(rows)

	// ticket.refund is published but not alice's: refused by the executor
	// at permission_check, one refused outcome row, no intent, no refund.
	res, err := call(t, cs, "ticket.refund", refundInput, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := refusalOf(t, res)
	if r.Code != "authorization.permission_denied" || r.Stage != "permission_check" || r.InvocationID == "" || r.Retriable {
		t.Fatalf("refusal %+v", r)
	}
	rows = waitCount(t, e, "acme", before+1)
	var row audit.Stored
	for _, x := range rows {
		if x.InvocationID == r.InvocationID {
			row = x
		}
	}
	if row.InvocationID != r.InvocationID || row.Phase != audit.PhaseOutcome || row.Outcome != audit.OutcomeRefused ||
		row.Stage != "permission_check" || row.Code != "authorization.permission_denied" ||
		row.AgentID != "support-bot" || row.UserID != "alice" || row.MCPSessionID != cs.ID() {
		t.Fatalf("audit row %+v", row.Record)
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("gateway counted %d refunds", n)
	}
}

// TestArgumentsViolatingTheSchema: the executor refuses at schema_validate
// with schema.invalid and the violations (pointer, rule); the refusal is
// audited, nothing is dispatched (no intent row, no refund), and the
// caller can fix the call.
func TestArgumentsViolatingTheSchema(t *testing.T) {
	e := start(t)
	cs := e.connect(t, token(t, "acme", "alice", "support-bot"))
	cases := []struct {
		name, input, pointer, rule string
	}{
		{"unknown field", `{"query":"x","colour":"red"}`, "/colour", ""},
		{"wrong type", `{"query":42}`, "/query", ""},
		{"too long", `{"query":"` + strings.Repeat("a", 201) + `"}`, "/query", "string.max_len"},
		{"bad email", `{"customer_email":"not-an-email"}`, "/customer_email", "string.email"},
		{"bad tag pattern", `{"tags":["Not Valid"]}`, "/tags/0", "string.pattern"},
		{"repeated status", `{"statuses":["TICKET_STATUS_OPEN","TICKET_STATUS_OPEN"]}`, "/statuses", "repeated.unique"},
		{"unknown status", `{"statuses":["TICKET_STATUS_LOST"]}`, "/statuses/0", "schema.enum"},
		{"arguments not an object", `["query"]`, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := call(t, cs, "ticket.search", tc.input, nil)
			if err != nil {
				t.Fatalf("JSON-RPC error %v, want an isError result", err)
			}
			r := refusalOf(t, res)
			if r.Code != "schema.invalid" || r.Stage != "schema_validate" || r.InvocationID == "" || r.Remedy == "" {
				t.Fatalf("refusal %+v", r)
			}
			if len(r.Violations) == 0 {
				t.Fatalf("no violations: %+v", r)
			}
			found := tc.pointer == ""
			for _, v := range r.Violations {
				if v.Rule == "" {
					t.Errorf("violation without a rule: %+v", v)
				}
				if v.Pointer == tc.pointer && (tc.rule == "" || v.Rule == tc.rule) {
					found = true
				}
			}
			if !found {
				t.Fatalf("violations %+v, want pointer %q rule %q", r.Violations, tc.pointer, tc.rule)
			}
		})
	}
	// carol may refund, but not with a malformed amount: refused before the
	// confirmation step (no challenge) and before the gateway.
	carolCS := e.connect(t, token(t, "acme", "carol", "finance-bot"))
	bad := strings.Replace(refundInput, `"amount_minor":"2500"`, `"amount_minor":"lots"`, 1)
	res, err := call(t, carolCS, "ticket.refund", bad, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := refusalOf(t, res); r.Code != "schema.invalid" || r.ChallengeID != "" {
		t.Fatalf("malformed refund: %+v", r)
	}

	rows := waitCount(t, e, "acme", len(cases)+1)
	for _, row := range rows {
		if row.Phase != audit.PhaseOutcome || row.Outcome != audit.OutcomeRefused || row.Code != "schema.invalid" {
			t.Errorf("audit row %+v, want only refused schema.invalid outcomes", row.Record)
		}
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("gateway counted %d refunds", n)
	}
}

// TestOversizedBody: a body over the transport's limit is refused with
// 413 before it is parsed; nothing is dispatched.
func TestOversizedBody(t *testing.T) {
	e := start(t)
	tok := token(t, "acme", "carol", "finance-bot")
	cs := e.connect(t, tok)
	// A tools/call whose reason field alone is over the limit.
	pad := strings.Repeat("a", mcp.DefaultMaxRequestBodyBytes)
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ticket.refund","arguments":%s}}`,
		strings.Replace(refundInput, `"Customer was charged twice"`, `"`+pad+`"`, 1))
	r := e.post(t, tok, cs, strings.NewReader(body))
	if r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body: HTTP %d %.200q, want 413", r.status, r.body)
	}
	noCodeZero(t, "oversized body", r)
	// The session still works, and nothing of the oversized call ran.
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatalf("session after the oversized body: %v", err)
	}
	if rows := e.auditRows(t, "acme"); len(rows) != 0 {
		t.Fatalf("oversized body left %d audit rows", len(rows))
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("gateway counted %d refunds", n)
	}
}

// TestBadTokens: every bad credential gets 401 with WWW-Authenticate naming
// the protected-resource metadata URL, and the body names the reason;
// never a JSON-RPC error. A valid token in the same place passes.
func TestBadTokens(t *testing.T) {
	e := start(t)
	now := time.Now()
	mint := func(secret []byte, r identity.MintRequest) string {
		t.Helper()
		tok, err := identity.MintDev(secret, r)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	valid := identity.MintRequest{Issuer: "test", Audience: "mandate", User: "alice", Tenant: "acme", Agent: "support-bot", Model: "m", TTL: time.Hour, Now: now}
	with := func(f func(*identity.MintRequest)) identity.MintRequest { r := valid; f(&r); return r }
	svc, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", "executor", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	svcTok, err := svc.Token(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name, header, reason string
	}{
		{"missing", "", "no bearer token"},
		{"not bearer", "Basic YWxpY2U6cGFzcw==", "no bearer token"},
		{"empty bearer", "Bearer ", "no bearer token"},
		{"garbage", "Bearer not-a-token", failure.CodeAuthenticationInvalidToken},
		{"expired", "Bearer " + mint(devSecret, with(func(r *identity.MintRequest) { r.Now = now.Add(-2 * time.Hour) })), failure.CodeAuthenticationTokenExpired},
		{"not yet valid", "Bearer " + mint(devSecret, with(func(r *identity.MintRequest) { r.Now = now.Add(time.Hour) })), failure.CodeAuthenticationTokenNotYetValid},
		{"other audience", "Bearer " + mint(devSecret, with(func(r *identity.MintRequest) { r.Audience = "billing-api" })), failure.CodeAuthenticationWrongAudience},
		{"other issuer", "Bearer " + mint(devSecret, with(func(r *identity.MintRequest) { r.Issuer = "evil" })), failure.CodeAuthenticationWrongIssuer},
		{"other key", "Bearer " + mint([]byte("another-secret-0123456789abcdef01234"), valid), "authentication."},
		{"service token", "Bearer " + svcTok, "authentication."},
	}
	wantChallenge := fmt.Sprintf(`Bearer resource_metadata=%q`, e.url+"/.well-known/oauth-protected-resource/mcp")
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ticket.search","arguments":{}}}`
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, e.url+"/mcp", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("HTTP %d %q, want 401", resp.StatusCode, b)
			}
			if got := resp.Header.Get("WWW-Authenticate"); got != wantChallenge {
				t.Errorf("WWW-Authenticate %q, want %q", got, wantChallenge)
			}
			t.Logf("HTTP %d %q", resp.StatusCode, strings.TrimSpace(string(b)))
			if !strings.Contains(string(b), tc.reason) {
				t.Errorf("body %q does not name %q", b, tc.reason)
			}
			if strings.Contains(string(b), `"jsonrpc"`) {
				t.Errorf("a JSON-RPC body for a 401: %q", b)
			}
		})
	}
	// A session opened with a valid token does not carry a bad one: each
	// request is verified on its own.
	cs := e.connect(t, token(t, "acme", "alice", "support-bot"))
	r := e.post(t, "not-a-token", cs, strings.NewReader(body))
	if r.status != http.StatusUnauthorized {
		t.Fatalf("bad token on an open session: HTTP %d %q", r.status, r.body)
	}
	// Nor another principal's token: the session is pinned to its user.
	r = e.post(t, token(t, "acme", "carol", "finance-bot"), cs, strings.NewReader(body))
	if r.status != http.StatusForbidden && r.status != http.StatusNotFound {
		t.Fatalf("carol's token on alice's session: HTTP %d %q, want 403 or 404", r.status, r.body)
	}
	if rows := e.auditRows(t, "acme"); len(rows) != 0 {
		t.Fatalf("bad tokens left %d audit rows", len(rows))
	}
}
