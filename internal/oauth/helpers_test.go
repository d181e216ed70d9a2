package oauth_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/oauth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	secret   = "0123456789abcdef0123456789abcdef-oauth-test"
	issuer   = "mandate-dev"
	audience = "mandate"
)

// harness is an authorization server on a loopback test server over a
// memory directory with acme's carol and alice.
type harness struct {
	t        *testing.T
	srv      *httptest.Server
	as       *oauth.Server
	dir      *dirmem.Store
	verifier *identity.Verifier
	mu       sync.Mutex
	now      time.Time
}

func newHarness(t *testing.T, tweak ...func(*oauth.Config)) *harness {
	t.Helper()
	h := &harness{t: t, dir: dirmem.New(), now: time.Now()}
	ctx := context.Background()
	err := h.dir.Update(ctx, func(tx directory.Tx) error {
		if err := tx.PutTenant(ctx, directory.Tenant{ID: "acme"}); err != nil {
			return err
		}
		if err := tx.PutRole(ctx, directory.Role{Tenant: "acme", Name: "finance", Permissions: []string{"ticket.read"}}); err != nil {
			return err
		}
		for _, u := range []directory.User{{Tenant: "acme", ID: "carol", Org: "finance", Roles: []string{"finance"}}, {Tenant: "acme", ID: "alice", Org: "support"}} {
			if err := tx.PutUser(ctx, u); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	h.verifier, err = identity.NewVerifier(ctx, identity.Config{Audience: []string{audience}, Issuers: []string{issuer}, DevSecret: []byte(secret)})
	if err != nil {
		t.Fatal(err)
	}
	var handler http.Handler // set once the server knows its URL
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler.ServeHTTP(w, r) }))
	t.Cleanup(h.srv.Close)
	cfg := oauth.Config{
		Issuer: h.srv.URL, Resource: h.srv.URL + "/mcp", Directory: h.dir,
		Users:       []oauth.User{{Tenant: "acme", ID: "carol"}, {Tenant: "acme", ID: "alice"}},
		TokenSecret: []byte(secret), TokenIssuer: issuer, TokenAudience: audience, Verifier: h.verifier,
		Now: h.clock,
	}
	for _, f := range tweak {
		f(&cfg)
	}
	h.as, err = oauth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	handler = h.as.Handler()
	return h
}

func (h *harness) clock() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.now
}

func (h *harness) advance(d time.Duration) {
	h.mu.Lock()
	h.now = h.now.Add(d)
	h.mu.Unlock()
}

// register registers a client by RFC 7591 and returns its client_id.
func (h *harness) register(name string, redirectURIs ...string) string {
	h.t.Helper()
	b, _ := json.Marshal(map[string]any{"client_name": name, "redirect_uris": redirectURIs, "token_endpoint_auth_method": "client_secret_post"})
	status, body := h.postJSON("/register", string(b))
	if status != http.StatusCreated || body["token_endpoint_auth_method"] != "none" {
		h.t.Fatalf("registration: %d %v", status, body)
	}
	return body["client_id"].(string)
}

func (h *harness) postJSON(path, body string) (int, map[string]any) {
	h.t.Helper()
	resp, err := http.Post(h.srv.URL+path, "application/json", strings.NewReader(body)) //nolint:noctx,bodyclose // test; decode closes it
	if err != nil {
		h.t.Fatal(err)
	}
	return decode(h.t, resp)
}

func (h *harness) postForm(path string, form url.Values) (int, map[string]any) {
	h.t.Helper()
	resp, err := http.PostForm(h.srv.URL+path, form) //nolint:noctx,bodyclose // test; decode closes it
	if err != nil {
		h.t.Fatal(err)
	}
	return decode(h.t, resp)
}

func decode(t *testing.T, resp *http.Response) (int, map[string]any) {
	t.Helper()
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if len(b) > 0 {
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("HTTP %d, not JSON: %s", resp.StatusCode, b)
		}
	}
	return resp.StatusCode, m
}

// pkce returns a verifier and its S256 challenge.
func pkce(seed string) (verifier, challenge string) {
	verifier = strings.Repeat(seed, 43/len(seed)+1)[:43] + "-._~"
	sum := sha256.Sum256([]byte(verifier))
	return verifier, base64.RawURLEncoding.EncodeToString(sum[:])
}

// browser is a user agent with its own cookies that does not follow
// redirects, so a test sees where each answer sends it.
type browser struct {
	t *testing.T
	h *harness
	c *http.Client
}

