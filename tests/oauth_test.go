package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mandate-dev/mandate/internal/browsertest"
)

// oauthEvent is one line tests/node/oauth.mjs prints.
type oauthEvent struct {
	Event string            `json:"event"`
	URL   string            `json:"url"`
	Query map[string]string `json:"query"`
	// done
	ClientID        string `json:"clientId"`
	TokenType       string `json:"tokenType"`
	HasRefreshToken bool   `json:"hasRefreshToken"`
	Claims          struct {
		Sub    string `json:"sub"`
		Tenant string `json:"tenant"`
		Act    struct {
			Sub   string `json:"sub"`
			Model string `json:"mandate_model"`
		} `json:"act"`
	} `json:"claims"`
	Requests []struct {
		Method string `json:"method"`
		Path   string `json:"path"`
		Status int    `json:"status"`
	} `json:"requests"`
	Tools        []string   `json:"tools"`
	Call         nodeResult `json:"call"`
	RevokeStatus int        `json:"revokeStatus"`
	AfterRevoke  struct {
		Result *nodeResult `json:"result"`
		Error  *struct {
			Code    int64  `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	} `json:"afterRevoke"`
	Raw string `json:"-"`
}

// TestOAuthConnectsAnMCPHost: the official TypeScript SDK's OAuth client
// provider connects to `mandate dev` with no token, as Claude Code, VS Code
// or Cursor do. From the 401 it discovers the protected-resource metadata
// and the authorization server, registers, and sends the human to the
// authorization URL; in headless Chromium carol signs in with the dev
// sign-in and allows the client on the consent page; the browser comes back
// to the script's loopback redirect URI, the code becomes a token, and the
// client lists carol's tools and searches tickets, audited under its new
// agent. Revoking its refresh token disables the agent: the next call is
// refused although the access token is still valid. It skips without node
// or Chromium unless MANDATE_REQUIRE_NODE=1 / MANDATE_REQUIRE_BROWSER=1.
func TestOAuthConnectsAnMCPHost(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary, node and a browser")
	}
	node := nodeOrSkip(t)
	chrome := browsertest.Chromium(t)
	dev := startDev(t, "--log-level", "info")

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "oauth.mjs")
	cmd.Dir = "node"
	cmd.Env = append(os.Environ(), "MCP_URL="+dev.base+"/mcp", "MCP_TIMEOUT_MS=90000")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	events := make(chan oauthEvent, 8)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e oauthEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				e = oauthEvent{Event: "unparsable"}
			}
			e.Raw = sc.Text()
			events <- e
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("oauth.mjs stderr:\n%s", tail(stderr.String(), 4000))
		}
	})
	next := func(want string) oauthEvent {
		t.Helper()
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatalf("oauth.mjs ended before %q: %s", want, tail(stderr.String(), 2000))
			}
			if e.Event != want {
				t.Fatalf("oauth.mjs: want event %q, got %s", want, e.Raw)
			}
			return e
		case <-time.After(60 * time.Second):
			t.Fatalf("oauth.mjs: no %q event", want)
		}
		return oauthEvent{}
	}

	// The authorization URL the SDK built from discovery.
	authz := next("authorize")
	u, err := url.Parse(authz.URL)
	if err != nil || u.Scheme+"://"+u.Host+u.Path != dev.base+"/authorize" {
		t.Fatalf("authorization URL %q", authz.URL)
	}
	q := u.Query()
	if q.Get("response_type") != "code" || q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" ||
		q.Get("resource") != dev.base+"/mcp" || q.Get("state") == "" || !strings.HasPrefix(q.Get("redirect_uri"), "http://127.0.0.1:") {
		t.Fatalf("authorization request %v", q)
	}

	// The human: sign in as carol, read the consent page, allow.
	browser := headlessChromium(t, chrome, 60*time.Second)
	if err := chromedp.Do(browser,
		chromedp.Navigate(authz.URL),
		chromedp.WaitVisible(chromedp.ID("signin-acme-carol")),
		chromedp.Click(chromedp.ID("signin-acme-carol")),
		chromedp.WaitVisible(chromedp.ID("approve")),
	); err != nil {
		t.Fatalf("signing in as carol: %v", err)
	}
	consent, err := chromedp.Run(browser, chromedp.Text(chromedp.ID("consent")))
	if err != nil {
		t.Fatal(err)
	}
	attr, err := chromedp.Run(browser, chromedp.AttributeValue(chromedp.ID("consent"), "data-agent"))
	if err != nil {
		t.Fatal(err)
	}
	agent := attr.Value
	if err := chromedp.Do(browser,
		chromedp.Click(chromedp.ID("approve")),
		chromedp.WaitVisible(chromedp.ID("done")),
	); err != nil {
		t.Fatalf("allowing the client: %v", err)
	}
	for _, want := range []string{"Mandate OAuth test", "asks to act for you", "carol", "Allow"} {
		if !strings.Contains(consent, want) {
			t.Errorf("the consent page does not say %q:\n%s", want, consent)
		}
	}
	if !strings.HasPrefix(agent, "mandate-oauth-test-") {
		t.Errorf("consent page names agent %q", agent)
	}

	cb := next("callback")
	if cb.Query["code"] != "(present)" || cb.Query["iss"] != dev.base || cb.Query["error"] != "" {
		t.Fatalf("redirect back: %v", cb.Query)
	}

	out := next("done")
	// Discovery went the way the spec lays out.
	var trail []string
	for _, r := range out.Requests {
		trail = append(trail, r.Method+" "+r.Path)
	}
	for _, want := range []string{"POST /mcp", "GET /.well-known/oauth-protected-resource/mcp", "GET /.well-known/oauth-authorization-server", "POST /register", "POST /token"} {
		if !slices.Contains(trail, want) {
			t.Errorf("the SDK never sent %s: %v", want, trail)
		}
	}
	if len(out.Requests) == 0 || out.Requests[0].Path != "/mcp" || out.Requests[0].Status != 401 {
		t.Errorf("the first request was not a 401 from /mcp: %+v", out.Requests)
	}
	if out.TokenType != "Bearer" || !out.HasRefreshToken || out.Claims.Sub != "carol" || out.Claims.Tenant != "acme" ||
		out.Claims.Act.Sub != agent || out.Claims.Act.Model != "" || !strings.HasPrefix(out.ClientID, "mcp-") {
		t.Fatalf("tokens: %s", out.Raw)
	}
	// carol's tools (finance: ticket.read, payment.refund, customer.erase).
	for _, want := range []string{"ticket.search", "ticket.refund"} {
		if !slices.Contains(out.Tools, want) {
			t.Errorf("tools %v lack %s", out.Tools, want)
		}
	}
	if slices.Contains(out.Tools, "ops.review") {
		t.Errorf("the agent sees more than carol may call: %v", out.Tools)
	}
	if out.Call.IsError || !strings.Contains(string(out.Call.StructuredContent), `"T-1001"`) {
		t.Fatalf("ticket.search: %s", out.Raw)
	}
	var inv string
	_ = json.Unmarshal(out.Call.Meta["mandate.dev/invocation_id"], &inv)
	if inv == "" {
		t.Fatalf("no invocation id: %s", out.Raw)
	}
	rows := dev.auditRows(t, inv, 1)
	for _, row := range rows {
		if row["agent_id"] != agent || row["user_id"] != "carol" || row["channel"] != "mcp" {
			t.Errorf("audit row does not name the new agent %s acting for carol: %v", agent, row)
		}
	}

	// Revoked: the agent is disabled and its next call refused at once.
	if out.RevokeStatus != 200 {
		t.Fatalf("revocation: %d", out.RevokeStatus)
	}
	after := out.AfterRevoke
	if after.Result == nil {
		t.Fatalf("the call after revocation failed outright instead of being refused: %s", out.Raw)
	}
	after.Result.Raw = out.Raw
	ref := after.Result.refusal(t)
	if ref.Code != "authorization.principal_inactive" || ref.InvocationID == "" {
		t.Fatalf("call after revocation: %+v", ref)
	}
	for _, row := range dev.auditRows(t, ref.InvocationID, 1) {
		if row["outcome"] != "refused" || row["agent_id"] != agent {
			t.Errorf("the revoked agent's call is not a refused row of %s: %v", agent, row)
		}
	}
}
