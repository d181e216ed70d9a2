// Package tests holds the end-to-end tests: they build the mandate binary
// and run the services as separate processes on loopback against a fresh
// Postgres database, the way deploy/compose runs them.
package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/internal/freeport"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	devSecret     = "e2e-dev-secret-0123456789abcdef0123456789"
	serviceSecret = "e2e-svc-secret-0123456789abcdef0123456789"
)

type stack struct {
	t      *testing.T
	bin    string
	env    []string
	logDir string
	http   map[string]string
}

// freePort returns a loopback address that was free a moment ago and that
// this test binary has not handed out before, below the kernel's ephemeral
// range (see package freeport).
func freePort(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func (s *stack) run(args ...string) string {
	s.t.Helper()
	cmd := exec.Command(s.bin, args...)
	cmd.Env = s.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("mandate %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// start runs a service until the test ends; it must stop cleanly on
// SIGTERM.
func (s *stack) start(name string, args ...string) {
	s.t.Helper()
	grpcAddr, httpAddr := freePort(s.t), freePort(s.t)
	log, err := os.Create(filepath.Join(s.logDir, name+".log"))
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(s.bin, append([]string{name, "--grpc-addr", grpcAddr, "--http-addr", httpAddr}, args...)...)
	cmd.Env, cmd.Stdout, cmd.Stderr = s.env, log, log
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	s.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				s.t.Errorf("%s did not stop cleanly: %v", name, err)
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			s.t.Errorf("%s did not stop within 15s", name)
		}
		_ = log.Close()
		if s.t.Failed() {
			b, _ := os.ReadFile(log.Name())
			s.t.Logf("--- %s log ---\n%s", name, tail(string(b), 4000))
		}
	})
	s.http[name] = httpAddr
	s.http[name+"-grpc"] = grpcAddr
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + httpAddr + "/healthz") //nolint:noctx // test polling
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(log.Name())
			s.t.Fatalf("%s never became healthy:\n%s", name, tail(string(b), 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startBridge starts `mandate mcpbridge` against the catalog, executor and
// confirm processes already started; its MCP endpoint is
// http://<s.http["mcpbridge"]>/mcp.
func (s *stack) startBridge() {
	s.t.Helper()
	s.start("mcpbridge", "--catalog-addr", s.http["catalog-grpc"], "--executor-addr", s.http["executor-grpc"],
		"--confirm-addr", s.http["confirm-grpc"])
}

// mcp opens an MCP session with the bridge process as tok's principal; it
// is closed before the processes stop.
func (s *stack) mcp(tok string) *mcp.ClientSession {
	s.t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: "http://" + s.http["mcpbridge"] + "/mcp", HTTPClient: &http.Client{Transport: bearer{tok}},
	}, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (s *stack) token(args ...string) string {
	return strings.TrimSpace(s.run(append([]string{"token"}, args...)...))
}

func post(t *testing.T, url, tok, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewBufferString(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
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

// TestServicesAsProcesses runs audit, confirm, the helpdesk backend, the
// catalog, the executor and the MCP bridge as separate processes against
// one Postgres database, searches over MCP as an agent, and drives a refund
// from refusal to human approval to execution over REST.
func TestServicesAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	_, url := pgtest.NewURL(t)
	root, _ := filepath.Abs("..")
	bin := mandateBinary(t, root)
	s := &stack{t: t, bin: bin, logDir: t.TempDir(), http: map[string]string{}, env: append(os.Environ(),
		"MANDATE_DATABASE_URL="+url, "MANDATE_DEV_SECRET="+devSecret, "MANDATE_SERVICE_SECRET="+serviceSecret, "MANDATE_MANIFEST=sample")}
	s.run("migrate", "--sample")
	s.run("policy", "apply", "-f", filepath.Join(root, "examples", "policy", "demo.yaml"))

	s.start("audit")
	s.start("confirm", "--audit-addr", s.http["audit-grpc"])
	s.start("helpdesk")
	s.start("catalog")
	s.start("executor",
		"--audit-addr", s.http["audit-grpc"], "--confirm-addr", s.http["confirm-grpc"],
		"--backend", "examples.helpdesk.v1.HelpdeskService="+s.http["helpdesk-grpc"]+",mandate.v1.CatalogService="+s.http["catalog-grpc"])
	s.startBridge()
	execURL := "http://" + s.http["executor"] + "/v1/commands/"

	alice := s.token("--user", "alice", "--tenant", "acme")
	code, body := post(t, execURL+"ticket.search:execute", alice, `{"input":{"query":"charged twice"}}`)
	if code != 200 || !strings.Contains(fmt.Sprint(body["result"]), "T-1001") {
		t.Fatalf("search: %d %v", code, body)
	}

	// The MCP bridge process: support-bot@alice sees alice's tools, not
	// carol's refund, and searches through the executor process.
	bot := s.mcp(s.token("--user", "alice", "--tenant", "acme", "--agent", "support-bot", "--model", "m"))
	tools, err := bot.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, tl := range tools.Tools {
		listed = append(listed, tl.Name)
	}
	if !slices.Contains(listed, "ticket.search") || slices.Contains(listed, "ticket.refund") {
		t.Fatalf("support-bot@alice lists %v", listed)
	}
	res, err := bot.CallTool(context.Background(), &mcp.CallToolParams{Name: "ticket.search", Arguments: map[string]any{"query": "charged twice"}})
	if err != nil || res.IsError || len(res.Content) == 0 || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "T-1001") {
		t.Fatalf("ticket.search over MCP: %v %+v", err, res)
	}

	refund := `{"input":{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"2500"},"reason":"Customer was charged twice","cardholder_reference":"CH4242424242"}`
	supportBot := s.token("--user", "alice", "--tenant", "acme", "--agent", "support-bot", "--model", "m")
	if code, body := post(t, execURL+"ticket.refund:execute", supportBot, refund+"}"); code != 403 || body["code"] != "authorization.permission_denied" {
		t.Fatalf("support-bot refund: %d %v", code, body)
	}

	financeBot := s.token("--user", "carol", "--tenant", "acme", "--agent", "finance-bot", "--model", "m")
	code, body = post(t, execURL+"ticket.refund:execute", financeBot, refund+"}")
	challenge, _ := body["challenge_id"].(string)
	approvalURL, _ := body["approval_url"].(string)
	if code != 422 || body["code"] != "confirmation.required" || challenge == "" || !strings.HasPrefix(approvalURL, "http://"+s.http["confirm"]+"/approve/") {
		t.Fatalf("finance-bot refund: %d %v", code, body)
	}
	// The agent cannot approve; carol can.
	decide := "http://" + s.http["confirm"] + "/v1/challenges/" + challenge + ":decide"
	if code, body := post(t, decide, financeBot, `{"decision":"DECISION_APPROVE"}`); code != 403 || body["code"] != "confirmation.approver_not_allowed" {
		t.Fatalf("agent approving: %d %v", code, body)
	}
	carol := s.token("--user", "carol", "--tenant", "acme")
	if code, body := post(t, decide, carol, `{"decision":"DECISION_APPROVE"}`); code != 200 {
		t.Fatalf("carol approving: %d %v", code, body)
	}
	code, body = post(t, execURL+"ticket.refund:execute", financeBot, refund+`,"approval_grant_id":"`+challenge+`"}`)
	if code != 200 || !strings.Contains(fmt.Sprint(body["result"]), "REFUND_STATUS_ACCEPTED") {
		t.Fatalf("approved refund: %d %v", code, body)
	}
	invocation, _ := body["invocation_id"].(string)

	// The trail, read by the operator tool, shows who did what and who approved.
	var rows []map[string]any
	deadline := time.Now().Add(5 * time.Second)
	for {
		out := s.run("audit", "query", "--tenant", "acme", "--format", "json", "--command", "ticket.refund", "--outcome", "executed")
		var page struct {
			Records []map[string]any `json:"records"`
		}
		if err := json.Unmarshal([]byte(out), &page); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		rows = page.Records
		if len(rows) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(rows) != 1 || rows[0]["InvocationID"] != invocation || !strings.Contains(fmt.Sprint(rows[0]["Approval"]), "carol") || rows[0]["AgentID"] != "finance-bot" {
		t.Fatalf("executed refunds in the trail: %v", rows)
	}
	if strings.Contains(fmt.Sprint(rows), "CH4242424242") {
		t.Fatal("the cardholder reference reached the audit trail")
	}
	if out := s.run("audit", "verify", "--tenant", "acme"); !strings.Contains(out, "intact") {
		t.Fatalf("verify: %s", out)
	}
	// The same through the running audit service's API, with the token of
	// olive (audit.read): the rows of her tenant, the chain intact; carol
	// (no audit.read) is refused, and so is a token for another tenant's
	// --tenant.
	olive := s.token("--user", "olive", "--tenant", "acme")
	viaAPI := s.run("audit", "query", "--audit-addr", s.http["audit-grpc"], "--token", olive, "--format", "json", "--command", "ticket.refund", "--outcome", "executed")
	if !strings.Contains(viaAPI, invocation) || !strings.Contains(viaAPI, `"Approver": "carol"`) {
		t.Fatalf("audit query through the API: %s", viaAPI)
	}
	if out := s.run("audit", "verify", "--audit-addr", s.http["audit-grpc"], "--token", olive); !strings.Contains(out, "chain of the token's tenant intact") {
		t.Fatalf("audit verify through the API: %s", out)
	}
	for _, c := range []struct{ token, tenant, want string }{
		{carol, "", "PermissionDenied"},
		{olive, "globex", "the token reads the trail of tenant acme, not globex"},
	} {
		args := []string{"audit", "query", "--audit-addr", s.http["audit-grpc"], "--token", c.token}
		if c.tenant != "" {
			args = append(args, "--tenant", c.tenant)
		}
		cmd := exec.Command(s.bin, args...)
		cmd.Env = s.env
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), c.want) {
			t.Fatalf("mandate %v: %v, want an error naming %q:\n%s", args, err, c.want, out)
		}
	}

	// `mandate policy simulate` replays this trail: through the policy that
	// recorded it nothing moves; through one where finance may no longer
	// refund, finance-bot's two refund attempts (the one that needed
	// approval and the approved one) are newly refused at permission.
	demo, err := os.ReadFile(filepath.Join(root, "examples", "policy", "demo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	type change struct {
		InvocationID string `json:"invocation_id"`
		Command      string `json:"command"`
		Change       string `json:"change"`
		Now          struct{ Verdict, Stage, Code string }
	}
	simulate := func(policy string, via ...string) (rep struct {
		Attempts, Replayed, Unchanged int
		Changed                       []change
	}) {
		file := filepath.Join(t.TempDir(), "candidate.yaml")
		if err := os.WriteFile(file, []byte(policy), 0o600); err != nil {
			t.Fatal(err)
		}
		out := s.run(append([]string{"policy", "simulate", "--policy", file, "--tenant", "acme", "--since", "1h", "--format", "json"}, via...)...)
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return rep
	}
	if rep := simulate(string(demo)); len(rep.Changed) != 0 || rep.Replayed < 5 || rep.Unchanged != rep.Replayed {
		t.Fatalf("the same policy replayed: %+v", rep)
	}
	noRefunds := strings.Replace(string(demo), "finance: [ticket.read, payment.refund, customer.erase]", "finance: [ticket.read, customer.erase]", 1)
	rep := simulate(noRefunds)
	if viaAPI := simulate(noRefunds, "--audit-addr", s.http["audit-grpc"], "--token", olive); fmt.Sprint(viaAPI) != fmt.Sprint(rep) {
		t.Fatalf("the simulation read through the audit API differs from the one read from the database:\n%+v\n%+v", viaAPI, rep)
	}
	refused := 0
	for _, c := range rep.Changed {
		if c.Change != "newly_refused" || c.Command != "ticket.refund" || c.Now.Stage != "permission_check" || c.Now.Code != "authorization.permission_denied" {
			t.Fatalf("a change other than finance-bot's refunds: %+v", rep)
		}
		refused++
	}
	if refused != 2 || !slices.ContainsFunc(rep.Changed, func(c change) bool { return c.InvocationID == invocation }) {
		t.Fatalf("finance without payment.refund: %+v", rep)
	}
}