func (h *harness) browser() *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: h.t, h: h, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// page is one response the browser got.
type page struct {
	status   int
	location string
	body     string
	csp      string
}

func (b *browser) get(u string) page {
	b.t.Helper()
	if strings.HasPrefix(u, "/") {
		u = b.h.srv.URL + u
	}
	resp, err := b.c.Get(u) //nolint:noctx,bodyclose // test; read closes it
	if err != nil {
		b.t.Fatal(err)
	}
	return read(resp)
}

// post submits a form as the page's own form would: same origin.
func (b *browser) post(path string, form url.Values, header ...string) page {
	b.t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, b.h.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", b.h.srv.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := b.c.Do(req) //nolint:bodyclose // read closes it
	if err != nil {
		b.t.Fatal(err)
	}
	return read(resp)
}

func read(resp *http.Response) page {
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return page{status: resp.StatusCode, location: resp.Header.Get("Location"), body: string(b), csp: resp.Header.Get("Content-Security-Policy")}
}

var hiddenRE = regexp.MustCompile(`name="(req|csrf)" value="([^"]*)"`)

// field reads a hidden input of a page.
func (p page) field(name string) string {
	for _, m := range hiddenRE.FindAllStringSubmatch(p.body, -1) {
		if m[1] == name {
			return html.UnescapeString(m[2])
		}
	}
	return ""
}

// authParams are a valid authorization request's parameters.
func authParams(clientID, redirectURI, challenge, state string) url.Values {
	v := url.Values{
		"response_type": {"code"}, "client_id": {clientID}, "redirect_uri": {redirectURI},
		"code_challenge": {challenge}, "code_challenge_method": {"S256"},
	}
	if state != "" {
		v.Set("state", state)
	}
	return v
}

// start opens an authorization request and returns the consent page it
// leads to (the sign-in, for a browser nobody signed in on).
func (b *browser) start(params url.Values) page {
	b.t.Helper()
	p := b.get("/authorize?" + params.Encode())
	if p.status != http.StatusSeeOther || !strings.Contains(p.location, "/authorize/consent?req=") {
		b.t.Fatalf("authorize: %d %q %s", p.status, p.location, p.body)
	}
	return b.get(p.location)
}

// signIn picks a demo user on the sign-in page and returns the consent page.
func (b *browser) signIn(signin page, user string) page {
	b.t.Helper()
	if signin.status != http.StatusOK || !strings.Contains(signin.body, `id="signin"`) {
		b.t.Fatalf("not the sign-in page: %d %s", signin.status, signin.body)
	}
	p := b.post("/authorize/signin", url.Values{"req": {signin.field("req")}, "csrf": {signin.field("csrf")}, "tenant": {"acme"}, "user": {user}})
	if p.status != http.StatusSeeOther {
		b.t.Fatalf("sign-in: %d %s", p.status, p.body)
	}
	c := b.get(p.location)
	if c.status != http.StatusOK || !strings.Contains(c.body, `id="consent"`) {
		b.t.Fatalf("not the consent page: %d %s", c.status, c.body)
	}
	return c
}

// answer presses Allow or Deny and returns the redirect's query.
func (b *browser) answer(consent page, decision string, extra ...string) url.Values {
	b.t.Helper()
	form := url.Values{"req": {consent.field("req")}, "csrf": {consent.field("csrf")}, "decision": {decision}}
	for i := 0; i+1 < len(extra); i += 2 {
		form.Set(extra[i], extra[i+1])
	}
	p := b.post("/authorize/consent", form)
	if p.status != http.StatusSeeOther {
		b.t.Fatalf("consent: %d %s", p.status, p.body)
	}
	u, err := url.Parse(p.location)
	if err != nil {
		b.t.Fatal(err)
	}
	return u.Query()
}

// authorizeAs runs the browser part for user and returns the code.
func (h *harness) authorizeAs(user, clientID, redirectURI, challenge string, extra ...string) string {
	h.t.Helper()
	b := h.browser()
	q := b.answer(b.signIn(b.start(authParams(clientID, redirectURI, challenge, "st")), user), "approve", extra...)
	if q.Get("code") == "" || q.Get("state") != "st" || q.Get("iss") != h.srv.URL {
		h.t.Fatalf("approval redirect %v", q)
	}
	return q.Get("code")
}

func (h *harness) exchange(clientID, code, redirectURI, verifier string) (int, map[string]any) {
	h.t.Helper()
	return h.postForm("/token", url.Values{"grant_type": {"authorization_code"}, "client_id": {clientID}, "code": {code},
		"redirect_uri": {redirectURI}, "code_verifier": {verifier}})
}
