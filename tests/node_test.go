package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/internal/manifest"
)

// aliceTools is what alice, and so her support-bot, may call in the demo
// directory (ticket.read and expense.report.submit), and the bridge's check
// tool that goes with them.
var aliceTools = []string{"expense.report.create", "expense.report.recall", "expense.report.submit", "mandate.check", "mandate.plan", "ticket.get", "ticket.search"}

const nodeRefund = `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"1500"},"reason":"Customer was charged twice","cardholder_reference":"CH4242424242"}`

// TestNodeClient drives `mandate dev` over MCP with the official
// TypeScript SDK client (tests/node/client.mjs): an agent's tool list, a
// search, the manifest resource, a refusal, and a refund confirmed (and
// one declined) through form elicitation. It skips without node or tests/node/node_modules
// unless MANDATE_REQUIRE_NODE=1 (CI runs `npm ci --prefix tests/node`).
func TestNodeClient(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary and node")
	}
	node := nodeOrSkip(t)
	dev := startNodeDev(t)

	t.Run("support-bot lists, searches and reads", func(t *testing.T) {
		out := dev.client(t, node, "support-bot@alice", "none",
			`{"op":"list"}`,
			`{"op":"call","name":"ticket.search","arguments":{"query":"charged twice"}}`,
			`{"op":"read","uri":"mandate://manifest"}`,
			`{"op":"call","name":"no.such.tool","arguments":{}}`)
		if out.Server.Info.Name != "mandate" || out.Server.SessionID == "" ||
			(out.Server.ProtocolVersion != "2025-11-25" && out.Server.ProtocolVersion != "2025-06-18") {
			t.Errorf("server %+v", out.Server)
		}
		// The list is alice's, and the same as the Go SDK client gets.
		list := out.step(t, 0, "list", true)
		var nodeNames []string
		nodeSchemas := map[string]string{}
		for _, tool := range list.Tools {
			nodeNames = append(nodeNames, tool.Name)
			nodeSchemas[tool.Name] = canonicalJSON(t, tool.InputSchema)
		}
		slices.Sort(nodeNames)
		if !slices.Equal(nodeNames, aliceTools) {
			t.Errorf("support-bot's tools over the TypeScript client: %v, want %v", nodeNames, aliceTools)
		}
		goTools := dev.goTools(t, "support-bot@alice")
		var goNames []string
		for _, tool := range goTools {
			goNames = append(goNames, tool.Name)
			if got := nodeSchemas[tool.Name]; got != canonicalJSON(t, tool.InputSchema) {
				t.Errorf("%s: input schema differs between the clients:\nnode %s\n  go %s", tool.Name, got, canonicalJSON(t, tool.InputSchema))
			}
		}
		slices.Sort(goNames)
		if !slices.Equal(nodeNames, goNames) {
			t.Errorf("TypeScript client %v, Go client %v", nodeNames, goNames)
		}

		search := out.step(t, 1, "call", true)
		if search.Result.IsError || !strings.Contains(string(search.Result.StructuredContent), `"T-1001"`) {
			t.Errorf("ticket.search: %s", search.Raw)
		}

		// The whole manifest needs ops.read: a JSON-RPC error whose data is
		// the refusal.
		read := out.step(t, 2, "read", false)
		if read.Error.Code == nil || *read.Error.Code == 0 || !strings.Contains(string(read.Error.Data), "authorization.permission_denied") {
			t.Errorf("support-bot read the manifest: %s", read.Raw)
		}
		unknown := out.step(t, 3, "call", false)
		if unknown.Error.Code == nil || *unknown.Error.Code != -32602 {
			t.Errorf("no.such.tool: %s", unknown.Raw)
		}
	})

	t.Run("olive reads the manifest verbatim", func(t *testing.T) {
		out := dev.client(t, node, "olive", "none", `{"op":"read","uri":"mandate://manifest"}`)
		read := out.step(t, 0, "read", true)
		set, err := manifest.Embedded()
		if err != nil {
			t.Fatal(err)
		}
		if len(read.Result.Contents) != 1 || read.Result.Contents[0].Text != string(set.Bytes()) {
			t.Fatalf("mandate://manifest over the TypeScript client differs from the embedded manifest (%d contents)", len(read.Result.Contents))
		}
	})

	// Hosts list tools first, and the TypeScript SDK then validates every
	// result of a listed tool against its outputSchema — isError results
	// included. A refusal carries no structuredContent, so each one below
	// reaches the client as a result, with its code and stage.
	t.Run("refusals of listed tools reach a client that listed them", func(t *testing.T) {
		out := dev.client(t, node, "support-bot@alice", "none", `{"op":"list"}`,
			`{"op":"call","name":"ticket.search","arguments":{"query":"x","page_size":100000}}`,
			`{"op":"call","name":"ticket.get","arguments":{"ticket_id":"T-9999"}}`,
			`{"op":"call","name":"expense.report.submit","arguments":{"report_id":"ER-2003","note":"again"}}`,
			`{"op":"call","name":"ticket.search","arguments":{"query":"x"},"meta":{"mandate.dev/conversation":"`+strings.Repeat("c", 300)+`"}}`)
		for i, want := range []struct{ stage, code string }{
			{"schema_validate", "schema.invalid"},
			{"state_check", "state.not_found"},
			{"", ""}, // the backend's state guard; any refusal code
			{"request_check", "request.invalid_metadata"},
		} {
			ref := out.step(t, i+1, "call", true).Result.refusal(t)
			if ref.InvocationID == "" || (want.code != "" && (ref.Code != want.code || ref.Stage != want.stage)) {
				t.Errorf("step %d: refusal %+v, want %s at %s", i+1, ref, want.code, want.stage)
			}
		}
	})

	// The README walk-through's refusals, over MCP with a client that
	// listed its tools first, as hosts do: each shows its stage and code.
	t.Run("the walk-through's refusals over MCP", func(t *testing.T) {
		for _, c := range []struct {
			who, tool, args, stage, code string
		}{
			{"support-bot@alice", "ticket.refund", nodeRefund, "permission_check", "authorization.permission_denied"},
			{"finance-bot@carol", "ticket.refund", nodeRefund, "confirmation_check", "confirmation.required"},
			{"dave", "expense.report.submit", `{"report_id":"ER-2001","note":"x"}`, "entitlement_check", "entitlement.missing"},
			{"alice", "ticket.get", `{"ticket_id":"T-9999"}`, "state_check", "state.not_found"},
		} {
			out := dev.client(t, node, c.who, "none", `{"op":"list"}`, `{"op":"call","name":"`+c.tool+`","arguments":`+c.args+`}`)
			ref := out.step(t, 1, "call", true).Result.refusal(t)
			if ref.Stage != c.stage || (c.code != "" && ref.Code != c.code) || ref.InvocationID == "" {
				t.Errorf("%s calling %s: refusal %+v, want %s at %s", c.who, c.tool, ref, c.code, c.stage)
			}
		}
	})

	t.Run("support-bot refund is refused and audited", func(t *testing.T) {
		out := dev.client(t, node, "support-bot@alice", "accept", `{"op":"list"}`,
			`{"op":"call","name":"ticket.refund","arguments":`+nodeRefund+`}`)
		res := out.step(t, 1, "call", true).Result
		ref := res.refusal(t)
		if ref.Code != "authorization.permission_denied" || ref.Stage != "permission_check" || ref.InvocationID == "" {
			t.Fatalf("refusal %+v", ref)
		}
		if len(out.Elicitations) != 0 {
			t.Errorf("a refused call asked for confirmation: %+v", out.Elicitations)
		}
		rows := dev.auditRows(t, ref.InvocationID, 1)
		if rows[0]["outcome"] != "refused" || rows[0]["code"] != "authorization.permission_denied" ||
			rows[0]["channel"] != "mcp" || rows[0]["agent_id"] != "support-bot" {
			t.Fatalf("audit rows %v", rows)
		}
	})

	t.Run("finance-bot refund confirmed through form elicitation", func(t *testing.T) {
		out := dev.client(t, node, "finance-bot@carol", "accept", `{"op":"list"}`,
			`{"op":"call","name":"ticket.refund","arguments":`+nodeRefund+`,"meta":{"mandate.dev/conversation":"node-1"}}`)
		res := out.step(t, 1, "call", true).Result
		if len(out.Elicitations) != 1 {
			t.Fatalf("%d elicitations, want one form: %s", len(out.Elicitations), res.Raw)
		}
		form := out.Elicitations[0]
		// The form asks for nothing: accept is the yes.
		if form.Mode != "form" || !strings.Contains(strings.ToLower(form.Message), "refund") || strings.Contains(string(form.RequestedSchema), `"approve"`) {
			t.Errorf("form %+v", form)
		}
		if strings.Contains(form.Message, "CH4242424242") {
			t.Errorf("the form shows the cardholder reference: %q", form.Message)
		}
		if res.IsError || !strings.Contains(string(res.StructuredContent), "REFUND_STATUS_ACCEPTED") {
			t.Fatalf("refund after accepting the form: %s", res.Raw)
		}
		var inv string
		_ = json.Unmarshal(res.Meta["mandate.dev/invocation_id"], &inv)
		if inv == "" {
			t.Fatalf("no invocation id in %s", res.Raw)
		}
		rows := dev.auditRows(t, inv, 2)
		executed := false
		for _, row := range rows {
			if row["outcome"] == "executed" {
				executed = true
				if appr, _ := row["approval"].(map[string]any); appr == nil || appr["channel"] != "mcp_elicitation" || appr["assurance"] != "client_attested" {
					t.Errorf("executed row's approval %v, want channel mcp_elicitation, assurance client_attested", row["approval"])
				}
			}
		}
		if !executed {
			t.Fatalf("no executed row: %v", rows)
		}
	})

	// payout-bot acts for carol but runs headless: a client that accepts
	// every form is never asked, and refunds nothing; the human approves on
	// the page, signed in.
	t.Run("headless payout-bot's auto-accepting client refunds nothing", func(t *testing.T) {
		out := dev.client(t, node, "payout-bot@carol", "accept", `{"op":"list"}`,
			`{"op":"call","name":"ticket.refund","arguments":`+nodeRefund+`}`)
		ref := out.step(t, 1, "call", true).Result.refusal(t)
		if len(out.Elicitations) != 0 || ref.Code != "confirmation.required" || ref.ApprovalURL == "" || ref.InvocationID == "" {
			t.Fatalf("headless agent: %d elicitations, refusal %+v", len(out.Elicitations), ref)
		}
		for _, row := range dev.auditRows(t, ref.InvocationID, 1) {
			if row["outcome"] != "refused" || row["phase"] == "intent" {
				t.Fatalf("a headless agent's refund reached the backend: %v", row)
			}
		}
	})

	t.Run("finance-bot refund declined through form elicitation", func(t *testing.T) {
		out := dev.client(t, node, "finance-bot@carol", "decline", `{"op":"list"}`,
			`{"op":"call","name":"ticket.refund","arguments":`+nodeRefund+`}`)
		ref := out.step(t, 1, "call", true).Result.refusal(t)
		if len(out.Elicitations) != 1 || ref.Code != "confirmation.refused" || ref.InvocationID == "" {
			t.Fatalf("declined form: %d elicitations, refusal %+v", len(out.Elicitations), ref)
		}
		for _, row := range dev.auditRows(t, ref.InvocationID, 1) {
			if row["outcome"] == "executed" || row["phase"] == "intent" {
				t.Fatalf("a declined refund reached the backend: %v", row)
			}
		}
	})
}

