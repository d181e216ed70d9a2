package page_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
	"github.com/mandate-dev/mandate/services/confirm/memory"
	"github.com/mandate-dev/mandate/services/confirm/page"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var devSecret = []byte("dev-secret-0123456789abcdef0123456789")

const issuer = "test"

type fixture struct {
	srv     *httptest.Server
	confirm *confirm.Service
	store   *memory.Store
}

// newFixture serves the page alone (no gRPC) over loopback HTTP, on memory
// stores and the confirmtest directory.
func newFixture(t *testing.T, now func() time.Time) *fixture {
	t.Helper()
	return newFixtureWith(t, now, confirmtest.Commands())
}

// newFixtureWith is newFixture over the declarations cmds.
func newFixtureWith(t *testing.T, now func() time.Time, cmds confirm.Commands) *fixture {
	t.Helper()
	dir := dirmem.New()
	if _, err := directory.Apply(context.Background(), dir, []byte(confirmtest.Policy)); err != nil {
		t.Fatal(err)
	}
	store := memory.New(memory.Options{})
	t.Cleanup(store.Close)
	svc, err := confirm.New(confirm.Config{Store: store, Directory: directory.Direct(dir), Commands: cmds})
	if err != nil {
		t.Fatal(err)
	}
	var h *page.Handler
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	h, err = page.New(page.Config{
		Confirm: svc, Sessions: store, Directory: directory.Direct(dir), LoginSecret: devSecret, Issuers: []string{issuer},
		BaseURL: srv.URL, Logger: slog.New(slog.DiscardHandler), Now: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{srv: srv, confirm: svc, store: store}
}

// browser is an HTTP client with a cookie jar that does not follow
// redirects, so tests see the 303s.
func browser(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

type response struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, c *http.Client, method, u string, form url.Values, header map[string]string) response {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(context.Background(), method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func (f *fixture) loginURL(t *testing.T, user, tenant string) string {
	t.Helper()
	u, err := page.LoginURL(f.srv.URL, devSecret, issuer, user, tenant, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// signIn signs user in and returns the client and its CSRF token.
func (f *fixture) signIn(t *testing.T, user, tenant string) (*http.Client, string) {
	t.Helper()
	c := browser(t)
	r := do(t, c, http.MethodGet, f.loginURL(t, user, tenant), nil, nil)
	if r.status != http.StatusOK || !strings.Contains(r.body, "signed in as "+user) {
		t.Fatalf("sign-in: %d %s", r.status, r.body)
	}
	return c, csrfOf(t, r.body)
}

func csrfOf(t *testing.T, body string) string {
	t.Helper()
	const marker = `name="csrf" value="`
	i := strings.Index(body, marker)
	if i < 0 {
		t.Fatalf("no CSRF token in %s", body)
	}
	rest := body[i+len(marker):]
	return rest[:strings.IndexByte(rest, '"')]
}

var botForAlice = identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "support-bot", Via: "executor"}

func (f *fixture) open(t *testing.T, command, inv string) confirm.Challenge {
	t.Helper()
	c, err := f.confirm.Open(context.Background(), botForAlice, confirm.OpenRequest{
		Command: command, InvocationDigest: confirmtest.Digest(inv), InvocationID: inv,
		ArgumentsJSON:  `{"ticket_id":"T-1042","amount_cents":1250,"cardholder_reference":"4111-1111-SECRET"}`,
		WithheldFields: []string{"/cardholder_reference"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func checkHeaders(t *testing.T, what string, h http.Header) {
	t.Helper()
	want := map[string]string{
		"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
		"X-Frame-Options":         "DENY",
		"Referrer-Policy":         "no-referrer",
		"Cache-Control":           "no-store",
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s: %s = %q, want %q", what, k, got, v)
		}
	}
}

func TestVisitorWithoutSessionNeverSeesThePrompt(t *testing.T) {
	f := newFixture(t, nil)
	c := f.open(t, "ticket.refund", "inv-1")
	anon := browser(t)
	for _, path := range []string{"/approve/" + c.ID, "/approve/"} {
		r := do(t, anon, http.MethodGet, f.srv.URL+path, nil, nil)
		if r.status != http.StatusUnauthorized || !strings.Contains(r.body, "Sign in with your link") || strings.Contains(r.body, "Refund a ticket") {
			t.Fatalf("GET %s without a session: %d %s", path, r.status, r.body)
		}
		checkHeaders(t, "sign-in page", r.header)
	}
	r := do(t, anon, http.MethodPost, f.srv.URL+"/approve/"+c.ID, url.Values{"decision": {"approve"}}, nil)
	if r.status != http.StatusUnauthorized {
		t.Fatalf("POST without a session: %d", r.status)
	}
	if got, _ := f.store.Get(context.Background(), "acme", c.ID); got.State != confirm.StatePending {
		t.Fatalf("state %s", got.State)
	}
}

func TestSignIn(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	f := newFixture(t, clock)

	link := f.loginURL(t, "alice", "acme")
	c := browser(t)
	r := do(t, c, http.MethodGet, link, nil, nil)
	if r.status != http.StatusOK || !strings.Contains(r.body, `http-equiv="refresh"`) {
		t.Fatalf("sign-in: %d %s", r.status, r.body)
	}
	checkHeaders(t, "signed-in page", r.header)
	cookie := r.header.Get("Set-Cookie")
	for _, attr := range []string{page.CookieName + "=", "Path=/approve", "HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(cookie, attr) {
			t.Errorf("cookie %q lacks %s", cookie, attr)
		}
	}
	if r := do(t, c, http.MethodGet, f.srv.URL+"/approve/", nil, nil); r.status != http.StatusOK || !strings.Contains(r.body, "Waiting for you") {
		t.Fatalf("index after sign-in: %d", r.status)
	}

	// The same link again, in another browser: refused.
	if r := do(t, browser(t), http.MethodGet, link, nil, nil); r.status != http.StatusUnauthorized || !strings.Contains(r.body, "already used") {
		t.Fatalf("reused link: %d %s", r.status, r.body)
	}

	bearer, err := identity.MintDev(devSecret, identity.MintRequest{Issuer: issuer, Audience: page.LoginAudience, User: "alice", Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	agentLogin := forge(t, map[string]any{"purpose": page.LoginPurpose, "aud": page.LoginAudience, "iss": issuer, "user": "alice", "tenant": "acme",
		"jti": "j-agent", "iat": now.Unix(), "exp": now.Add(time.Minute).Unix(), "act": map[string]any{"sub": "support-bot"}}, devSecret)
	otherKey := forge(t, map[string]any{"purpose": page.LoginPurpose, "aud": page.LoginAudience, "iss": issuer, "user": "alice", "tenant": "acme",
		"jti": "j-key", "iat": now.Unix(), "exp": now.Add(time.Minute).Unix()}, []byte("another-secret-0123456789abcdef012345"))
	longLived := forge(t, map[string]any{"purpose": page.LoginPurpose, "aud": page.LoginAudience, "iss": issuer, "user": "alice", "tenant": "acme",
		"jti": "j-long", "iat": now.Unix(), "exp": now.Add(30 * 24 * time.Hour).Unix()}, devSecret)
	cases := []struct {
		name, token string
		status      int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"garbage", "not-a-jwt", http.StatusUnauthorized},
		{"a bearer token", bearer, http.StatusUnauthorized},
		{"an agent claim", agentLogin, http.StatusUnauthorized},
		{"signed with another key", otherKey, http.StatusUnauthorized},
		{"a month-long link", longLived, http.StatusUnauthorized},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, browser(t), http.MethodGet, f.srv.URL+"/approve/login?t="+url.QueryEscape(tc.token), nil, nil)
			if r.status != tc.status || r.header.Get("Set-Cookie") != "" {
				t.Fatalf("%d (cookie %q), want %d", r.status, r.header.Get("Set-Cookie"), tc.status)
			}
		})
	}
	for _, who := range [][2]string{{"bob", "acme"}, {"alice", "initech"}} {
		r := do(t, browser(t), http.MethodGet, f.loginURL(t, who[0], who[1]), nil, nil)
		if r.status != http.StatusForbidden || r.header.Get("Set-Cookie") != "" {
			t.Fatalf("inactive %s/%s signing in: %d", who[1], who[0], r.status)
		}
	}
	expiring := f.loginURL(t, "carol", "acme")
	now = now.Add(6 * time.Minute)
	if r := do(t, browser(t), http.MethodGet, expiring, nil, nil); r.status != http.StatusUnauthorized {
		t.Fatalf("expired link: %d", r.status)
	}
}

func forge(t *testing.T, claims map[string]any, secret []byte) string {
	t.Helper()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: secret}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestSignInTokenIsNoBearerToken: a sign-in token does not authenticate
// API calls, even with a verifier that would accept its audience.
func TestSignInTokenIsNoBearerToken(t *testing.T) {
	tok, err := page.MintLoginToken(devSecret, issuer, "alice", "acme", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, aud := range [][]string{{"mandate"}, {"mandate", page.LoginAudience}} {
		v, err := identity.NewVerifier(context.Background(), identity.Config{Audience: aud, Issuers: []string{issuer}, DevSecret: devSecret})
		if err != nil {
			t.Fatal(err)
		}
		if p, err := v.Verify(context.Background(), tok); err == nil {
			t.Fatalf("audience %v: the sign-in token authenticated %+v", aud, p)
		}
	}
}

func TestDecideOnThePage(t *testing.T) {
	f := newFixture(t, nil)
	c := f.open(t, "ticket.refund", "inv-1")
	alice, csrf := f.signIn(t, "alice", "acme")
	target := f.srv.URL + "/approve/" + c.ID

	r := do(t, alice, http.MethodGet, target, nil, nil)
	if r.status != http.StatusOK || !strings.Contains(r.body, "Refund a ticket (ticket.refund)") || !strings.Contains(r.body, `id="approve"`) {
		t.Fatalf("challenge page: %d %s", r.status, r.body)
	}
	if strings.Contains(r.body, "4111-1111-SECRET") || !strings.Contains(r.body, "<code>/cardholder_reference</code> <em>withheld</em>") {
		t.Fatalf("sensitive value shown or withheld field not marked:\n%s", r.body)
	}
	checkHeaders(t, "challenge page", r.header)

	forged := []struct {
		name   string
		form   url.Values
		header map[string]string
	}{
		{"no CSRF token", url.Values{"decision": {"approve"}}, nil},
		{"wrong CSRF token", url.Values{"decision": {"approve"}, "csrf": {"guess"}}, nil},
		{"cross-site", url.Values{"decision": {"approve"}, "csrf": {csrf}}, map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"foreign origin", url.Values{"decision": {"approve"}, "csrf": {csrf}}, map[string]string{"Origin": "https://evil.example"}},
	}
	for _, tc := range forged {
		if r := do(t, alice, http.MethodPost, target, tc.form, tc.header); r.status != http.StatusForbidden {
			t.Fatalf("%s: %d, want 403", tc.name, r.status)
		}
	}
	if got, _ := f.store.Get(context.Background(), "acme", c.ID); got.State != confirm.StatePending {
		t.Fatalf("a forged form moved the challenge to %s", got.State)
	}

	r = do(t, alice, http.MethodPost, target, url.Values{"decision": {"approve"}, "csrf": {csrf}},
		map[string]string{"Origin": f.srv.URL, "Sec-Fetch-Site": "same-origin"})
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/approve/"+c.ID {
		t.Fatalf("approve: %d %v", r.status, r.header)
	}
	// Under Referrer-Policy no-referrer browsers send "Origin: null" with our
	// own forms; the CSRF token and Sec-Fetch-Site carry such a request.
	other := f.open(t, "ticket.refund", "inv-2")
	r = do(t, alice, http.MethodPost, f.srv.URL+"/approve/"+other.ID, url.Values{"decision": {"decline"}, "csrf": {csrf}},
		map[string]string{"Origin": "null", "Sec-Fetch-Site": "same-origin"})
	if r.status != http.StatusSeeOther {
		t.Fatalf("decline with Origin null: %d %s", r.status, r.body)
	}
	got, _ := f.store.Get(context.Background(), "acme", c.ID)
	if got.State != confirm.StateApproved || got.DecidedBy != "alice" || got.DecisionChannel != confirm.ChannelApprovalPage {
		t.Fatalf("after approving: %+v", got)
	}
	r = do(t, alice, http.MethodPost, target, url.Values{"decision": {"decline"}, "csrf": {csrf}}, nil)
	if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.body, failure.CodeConfirmationAlreadyDecided) {
		t.Fatalf("deciding twice: %d %s", r.status, r.body)
	}
}

func TestApproverPolicyOnThePage(t *testing.T) {
	f := newFixture(t, nil)
	payout := f.open(t, "payment.payout", "inv-payout")
	alice, csrf := f.signIn(t, "alice", "acme")
	target := f.srv.URL + "/approve/" + payout.ID
	r := do(t, alice, http.MethodGet, target, nil, nil)
	if r.status != http.StatusOK || strings.Contains(r.body, `id="approve"`) || !strings.Contains(r.body, "four eyes") {
		t.Fatalf("the requester's view of her four-eyes payout: %d %s", r.status, r.body)
	}
	r = do(t, alice, http.MethodPost, target, url.Values{"decision": {"approve"}, "csrf": {csrf}}, nil)
	if r.status != http.StatusForbidden || !strings.Contains(r.body, failure.CodeConfirmationApproverNotAllowed) {
		t.Fatalf("the requester approving anyway: %d", r.status)
	}
	mallory, _ := f.signIn(t, "mallory", "acme")
	if r := do(t, mallory, http.MethodGet, target, nil, nil); r.status != http.StatusNotFound || strings.Contains(r.body, "Pay out") {
		t.Fatalf("mallory's view: %d", r.status)
	}
	gina, _ := f.signIn(t, "gina", "globex")
	if r := do(t, gina, http.MethodGet, target, nil, nil); r.status != http.StatusNotFound {
		t.Fatalf("gina's view: %d", r.status)
	}
	carol, carolCSRF := f.signIn(t, "carol", "acme")
	if r := do(t, carol, http.MethodGet, f.srv.URL+"/approve/", nil, nil); !strings.Contains(r.body, "/approve/"+payout.ID) {
		t.Fatalf("carol's list lacks the payout: %s", r.body)
	}
	r = do(t, carol, http.MethodPost, target, url.Values{"decision": {"approve"}, "csrf": {carolCSRF}}, nil)
	if r.status != http.StatusSeeOther {
		t.Fatalf("carol approving: %d %s", r.status, r.body)
	}
	if got, _ := f.store.Get(context.Background(), "acme", payout.ID); got.DecidedBy != "carol" || got.DecisionChannel != confirm.ChannelApprovalPage {
		t.Fatalf("after carol: %+v", got)
	}
}

func TestSignOut(t *testing.T) {
	f := newFixture(t, nil)
	c, csrf := f.signIn(t, "alice", "acme")
	if r := do(t, c, http.MethodPost, f.srv.URL+"/approve/logout", url.Values{}, nil); r.status != http.StatusForbidden {
		t.Fatalf("sign-out without CSRF: %d", r.status)
	}
	if r := do(t, c, http.MethodPost, f.srv.URL+"/approve/logout", url.Values{"csrf": {csrf}}, nil); r.status != http.StatusOK {
		t.Fatalf("sign-out: %d", r.status)
	}
	if r := do(t, c, http.MethodGet, f.srv.URL+"/approve/", nil, nil); r.status != http.StatusUnauthorized {
		t.Fatalf("after sign-out: %d", r.status)
	}
}

func TestLoginURL(t *testing.T) {
	u, err := page.LoginURL("http://127.0.0.1:8080/", devSecret, issuer, "alice", "acme", 0)
	if err != nil || !strings.HasPrefix(u, "http://127.0.0.1:8080/approve/login?t=") {
		t.Fatalf("LoginURL = %q, %v", u, err)
	}
	for name, call := range map[string]func() (string, error){
		"ttl over an hour": func() (string, error) {
			return page.LoginURL("http://x", devSecret, issuer, "alice", "acme", 2*time.Hour)
		},
		"short secret": func() (string, error) { return page.LoginURL("http://x", []byte("short"), issuer, "alice", "acme", 0) },
		"no user":      func() (string, error) { return page.LoginURL("http://x", devSecret, issuer, "", "acme", 0) },
		"relative URL": func() (string, error) { return page.LoginURL("/approve", devSecret, issuer, "alice", "acme", 0) },
	} {
		if _, err := call(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestPreviewOnThePage: the effect lines of the backend's preview are on the challenge page,
// escaped, with a bidi control shown as a marker; a challenge without a preview has no such
// section.
func TestPreviewOnThePage(t *testing.T) {
	f := newFixture(t, nil)
	c, err := f.confirm.Open(context.Background(), botForAlice, confirm.OpenRequest{
		Command: "ticket.refund", InvocationDigest: confirmtest.Digest("inv-preview"), InvocationID: "inv-preview",
		ArgumentsJSON: `{"ticket_id":"T-1001"}`,
		Effects:       []string{"refund 25.00 EUR of 49.90 EUR paid; 0.00 EUR refunded so far", "<b>x</b> \u202eRUE"},
		PreviewDigest: confirmtest.Digest("preview"),
	})
	if err != nil {
		t.Fatal(err)
	}
	alice, _ := f.signIn(t, "alice", "acme")
	r := do(t, alice, http.MethodGet, f.srv.URL+"/approve/"+c.ID, nil, nil)
	want := `<ul class="effects" id="effects">
<li class="effect" dir="ltr"><bdi>refund 25.00 EUR of 49.90 EUR paid; 0.00 EUR refunded so far</bdi></li>
<li class="effect" dir="ltr"><bdi>&lt;b&gt;x&lt;/b&gt; ⟦U&#43;202E⟧RUE</bdi></li>
</ul>`
	if r.status != http.StatusOK || !strings.Contains(r.body, `<p class="effects-head">What it will do`) || !strings.Contains(r.body, want) {
		t.Fatalf("challenge page: %d\n%s", r.status, r.body)
	}
	plain := f.open(t, "ticket.refund", "inv-plain")
	if r := do(t, alice, http.MethodGet, f.srv.URL+"/approve/"+plain.ID, nil, nil); strings.Contains(r.body, `id="effects"`) {
		t.Fatalf("a challenge without a preview shows effects:\n%s", r.body)
	}
}
