package tests

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// oauthApp is an outside app that registers itself over dynamic client
// registration (no credentials, any name it likes) and is allowed by a
// demo user on the consent page of `mandate dev`.
type oauthApp struct {
	t        *testing.T
	base     string
	clientID string
	redirect string
}

func registerApp(t *testing.T, base, name string) *oauthApp {
	t.Helper()
	app := &oauthApp{t: t, base: base, redirect: "http://127.0.0.1:9/callback"}
	b, _ := json.Marshal(map[string]any{"client_name": name, "redirect_uris": []string{app.redirect}})
	resp, err := http.Post(base+"/register", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var reg map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&reg)
	if resp.StatusCode != http.StatusCreated || reg["client_id"] == nil {
		t.Fatalf("registration: %d %v", resp.StatusCode, reg)
	}
	app.clientID = reg["client_id"].(string)
	return app
}

var (
	hiddenReq  = regexp.MustCompile(`name="req" value="([^"]+)"`)
	hiddenCSRF = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
)

// connect runs the browser part as user of tenant — sign in, read the
// consent page, press Allow, with the opt-in ticked when attest — and
// exchanges the code. It returns the consent page's text and the token.
func (a *oauthApp) connect(tenant, user string, attest bool) (consent, token string) {
	a.t.Helper()
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	verifier := strings.Repeat("v", 50)
	sum := sha256.Sum256([]byte(verifier))
	q := url.Values{"response_type": {"code"}, "client_id": {a.clientID}, "redirect_uri": {a.redirect}, "state": {"s"},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}, "resource": {a.base + "/mcp"}}
	// get returns the page's Location header and body.
	get := func(u string) (string, string) {
		resp, err := browser.Get(u)
		if err != nil {
			a.t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.Header.Get("Location"), string(b)
	}
	// post submits a form that must redirect and returns where to.
	post := func(path string, form url.Values) string {
		resp, err := browser.PostForm(a.base+path, form)
		if err != nil {
			a.t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		if resp.StatusCode != http.StatusSeeOther {
			a.t.Fatalf("POST %s: %d", path, resp.StatusCode)
		}
		return resp.Header.Get("Location")
	}
	field := func(re *regexp.Regexp, page string) string {
		m := re.FindStringSubmatch(page)
		if m == nil {
			a.t.Fatalf("no %s on the page:\n%s", re, page)
		}
		return m[1]
	}
	loc, _ := get(a.base + "/authorize?" + q.Encode())
	_, signin := get(a.base + loc)
	loc = post("/authorize/signin", url.Values{"req": {field(hiddenReq, signin)}, "csrf": {field(hiddenCSRF, signin)}, "tenant": {tenant}, "user": {user}})
	_, consent = get(a.base + loc)
	form := url.Values{"req": {field(hiddenReq, consent)}, "csrf": {field(hiddenCSRF, consent)}, "decision": {"approve"}}
	if attest {
		form.Set("attest", "yes")
	}
	back, err := url.Parse(post("/authorize/consent", form))
	if err != nil || back.Query().Get("code") == "" {
		a.t.Fatalf("consent redirect %v %v", back, err)
	}
	tok, err := http.PostForm(a.base+"/token", url.Values{"grant_type": {"authorization_code"}, "client_id": {a.clientID},
		"code": {back.Query().Get("code")}, "redirect_uri": {a.redirect}, "code_verifier": {verifier}})
	if err != nil {
		a.t.Fatal(err)
	}
	defer func() { _ = tok.Body.Close() }()
	var body map[string]any
	_ = json.NewDecoder(tok.Body).Decode(&body)
	if tok.StatusCode != http.StatusOK || body["access_token"] == nil {
		a.t.Fatalf("token: %d %v", tok.StatusCode, body)
	}
	return consent, body["access_token"].(string)
}

// TestOAuthAppCannotApproveItself is the self-approval of the third
// outside round, as a test. An app registers itself with no credentials as
// "Claude Code", carol allows it once, and the app calls ticket.refund (L3)
// over MCP 2026-07-28 with a client that accepts every confirmation form
// (what a hostile agent runtime does). Without carol's opt-in the app is
// headless: it is never shown a form, the call is refused
// confirmation.required with the approval page's URL, and no refund runs.
// With the opt-in its accept counts — up to the tenant's trust ceiling:
// acme sets L3, so the refund runs once with assurance client_attested;
// globex keeps the default L2, so dave's opted-in app is again refused
// without a form. Every attempt leaves its audit row.
func TestOAuthAppCannotApproveItself(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dev := startDev(t)
	executed := func() int {
		t.Helper()
		code, body := do(t, http.MethodGet, dev.base+"/v1/audit/records?command=ticket.refund&outcomes=executed&phase=outcome", dev.tokens["olive"], "")
		if code != http.StatusOK {
			t.Fatalf("audit query: %d %v", code, body)
		}
		recs, _ := body["records"].([]any)
		return len(recs)
	}
	call := func(token, input string) (*autoAccept, *mcp.CallToolResult) {
		t.Helper()
		acc := &autoAccept{}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "Claude Code", Version: "1"}, &mcp.ClientOptions{ElicitationHandler: acc.handler}).
			Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: dev.base + "/mcp", HTTPClient: &http.Client{Transport: bearer{token}}},
				&mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
		if err != nil {
			t.Fatalf("MCP connect: %v", err)
		}
		defer func() { _ = cs.Close() }()
		if _, err := cs.ListTools(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		return acc, callTool(t, cs, "ticket.refund", input, nil)
	}

	app := registerApp(t, dev.base, "Claude Code")
	consent, token := app.connect("acme", "carol", false)
	for _, words := range []string{
		"Mandate asks you on its own approval page, where you sign in yourself. The application cannot answer for you there.",
		"This app asks me in its own window, and my answer there counts as mine — for commands up to risk L3.",
	} {
		if !strings.Contains(consent, words) {
			t.Errorf("the consent page does not say %q", words)
		}
	}
	if strings.Contains(consent, "still ask you") {
		t.Error("the consent page still promises what it does not do")
	}
	acc, res := call(token, refundInput)
	m := wantToolRefusal(t, res, "confirmation_check", "confirmation.required")
	if acc.forms != 0 || m["approval_url"] == "" {
		t.Fatalf("the headless app was shown %d forms; refusal %v", acc.forms, m)
	}
	if n := executed(); n != 0 {
		t.Fatalf("the app approved its own refund: %d executed", n)
	}

	// carol opts in: up to acme's ceiling (L3) the app's answer is hers.
	_, token = app.connect("acme", "carol", true)
	acc, res = call(token, refundInput)
	if res.IsError || acc.forms != 1 {
		t.Fatalf("the opted-in app under the ceiling: %d forms, %s", acc.forms, jsonOf(res))
	}
	inv, _ := res.Meta["mandate.dev/invocation_id"].(string)
	code, body := getUntil(t, dev.base+"/v1/audit/invocations/"+inv, dev.tokens["olive"], func(code int, body map[string]any) bool {
		return code == http.StatusOK && strings.Contains(jsonOf(body), `"phase":"outcome"`)
	})
	if code != http.StatusOK || !strings.Contains(jsonOf(body), `"assurance":"client_attested"`) || !strings.Contains(jsonOf(body), `"trust_ceiling":"L3"`) {
		t.Fatalf("the executed refund's rows: %d %s", code, jsonOf(body))
	}
	if n := executed(); n != 1 {
		t.Fatalf("%d executed refunds, want 1", n)
	}

	// dave's tenant keeps the default ceiling, L2: above it, even an
	// opted-in app is not shown a form.
	other := registerApp(t, dev.base, "Claude Code")
	consent, token = other.connect("globex", "dave", true)
	if !strings.Contains(consent, "for commands up to risk L2.") {
		t.Errorf("globex's consent page does not name the default ceiling")
	}
	// globex's T-1001 was paid in USD: a refund in EUR would be refused by
	// the helpdesk's preview before anyone is asked.
	acc, res = call(token, strings.Replace(refundInput, "EUR", "USD", 1))
	m = wantToolRefusal(t, res, "confirmation_check", "confirmation.required")
	if acc.forms != 0 || m["approval_url"] == "" {
		t.Fatalf("an L3 call above the default ceiling showed %d forms; refusal %v", acc.forms, m)
	}
}