// nodeOrSkip returns the node binary, or skips (fails under
// MANDATE_REQUIRE_NODE=1) when node or the client's dependencies are
// missing.
func nodeOrSkip(t *testing.T) string {
	t.Helper()
	missing := func(why string) {
		if os.Getenv("MANDATE_REQUIRE_NODE") == "1" {
			t.Fatalf("MANDATE_REQUIRE_NODE=1 but %s", why)
		}
		t.Skip(why)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not on PATH")
	}
	if _, err := os.Stat(filepath.Join("node", "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		missing("tests/node/node_modules lacks @modelcontextprotocol/sdk; run npm ci --prefix tests/node")
	}
	return node
}

// nodeDev is a running `mandate dev` and its tokens.
type nodeDev = devProcess

// startNodeDev runs `mandate dev` on free ports until the test ends.
func startNodeDev(t *testing.T) *nodeDev {
	t.Helper()
	return startDev(t, "--log-level", "info")
}

// nodeOutput is what client.mjs prints.
type nodeOutput struct {
	Server struct {
		Info struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"info"`
		ProtocolVersion string `json:"protocolVersion"`
		SessionID       string `json:"sessionId"`
	} `json:"server"`
	Steps        []json.RawMessage `json:"steps"`
	Elicitations []struct {
		Mode            string          `json:"mode"`
		Message         string          `json:"message"`
		RequestedSchema json.RawMessage `json:"requestedSchema"`
	} `json:"elicitations"`
}

// nodeStep is one step of the output.
type nodeStep struct {
	Op    string `json:"op"`
	OK    bool   `json:"ok"`
	Tools []struct {
		Name        string          `json:"name"`
		InputSchema json.RawMessage `json:"inputSchema"`
	} `json:"tools"`
	Result nodeResult `json:"result"`
	Error  struct {
		Code    *int64          `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
	Raw string `json:"-"`
}

// nodeResult is a tools/call or resources/read result.
type nodeResult struct {
	IsError           bool                       `json:"isError"`
	StructuredContent json.RawMessage            `json:"structuredContent"`
	Meta              map[string]json.RawMessage `json:"_meta"`
	Contents          []struct {
		URI  string `json:"uri"`
		Text string `json:"text"`
	} `json:"contents"`
	Raw string `json:"-"`
}

// nodeRefusal is the refusal of an isError result (its `_meta`
// mandate.dev/refusal).
type nodeRefusal struct {
	Code         string `json:"code"`
	Stage        string `json:"stage"`
	InvocationID string `json:"invocation_id"`
	ApprovalURL  string `json:"approval_url"`
}

func (r nodeResult) refusal(t *testing.T) nodeRefusal {
	t.Helper()
	var ref nodeRefusal
	if !r.IsError || len(r.StructuredContent) != 0 || json.Unmarshal(r.Meta["mandate.dev/refusal"], &ref) != nil || ref.Code == "" {
		t.Fatalf("want an isError result with a refusal, got %s", r.Raw)
	}
	return ref
}

// step decodes step i and checks its op and whether it succeeded.
func (o *nodeOutput) step(t *testing.T, i int, op string, ok bool) nodeStep {
	t.Helper()
	if i >= len(o.Steps) {
		t.Fatalf("no step %d in %d steps", i, len(o.Steps))
	}
	var s nodeStep
	if err := json.Unmarshal(o.Steps[i], &s); err != nil {
		t.Fatalf("step %d: %v: %s", i, err, o.Steps[i])
	}
	s.Raw = string(o.Steps[i])
	s.Result.Raw = s.Raw
	if s.Op != op || s.OK != ok {
		t.Fatalf("step %d: want op %s ok=%v, got %s", i, op, ok, s.Raw)
	}
	return s
}

// client runs client.mjs as the named dev principal with the given steps.
func (d *nodeDev) client(t *testing.T, node, who, elicit string, steps ...string) *nodeOutput {
	t.Helper()
	tok := d.tokens[who]
	if tok == "" {
		t.Fatalf("no dev token for %s", who)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "client.mjs", "["+strings.Join(steps, ",")+"]")
	cmd.Dir = "node"
	// The token goes through the environment, never the command line.
	cmd.Env = append(os.Environ(), "MCP_URL="+d.base+"/mcp", "MCP_TOKEN="+tok, "MCP_ELICIT="+elicit, "MCP_TIMEOUT_MS=30000")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node client.mjs as %s: %v\nstderr: %s\nstdout: %s", who, err, tail(stderr.String(), 4000), tail(stdout.String(), 2000))
	}
	var out nodeOutput
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("client.mjs output: %v\n%s\nstderr: %s", err, tail(stdout.String(), 2000), tail(stderr.String(), 2000))
	}
	return &out
}

