package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/internal/manifest"
)

// TestDevRunsEveryExample starts `mandate dev` (the README's first command)
// and runs every command's declared example as written, as the user the
// demo directory allows, through human approval where declared.
func TestDevRunsEveryExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dev := startDev(t)
	base, tokens, tokensFile, out := dev.base, dev.tokens, dev.tokensFile, dev.out
	for _, name := range []string{"alice", "bob", "carol", "olive", "dave", "support-bot@alice", "finance-bot@carol"} {
		if tokens[name] == "" {
			t.Fatalf("no token for %s in %s", name, tokensFile)
		}
	}
	if !strings.Contains(out.String(), "/approve/login?t=") {
		t.Fatalf("no sign-in links printed:\n%s", out.String())
	}

	// The sample's own REST route runs through the governed proxy.
	code, body := do(t, http.MethodGet, base+"/v1/tickets?query=charged%20twice", tokens["alice"], "")
	if code != 200 || !strings.Contains(fmt.Sprint(body), "T-1001") {
		t.Fatalf("GET /v1/tickets: %d %v", code, body)
	}
	code, body = do(t, http.MethodPost, base+"/v1/tickets/T-1001:refund", tokens["support-bot@alice"],
		`{"amount":{"currency_code":"EUR","amount_minor":"100"},"reason":"dup","cardholder_reference":"CH4242424242"}`)
	if code != 403 || body["code"] != "authorization.permission_denied" {
		t.Fatalf("support-bot refund over the sample's route: %d %v", code, body)
	}
	if code, _ := do(t, http.MethodGet, base+"/openapi.json", "", ""); code != 200 {
		t.Fatalf("/openapi.json: %d", code)
	}
	// The MCP endpoint wants a bearer token.
	if code, _ := do(t, http.MethodPost, base+"/mcp", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`); code != 401 {
		t.Fatalf("/mcp without a token: %d", code)
	}

	// An agent over MCP with the real SDK client: its list, a read, and a
	// refund it may not make (refused by the executor, not by the list).
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: base + "/mcp", HTTPClient: &http.Client{Transport: bearer{tokens["support-bot@alice"]}}, DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		t.Fatalf("MCP connect: %v", err)
	}
	defer func() { _ = cs.Close() }()
	listed, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range listed.Tools {
		names = append(names, tool.Name)
	}
	if got := strings.Join(names, ","); !strings.Contains(got, "ticket.search") || strings.Contains(got, "ticket.refund") {
		t.Fatalf("support-bot's tools: %s", got)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ticket.search", Arguments: json.RawMessage(`{"query":"charged twice"}`)})
	if err != nil || res.IsError || !strings.Contains(fmt.Sprint(res.StructuredContent), "T-1001") {
		t.Fatalf("MCP ticket.search: %v %+v", err, res)
	}
	res, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ticket.refund",
		Arguments: json.RawMessage(`{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"100"},"reason":"dup","cardholder_reference":"CH4242424242"}`)})
	if err != nil || !res.IsError || res.StructuredContent != nil || !strings.Contains(fmt.Sprint(res.Meta["mandate.dev/refusal"]), "authorization.permission_denied") {
		t.Fatalf("MCP ticket.refund as support-bot: %v %+v", err, res)
	}

	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	runAs := map[string]string{
		"ticket.search": "alice", "ticket.get": "alice", "ticket.refund": "carol",
		"expense.report.create": "alice", "expense.report.submit": "alice", "expense.report.recall": "alice",
		"expense.report.approve": "bob", "ops.review": "olive", "customer.erase": "carol",
	}
	// holders name a demo user holding each permission a four-eyes approver policy asks for.
	holders := map[string]string{"privacy.approve": "olive"}
	pages := map[string]*approvalPage{}
	for _, c := range set.Commands() {
		for _, ex := range c.Examples {
			t.Run(c.Code+"/"+ex.Description, func(t *testing.T) {
				user, ok := runAs[c.Code]
				if !ok {
					t.Fatalf("no demo user for %s", c.Code)
				}
				url := base + "/v1/commands/" + c.Code + ":execute"
				code, body := do(t, http.MethodPost, url, tokens[user], `{"input":`+string(ex.Input)+`}`)
				if c.ConfirmationRequired && (code != 422 || body["code"] != "confirmation.required") {
					t.Fatalf("%s as %s ran without asking a human: %d %v", c.Code, user, code, body)
				}
				if code == 422 && body["code"] == "confirmation.required" {
					challenge := body["challenge_id"].(string)
					if !strings.HasPrefix(body["approval_url"].(string), base+"/approve/") {
						t.Fatalf("approval URL %v", body["approval_url"])
					}
					approver := user
					if c.Approver.Kind == "PERMISSION_HOLDER" {
						if approver = holders[c.Approver.Permission]; approver == "" {
							t.Fatalf("no demo user holds %s to approve %s", c.Approver.Permission, c.Code)
						}
					}
					if c.Risk == "L4" {
						// L4 is approved by a signed-in human on the approval page, never
						// through the API.
						if pages[approver] == nil {
							pages[approver] = signIn(t, base, out.String(), approver)
						}
						pages[approver].approve(t, challenge)
					} else if code, body := do(t, http.MethodPost, base+"/v1/challenges/"+challenge+":decide", tokens[approver], `{"decision":"DECISION_APPROVE"}`); code != 200 {
						t.Fatalf("approve: %d %v", code, body)
					}
					code, body = do(t, http.MethodPost, url, tokens[user], `{"input":`+string(ex.Input)+`,"approval_grant_id":"`+challenge+`"}`)
				}
				if code != 200 {
					t.Fatalf("%s as %s: %d %v", c.Code, user, code, body)
				}
			})
		}
	}
}

// approvalPage is a human signed in on the approval page, with the session
// cookie a browser would keep.
type approvalPage struct {
	base   string
	client *http.Client
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// signIn opens the one-time sign-in link `mandate dev` printed for user.
func signIn(t *testing.T, base, devOutput, user string) *approvalPage {
	t.Helper()
	var link string
	for _, line := range strings.Split(devOutput, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == user && strings.Contains(f[1], "/approve/login?t=") {
			link = f[1]
		}
	}
	if link == "" {
		t.Fatalf("mandate dev printed no sign-in link for %s", user)
	}
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &approvalPage{base: base, client: &http.Client{Jar: jar}}
	if code, page := p.get(t, link); code != 200 || !strings.Contains(page, "signed in as "+user) {
		t.Fatalf("%s signing in: %d\n%s", user, code, page)
	}
	return p
}

func (p *approvalPage) get(t *testing.T, target string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, target, nil)
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// approve presses Approve on the challenge's page, as the signed-in human.
func (p *approvalPage) approve(t *testing.T, challenge string) {
	t.Helper()
	page := p.base + "/approve/" + challenge
	code, html := p.get(t, page)
	m := csrfRE.FindStringSubmatch(html)
	if code != 200 || m == nil || !strings.Contains(html, `id="approve"`) {
		t.Fatalf("approval page of %s: %d, no Approve button\n%s", challenge, code, html)
	}
	form := url.Values{"csrf": {m[1]}, "decision": {"approve"}}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, page, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := p.client.Do(req) // follows the redirect back to the challenge
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `data-state="APPROVED"`) {
		t.Fatalf("approving %s on the page: %d\n%s", challenge, resp.StatusCode, b)
	}
}

// bearer adds a bearer token to every request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// syncBuffer is a bytes.Buffer the child's output goroutine and the test
// can share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func do(t *testing.T, method, url, tok, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
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

// getUntil GETs url as tok until ready holds of the answer, for up to 10s,
// and returns the last answer: a call's outcome row, and a replay's row,
// are written after its reply, so a read right after the call may come
// before them.
func getUntil(t *testing.T, url, tok string, ready func(code int, body map[string]any) bool) (int, map[string]any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := do(t, http.MethodGet, url, tok, "")
		if ready(code, body) || time.Now().After(deadline) {
			return code, body
		}
		time.Sleep(20 * time.Millisecond)
	}
}
