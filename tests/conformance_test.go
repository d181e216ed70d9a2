package tests

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// mcpClients locates the real MCP clients of tests/mcpclients (npm ci
// --prefix tests/mcpclients): Node 22 from the registry's node package, the
// MCP conformance suite and the MCP Inspector CLI. It skips without them
// unless MANDATE_REQUIRE_NODE=1.
type mcpClients struct{ node, conformance, inspector string }

func findMCPClients(t *testing.T) mcpClients {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary and node")
	}
	dir, _ := filepath.Abs(filepath.Join("mcpclients", "node_modules"))
	c := mcpClients{
		node:        filepath.Join(dir, "node", "bin", "node"),
		conformance: filepath.Join(dir, "@modelcontextprotocol", "conformance", "dist", "index.js"),
		inspector:   filepath.Join(dir, ".bin", "mcp-inspector"),
	}
	for _, f := range []string{c.node, c.conformance, c.inspector} {
		if _, err := os.Stat(f); err != nil {
			if os.Getenv("MANDATE_REQUIRE_NODE") == "1" {
				t.Fatalf("%s is missing: run npm ci --prefix tests/mcpclients", f)
			}
			t.Skipf("%s is missing (npm ci --prefix tests/mcpclients)", f)
		}
	}
	return c
}

// bearerProxy serves a reverse proxy to base on a free loopback port that
// adds tok as the bearer token of every request that has none, keeping the
// Host header the client sent (the DNS-rebinding scenario sends forged
// ones). The conformance suite cannot send headers itself.
func bearerProxy(t *testing.T, base, tok string) string {
	t.Helper()
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	p := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = r.In.Host
			if r.Out.Header.Get("Authorization") == "" {
				r.Out.Header.Set("Authorization", "Bearer "+tok)
			}
		},
		FlushInterval: -1, // SSE streams pass through as they come
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

var conformanceResult = regexp.MustCompile(`Passed: (\d+)/(\d+), (\d+) failed`)

// TestMCPConformance runs the official MCP conformance suite
// (@modelcontextprotocol/conformance, on Node 22) against `mandate dev`'s
// MCP endpoint, as support-bot@alice: every scenario that needs no fixture
// tool must pass every check.
func TestMCPConformance(t *testing.T) {
	c := findMCPClients(t)
	dev := startDev(t)
	endpoint := bearerProxy(t, dev.base, dev.tokens["support-bot@alice"]) + "/mcp"
	for _, scenario := range []string{
		"server-initialize", "ping", "logging-set-level", "tools-list", "resources-list",
		"prompts-list", "server-sse-multiple-streams", "dns-rebinding-protection",
	} {
		t.Run(scenario, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, c.node, c.conformance, "server", "--url", endpoint, "--scenario", scenario).CombinedOutput()
			m := conformanceResult.FindStringSubmatch(string(out))
			if err != nil || m == nil || m[3] != "0" || m[1] != m[2] || m[2] == "0" {
				t.Fatalf("conformance %s: %v\n%s", scenario, err, out)
			}
			t.Logf("%s: passed %s/%s", scenario, m[1], m[2])
		})
	}
}

// TestMCPInspectorCLI drives `mandate dev` with the MCP Inspector CLI on
// Node 22, as a user would from a terminal with a static bearer header:
// the agent's tool list, a call, and refusals that show their stage and
// code in the result's `_meta`.
func TestMCPInspectorCLI(t *testing.T) {
	c := findMCPClients(t)
	dev := startDev(t)
	inspect := func(t *testing.T, who string, args ...string) map[string]any {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		argv := append([]string{c.inspector, "--cli", dev.base + "/mcp", "--transport", "http",
			"--header", "Authorization: Bearer " + dev.tokens[who]}, args...)
		cmd := exec.CommandContext(ctx, c.node, argv...)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir()) // its catalog file
		out, _ := cmd.Output()
		// The result is the first JSON document on stdout; a tool result
		// with isError is followed by the CLI's own error line.
		var res map[string]any
		if err := json.NewDecoder(strings.NewReader(string(out))).Decode(&res); err != nil {
			t.Fatalf("inspector %v: %v\n%s", args, err, out)
		}
		return res
	}

	list := inspect(t, "support-bot@alice", "--method", "tools/list")
	tools, _ := list["tools"].([]any)
	var names []string
	for _, tl := range tools {
		if m, ok := tl.(map[string]any); ok {
			names = append(names, m["name"].(string))
		}
	}
	if strings.Join(names, ",") != strings.Join(aliceTools, ",") {
		t.Fatalf("support-bot's tools over the Inspector: %v, want %v", names, aliceTools)
	}

	search := inspect(t, "support-bot@alice", "--method", "tools/call", "--tool-name", "ticket.search", "--tool-arg", "query=charged twice")
	if search["isError"] == true || !strings.Contains(jsonOf(search["structuredContent"]), "T-1001") {
		t.Fatalf("ticket.search over the Inspector: %v", search)
	}

	for _, c := range []struct {
		name, who, stage, code string
		args                   []string
	}{
		{"a listed tool with arguments breaking its schema", "support-bot@alice", "schema_validate", "schema.invalid",
			[]string{"--tool-name", "ticket.search", "--tool-arg", "query=x", "--tool-arg", "page_size=100000"}},
		{"a refund that needs a human", "finance-bot@carol", "confirmation_check", "confirmation.required",
			[]string{"--tool-name", "ticket.refund", "--tool-arg", "ticket_id=T-1001", "--tool-arg", `amount={"currency_code":"EUR","amount_minor":"100"}`,
				"--tool-arg", "reason=dup", "--tool-arg", "cardholder_reference=CH4242424242"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := inspect(t, c.who, append([]string{"--method", "tools/call"}, c.args...)...)
			meta, _ := res["_meta"].(map[string]any)
			ref, _ := meta["mandate.dev/refusal"].(map[string]any)
			if res["isError"] != true || res["structuredContent"] != nil || ref["stage"] != c.stage || ref["code"] != c.code || ref["invocation_id"] == "" {
				t.Fatalf("Inspector result %v, want a refusal %s at %s", res, c.code, c.stage)
			}
		})
	}
}