// goTools lists the principal's tools with the Go SDK client.
func (d *nodeDev) goTools(t *testing.T, who string) []*mcp.Tool {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "go-compare", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: d.base + "/mcp", HTTPClient: &http.Client{Transport: bearer{d.tokens[who]}}, DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.Close() }()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.Tools
}

// auditRows reads an invocation's audit rows over REST as olive (who
// holds audit.read), waiting for at least want of them (the outcome of a
// successful call is written after the reply).
func (d *nodeDev) auditRows(t *testing.T, invocation string, want int) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := do(t, http.MethodGet, d.base+"/v1/audit/invocations/"+invocation, d.tokens["olive"], "")
		if code != http.StatusOK {
			t.Fatalf("GET /v1/audit/invocations/%s: %d %v", invocation, code, body)
		}
		raw, _ := body["records"].([]any)
		if len(raw) >= want || time.Now().After(deadline) {
			rows := make([]map[string]any, 0, len(raw))
			for _, r := range raw {
				if m, ok := r.(map[string]any); ok {
					rows = append(rows, m)
				}
			}
			if len(rows) < want {
				t.Fatalf("%d audit rows for %s, want %d: %v", len(rows), invocation, want, rows)
			}
			return rows
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// canonicalJSON re-encodes JSON (object keys sorted) for comparison.
func canonicalJSON(t *testing.T, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var x any
	if err := json.Unmarshal(raw, &x); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(x)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
