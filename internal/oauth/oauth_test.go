package oauth_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/oauth"
)

const cb = "http://127.0.0.1:33418/callback"

// TestMetadata: RFC 8414 metadata at the well-known URI names this issuer,
// its endpoints, S256 only and public clients.
func TestMetadata(t *testing.T) {
	h := newHarness(t)
	resp, err := http.Get(h.srv.URL + "/.well-known/oauth-authorization-server") //nolint:noctx,bodyclose // test; decode closes it
	if err != nil {
		t.Fatal(err)
	}
	status, m := decode(t, resp)
	if status != http.StatusOK || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("metadata: %d %v", status, resp.Header)
	}
	want := map[string]any{
		"issuer": h.srv.URL, "authorization_endpoint": h.srv.URL + "/authorize", "token_endpoint": h.srv.URL + "/token",
		"registration_endpoint": h.srv.URL + "/register", "revocation_endpoint": h.srv.URL + "/revoke",
		"client_id_metadata_document_supported": true, "authorization_response_iss_parameter_supported": true,
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
	for k, v := range map[string]string{"code_challenge_methods_supported": "[S256]", "response_types_supported": "[code]",
		"token_endpoint_auth_methods_supported": "[none]", "grant_types_supported": "[authorization_code refresh_token]"} {
		if got := fmt.Sprint(m[k]); got != v {
			t.Errorf("%s = %s, want %s", k, got, v)
		}
	}
}

// TestCodeFlow: register, sign in as carol, allow, exchange: the access
// token is the dev JWT with carol as sub and the client's agent in act, the
// agent is carol's headless agent in the directory (she did not opt in to
// answering confirmations in the app), and refresh tokens
// rotate — a rotated one presented again revokes the family.
func TestCodeFlow(t *testing.T) {
	h := newHarness(t)
	client := h.register("Claude Code (test)", cb)
	verifier, challenge := pkce("abc")
	code := h.authorizeAs("carol", client, cb, challenge)
	status, tok := h.exchange(client, code, cb, verifier)
	if status != http.StatusOK || tok["token_type"] != "Bearer" || tok["refresh_token"] == nil || tok["expires_in"] != float64(3600) {
		t.Fatalf("token: %d %v", status, tok)
	}
	p, err := h.verifier.Verify(context.Background(), tok["access_token"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != identity.KindAgent || p.Tenant != "acme" || p.UserID != "carol" || p.Org != "finance" ||
		!strings.HasPrefix(p.AgentID, "claude-code-test-") || p.Model != "" {
		t.Fatalf("principal %+v", p)
	}
	res, err := directory.Resolve(context.Background(), h.dir, "acme", "carol", p.AgentID)
	if err != nil || !res.Active || res.Interactive {
		t.Fatalf("directory: %+v %v", res, err)
	}

	refresh := func(rt string) (int, map[string]any) {
		return h.postForm("/token", url.Values{"grant_type": {"refresh_token"}, "client_id": {client}, "refresh_token": {rt}})
	}
	first := tok["refresh_token"].(string)
	status, tok2 := refresh(first)
	if status != http.StatusOK || tok2["refresh_token"] == first {
		t.Fatalf("refresh: %d %v", status, tok2)
	}
	if p2, err := h.verifier.Verify(context.Background(), tok2["access_token"].(string)); err != nil || p2.AgentID != p.AgentID {
		t.Fatalf("refreshed token: %+v %v", p2, err)
	}
	if status, e := refresh(first); status != http.StatusBadRequest || e["error"] != "invalid_grant" {
		t.Fatalf("rotated refresh token reused: %d %v", status, e)
	}
	if status, e := refresh(tok2["refresh_token"].(string)); status != http.StatusBadRequest || e["error"] != "invalid_grant" {
		t.Fatalf("the family survived a reuse: %d %v", status, e)
	}
}

// TestAuthorizeRefusals: a request whose client or redirect URI cannot be
// trusted gets an error page and no redirect; every other refusal goes
// back to the client with error, the state unchanged, and iss.
func TestAuthorizeRefusals(t *testing.T) {
	h := newHarness(t)
	client := h.register("refusals", cb, "https://app.example/cb")
	_, challenge := pkce("xyz")
	for _, tc := range []struct {
		name      string
		edit      func(url.Values)
		raw       string // appended to the query as is
		wantPage  bool   // error page, no redirect
		wantError string
	}{
		{name: "unknown client", edit: func(v url.Values) { v.Set("client_id", "mcp-nope") }, wantPage: true},
		{name: "missing client", edit: func(v url.Values) { v.Del("client_id") }, wantPage: true},
		{name: "unregistered redirect_uri", edit: func(v url.Values) { v.Set("redirect_uri", "https://evil.example/cb") }, wantPage: true},
		{name: "redirect_uri on another path", edit: func(v url.Values) { v.Set("redirect_uri", "http://127.0.0.1:33418/other") }, wantPage: true},
		{name: "https redirect_uri on another port", edit: func(v url.Values) { v.Set("redirect_uri", "https://app.example:8443/cb") }, wantPage: true},
		{name: "missing redirect_uri", edit: func(v url.Values) { v.Del("redirect_uri") }, wantPage: true},
		{name: "repeated parameter", raw: "&client_id=" + url.QueryEscape(client), wantPage: true},
		{name: "implicit grant", edit: func(v url.Values) { v.Set("response_type", "token") }, wantError: "unsupported_response_type"},
		{name: "no PKCE", edit: func(v url.Values) { v.Del("code_challenge"); v.Del("code_challenge_method") }, wantError: "invalid_request"},
		{name: "plain PKCE", edit: func(v url.Values) { v.Set("code_challenge_method", "plain") }, wantError: "invalid_request"},
		{name: "method missing (plain by default)", edit: func(v url.Values) { v.Del("code_challenge_method") }, wantError: "invalid_request"},
		{name: "challenge not S256-shaped", edit: func(v url.Values) { v.Set("code_challenge", "short") }, wantError: "invalid_request"},
		{name: "another resource", edit: func(v url.Values) { v.Set("resource", "https://other.example/mcp") }, wantError: "invalid_target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := authParams(client, cb, challenge, "s t&ate")
			if tc.edit != nil {
				tc.edit(v)
			}
			p := h.browser().get("/authorize?" + v.Encode() + tc.raw)
			if tc.wantPage {
				if p.status != http.StatusBadRequest || p.location != "" || !strings.Contains(p.body, `id="error"`) {
					t.Fatalf("want an error page: %d %q", p.status, p.location)
				}
				return
			}
			u, err := url.Parse(p.location)
			if p.status != http.StatusSeeOther || err != nil || !strings.HasPrefix(p.location, cb+"?") {
				t.Fatalf("want a redirect to the client: %d %q", p.status, p.location)
			}
			q := u.Query()
			if q.Get("error") != tc.wantError || q.Get("state") != "s t&ate" || q.Get("iss") != h.srv.URL || q.Has("code") {
				t.Fatalf("redirect query %v", q)
			}
		})
	}
}

// TestStatePassthrough: the state comes back exactly as sent, and a
// request without one gets none (PKCE S256 carries the CSRF protection).
func TestStatePassthrough(t *testing.T) {
	h := newHarness(t)
	client := h.register("state", cb)
	_, challenge := pkce("st8")
	b := h.browser()
	q := b.answer(b.signIn(b.start(authParams(client, cb, challenge, "")), "carol"), "approve")
	if q.Has("state") || q.Get("code") == "" {
		t.Fatalf("without state: %v", q)
	}
	q = b.answer(b.start(authParams(client, cb, challenge, "ä/+=?&#")), "approve") // signed in already
	if q.Get("state") != "ä/+=?&#" || q.Get("code") == "" {
		t.Fatalf("with state: %v", q)
	}
}

// TestLoopbackRedirectAnyPort: a native app's loopback redirect URI
// matches on any port (RFC 8252 §7.3), nothing else does.
func TestLoopbackRedirectAnyPort(t *testing.T) {
	h := newHarness(t)
	client := h.register("native", "http://127.0.0.1/callback", "http://localhost:5000/cb")
	verifier, challenge := pkce("port")
	for _, redirect := range []string{"http://127.0.0.1:51234/callback", "http://localhost:6000/cb"} {
		code := h.authorizeAs("carol", client, redirect, challenge)
		if status, tok := h.exchange(client, code, redirect, verifier); status != http.StatusOK {
			t.Fatalf("%s: %d %v", redirect, status, tok)
		}
	}
	for _, redirect := range []string{"http://127.0.0.1:51234/other", "http://127.0.0.1:51234/callback?x=1", "http://[::1]:51234/callback"} {
		if p := h.browser().get("/authorize?" + authParams(client, redirect, challenge, "").Encode()); p.status != http.StatusBadRequest || p.location != "" {
			t.Errorf("%s accepted: %d %q", redirect, p.status, p.location)
		}
	}
}

// TestTokenRefusals: each way a code exchange can be wrong is invalid_grant
// (or its own code), and a code is spent by its first presentation.
func TestTokenRefusals(t *testing.T) {
	h := newHarness(t)
	client := h.register("token refusals", cb, "http://127.0.0.1:9/other")
	other := h.register("another client", cb)
	verifier, challenge := pkce("tok")
	for _, tc := range []struct {
		name      string
		edit      func(url.Values)
		before    func()
		status    int
		wantError string
	}{
		{name: "wrong verifier", edit: func(v url.Values) { v.Set("code_verifier", strings.Repeat("w", 43)) }, status: 400, wantError: "invalid_grant"},
		{name: "verifier too short", edit: func(v url.Values) { v.Set("code_verifier", "abc") }, status: 400, wantError: "invalid_grant"},
		{name: "the challenge as verifier", edit: func(v url.Values) { v.Set("code_verifier", challenge) }, status: 400, wantError: "invalid_grant"},
		{name: "missing verifier", edit: func(v url.Values) { v.Del("code_verifier") }, status: 400, wantError: "invalid_request"},
		{name: "other registered redirect_uri", edit: func(v url.Values) { v.Set("redirect_uri", "http://127.0.0.1:9/other") }, status: 400, wantError: "invalid_grant"},
		{name: "missing redirect_uri", edit: func(v url.Values) { v.Del("redirect_uri") }, status: 400, wantError: "invalid_request"},
		{name: "another client's code", edit: func(v url.Values) { v.Set("client_id", other) }, status: 400, wantError: "invalid_grant"},
		{name: "unknown client", edit: func(v url.Values) { v.Set("client_id", "mcp-unknown") }, status: 401, wantError: "invalid_client"},
		{name: "client secret", edit: func(v url.Values) { v.Set("client_secret", "s") }, status: 401, wantError: "invalid_client"},
		{name: "unknown code", edit: func(v url.Values) { v.Set("code", "nope") }, status: 400, wantError: "invalid_grant"},
		{name: "expired code", before: func() { h.advance(2 * time.Minute) }, status: 400, wantError: "invalid_grant"},
		{name: "another resource", edit: func(v url.Values) { v.Set("resource", "https://other.example/mcp") }, status: 400, wantError: "invalid_target"},
		{name: "password grant", edit: func(v url.Values) { v.Set("grant_type", "password") }, status: 400, wantError: "unsupported_grant_type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code := h.authorizeAs("carol", client, cb, challenge)
			if tc.before != nil {
				tc.before()
			}
			form := url.Values{"grant_type": {"authorization_code"}, "client_id": {client}, "code": {code}, "redirect_uri": {cb}, "code_verifier": {verifier}}
			if tc.edit != nil {
				tc.edit(form)
			}
			status, e := h.postForm("/token", form)
			if status != tc.status || e["error"] != tc.wantError || e["access_token"] != nil {
				t.Fatalf("%d %v, want %d %s", status, e, tc.status, tc.wantError)
			}
			if tc.wantError != "invalid_grant" || tc.name == "unknown code" {
				return
			}
			// The failed presentation spent the code.
			if status, e := h.exchange(client, code, cb, verifier); status != 400 || e["error"] != "invalid_grant" {
				t.Fatalf("the code worked after a failed exchange: %d %v", status, e)
			}
		})
	}

	t.Run("reused code revokes what it bought", func(t *testing.T) {
		code := h.authorizeAs("carol", client, cb, challenge)
		status, tok := h.exchange(client, code, cb, verifier)
		if status != http.StatusOK {
			t.Fatalf("first exchange: %d %v", status, tok)
		}
		if status, e := h.exchange(client, code, cb, verifier); status != 400 || e["error"] != "invalid_grant" {
			t.Fatalf("second exchange: %d %v", status, e)
		}
		status, e := h.postForm("/token", url.Values{"grant_type": {"refresh_token"}, "client_id": {client}, "refresh_token": {tok["refresh_token"].(string)}})
		if status != 400 || e["error"] != "invalid_grant" {
			t.Fatalf("the refresh token of a replayed code still works: %d %v", status, e)
		}
	})

	t.Run("refresh token of another client", func(t *testing.T) {
		_, tok := h.exchange(client, h.authorizeAs("carol", client, cb, challenge), cb, verifier)
		status, e := h.postForm("/token", url.Values{"grant_type": {"refresh_token"}, "client_id": {other}, "refresh_token": {tok["refresh_token"].(string)}})
		if status != 400 || e["error"] != "invalid_grant" {
			t.Fatalf("%d %v", status, e)
		}
	})

	t.Run("disabled user gets no token", func(t *testing.T) {
		code := h.authorizeAs("alice", client, cb, challenge)
		if err := directory.SetUserDisabled(context.Background(), h.dir, "acme", "alice", true); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = directory.SetUserDisabled(context.Background(), h.dir, "acme", "alice", false) }()
		if status, e := h.exchange(client, code, cb, verifier); status != 400 || e["error"] != "invalid_grant" {
			t.Fatalf("%d %v", status, e)
		}
	})
}

// TestConsentForms: sign-in and consent are answered only by the browser
// that made the request, with the page's CSRF token, from the page's
// origin; deny goes back as access_denied and registers nothing.
func TestConsentForms(t *testing.T) {
	h := newHarness(t)
	client := h.register("forms", cb)
	_, challenge := pkce("csrf")

	b := h.browser()
	signin := b.start(authParams(client, cb, challenge, "s1"))
	for _, tc := range []struct {
		name   string
		form   url.Values
		header []string
	}{
		{"sign-in without the CSRF token", url.Values{"req": {signin.field("req")}, "tenant": {"acme"}, "user": {"carol"}}, nil},
		{"sign-in with a wrong CSRF token", url.Values{"req": {signin.field("req")}, "csrf": {"x"}, "tenant": {"acme"}, "user": {"carol"}}, nil},
		{"sign-in from another site", url.Values{"req": {signin.field("req")}, "csrf": {signin.field("csrf")}, "tenant": {"acme"}, "user": {"carol"}},
			[]string{"Sec-Fetch-Site", "cross-site"}},
		{"sign-in from a foreign origin", url.Values{"req": {signin.field("req")}, "csrf": {signin.field("csrf")}, "tenant": {"acme"}, "user": {"carol"}},
			[]string{"Origin", "https://evil.example", "Sec-Fetch-Site", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if p := b.post("/authorize/signin", tc.form, tc.header...); p.status != http.StatusForbidden {
				t.Fatalf("%d %q", p.status, p.location)
			}
		})
	}
	t.Run("sign-in as a user not offered", func(t *testing.T) {
		p := b.post("/authorize/signin", url.Values{"req": {signin.field("req")}, "csrf": {signin.field("csrf")}, "tenant": {"acme"}, "user": {"olive"}})
		if p.status != http.StatusBadRequest {
			t.Fatalf("%d %q", p.status, p.location)
		}
	})
	t.Run("another browser cannot answer the request", func(t *testing.T) {
		p := h.browser().post("/authorize/signin", url.Values{"req": {signin.field("req")}, "csrf": {signin.field("csrf")}, "tenant": {"acme"}, "user": {"carol"}})
		if p.status != http.StatusBadRequest || !strings.Contains(p.body, "expired") {
			t.Fatalf("%d %s", p.status, p.body)
		}
	})

	consent := b.signIn(signin, "carol")
	if !strings.Contains(consent.body, "forms") || !strings.Contains(consent.body, "name given by the application itself") ||
		!strings.Contains(consent.csp, "form-action 'self' http://127.0.0.1:33418") {
		t.Fatalf("consent page does not name the client or allow its redirect: %s\n%s", consent.csp, consent.body)
	}
	for _, tc := range []struct {
		name   string
		form   url.Values
		header []string
	}{
		{"consent without the CSRF token", url.Values{"req": {consent.field("req")}, "decision": {"approve"}}, nil},
		{"consent with the sign-in's CSRF token", url.Values{"req": {consent.field("req")}, "csrf": {signin.field("csrf")}, "decision": {"approve"}}, nil},
		{"consent from another site", url.Values{"req": {consent.field("req")}, "csrf": {consent.field("csrf")}, "decision": {"approve"}},
			[]string{"Sec-Fetch-Site", "cross-site"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if p := b.post("/authorize/consent", tc.form, tc.header...); p.status != http.StatusForbidden {
				t.Fatalf("%d %q", p.status, p.location)
			}
		})
	}
	t.Run("consent without a session", func(t *testing.T) {
		if p := h.browser().post("/authorize/consent", url.Values{"req": {consent.field("req")}, "csrf": {consent.field("csrf")}, "decision": {"approve"}}); p.status != http.StatusForbidden {
			t.Fatalf("%d %q", p.status, p.location)
		}
	})

	q := b.answer(consent, "deny")
	if q.Get("error") != "access_denied" || q.Get("state") != "s1" || q.Has("code") {
		t.Fatalf("deny: %v", q)
	}
	snap := snapshot(t, h)
	if len(snap.Agents) != 0 {
		t.Fatalf("deny registered an agent: %+v", snap.Agents)
	}
	// The request was answered: answering it again changes nothing.
	if p := b.post("/authorize/consent", url.Values{"req": {consent.field("req")}, "csrf": {consent.field("csrf")}, "decision": {"approve"}}); p.status != http.StatusBadRequest {
		t.Fatalf("a denied request was approved after all: %d %q", p.status, p.location)
	}
}

// TestSignInOnlyOnThisMachine: the dev sign-in trusts whoever picks a
// user, so a browser elsewhere is refused.
func TestSignInOnlyOnThisMachine(t *testing.T) {
	h := newHarness(t)
	client := h.register("remote", cb)
	_, challenge := pkce("far")
	b := h.browser()
	p := b.get("/authorize?" + authParams(client, cb, challenge, "").Encode())
	req := httptest.NewRequest(http.MethodGet, p.location, nil)
	req.RemoteAddr = "192.0.2.7:40000"
	u, _ := url.Parse(h.srv.URL)
	for _, c := range b.c.Jar.Cookies(&url.URL{Scheme: "http", Host: u.Host, Path: "/authorize/consent"}) {
		req.AddCookie(c)
	}
	rec := httptest.NewRecorder()
	h.as.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusForbidden || strings.Contains(rec.Body.String(), `id="signin"`) {
		t.Fatalf("remote sign-in page: %d", rec.Code)
	}
}

// TestRegistration: RFC 7591 refusals, and a native app's private-use
// scheme is accepted.
func TestRegistration(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name, body, wantError string
	}{
		{"no redirect_uris", `{"client_name":"x"}`, "invalid_redirect_uri"},
		{"plain http off loopback", `{"redirect_uris":["http://app.example/cb"]}`, "invalid_redirect_uri"},
		{"javascript", `{"redirect_uris":["javascript:alert(1)"]}`, "invalid_redirect_uri"},
		{"an operating system's scheme", `{"redirect_uris":["ms-settings:privacy"]}`, "invalid_redirect_uri"},
		{"view-source", `{"redirect_uris":["view-source:https://app.example/cb"]}`, "invalid_redirect_uri"},
		{"a scheme without a domain", `{"redirect_uris":["myapp:/cb"]}`, "invalid_redirect_uri"},
		{"fragment", `{"redirect_uris":["https://app.example/cb#x"]}`, "invalid_redirect_uri"},
		{"relative", `{"redirect_uris":["/cb"]}`, "invalid_redirect_uri"},
		{"implicit grant", `{"redirect_uris":["https://app.example/cb"],"grant_types":["implicit"]}`, "invalid_client_metadata"},
		{"token response", `{"redirect_uris":["https://app.example/cb"],"response_types":["token"]}`, "invalid_client_metadata"},
		{"control characters in the name", `{"redirect_uris":["https://app.example/cb"],"client_name":"a\u202eb"}`, "invalid_client_metadata"},
		{"duplicate keys", `{"redirect_uris":["https://app.example/cb"],"redirect_uris":["https://evil.example/cb"]}`, "invalid_client_metadata"},
		{"not JSON", `redirect_uris=x`, "invalid_client_metadata"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, e := h.postJSON("/register", tc.body)
			if status != http.StatusBadRequest || e["error"] != tc.wantError {
				t.Fatalf("%d %v", status, e)
			}
		})
	}
	status, m := h.postJSON("/register", `{"client_name":"Cursor","redirect_uris":["cursor://anysphere.cursor-retrieval/oauth/callback"]}`)
	if status != http.StatusCreated || !strings.HasPrefix(m["client_id"].(string), "mcp-") || fmt.Sprint(m["grant_types"]) != "[authorization_code refresh_token]" {
		t.Fatalf("%d %v", status, m)
	}
	_, challenge := pkce("cur")
	b := h.browser()
	consent := b.signIn(b.start(authParams(m["client_id"].(string), "cursor://anysphere.cursor-retrieval/oauth/callback", challenge, "")), "carol")
	if !strings.Contains(consent.csp, "form-action 'self' cursor:") {
		t.Fatalf("CSP %q", consent.csp)
	}
	// A reverse-domain private-use scheme (RFC 8252 §7.1) is a native app's.
	if status, m := h.postJSON("/register", `{"client_name":"Native","redirect_uris":["com.example.app:/oauth2redirect"]}`); status != http.StatusCreated {
		t.Fatalf("reverse-domain scheme: %d %v", status, m)
	}
}

// TestClientIDMetadataDocument: a client_id that is the URL of its
// metadata document works without registration; documents that lie about
// their URL, are too large, redirect or are served too slowly are refused,
// and so is plain http off loopback.
func TestClientIDMetadataDocument(t *testing.T) {
	docs := http.NewServeMux()
	docSrv := httptest.NewServer(docs)
	defer docSrv.Close()
	doc := func(path, body string) string {
		docs.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprint(w, strings.ReplaceAll(body, "SELF", docSrv.URL+path))
		})
		return docSrv.URL + path
	}
	good := doc("/client.json", `{"client_id":"SELF","client_name":"Doc Client","redirect_uris":["`+cb+`"],"token_endpoint_auth_method":"none"}`)
	liar := doc("/liar.json", `{"client_id":"https://other.example/client.json","client_name":"Liar","redirect_uris":["`+cb+`"]}`)
	secretful := doc("/secret.json", `{"client_id":"SELF","client_secret":"s","redirect_uris":["`+cb+`"]}`)
	big := doc("/big.json", `{"client_id":"SELF","redirect_uris":["`+cb+`"],"client_uri":"`+strings.Repeat("x", 6000)+`"}`)
	docs.HandleFunc("/moved.json", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, good, http.StatusFound) })
	docs.HandleFunc("/slow.json", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(2 * time.Second):
		case <-r.Context().Done():
		}
	})

	h := newHarness(t, func(c *oauth.Config) {
		c.LoopbackDev = true
		c.FetchTimeout = 300 * time.Millisecond
	})
	verifier, challenge := pkce("doc")
	code := h.authorizeAs("carol", good, cb, challenge)
	status, tok := h.exchange(good, code, cb, verifier)
	if status != http.StatusOK {
		t.Fatalf("token: %d %v", status, tok)
	}
	if p, err := h.verifier.Verify(context.Background(), tok["access_token"].(string)); err != nil || !strings.HasPrefix(p.AgentID, "doc-client-") {
		t.Fatalf("principal %+v %v", p, err)
	}
	fetchedPages := map[string]bool{}
	for name, id := range map[string]string{
		"client_id not its own URL": liar, "carries a secret": secretful, "too large": big,
		"redirects": docSrv.URL + "/moved.json", "too slow": docSrv.URL + "/slow.json", "not found": docSrv.URL + "/none.json",
		"root path": docSrv.URL + "/",
	} {
		t.Run(name, func(t *testing.T) {
			p := h.browser().get("/authorize?" + authParams(id, cb, challenge, "").Encode())
			if p.status != http.StatusBadRequest || p.location != "" {
				t.Fatalf("%d %q", p.status, p.location)
			}
			if name != "root path" { // refused by its URL, before any fetch
				fetchedPages[strings.ReplaceAll(p.body, id, "ID")] = true
			}
		})
	}
	// Whatever a fetched URL answered — a status, a size, a slow or a wrong
	// document — the page says the same, so it is no oracle of what an
	// unauthenticated caller's URL serves.
	if len(fetchedPages) != 1 {
		t.Errorf("the error pages of fetched documents differ (%d kinds): they tell what a URL answered", len(fetchedPages))
	}
	t.Run("plain http needs LoopbackDev", func(t *testing.T) {
		strict := newHarness(t)
		if p := strict.browser().get("/authorize?" + authParams(good, cb, challenge, "").Encode()); p.status != http.StatusBadRequest {
			t.Fatalf("%d %q", p.status, p.location)
		}
	})
}

// TestRevocation: revoking a client's refresh or access token disables
// its agent in the directory (so outstanding access tokens stop at the
// executor) and its refresh tokens; approving again re-enables it. Another
// client cannot revoke it; an unknown token is answered 200.
func TestRevocation(t *testing.T) {
	h := newHarness(t)
	client := h.register("revocable", cb)
	other := h.register("other", cb)
	verifier, challenge := pkce("rev")
	for _, kind := range []string{"refresh_token", "access_token"} {
		t.Run(kind, func(t *testing.T) {
			_, tok := h.exchange(client, h.authorizeAs("carol", client, cb, challenge), cb, verifier)
			p, err := h.verifier.Verify(context.Background(), tok["access_token"].(string))
			if err != nil {
				t.Fatal(err)
			}
			if status, e := h.postForm("/revoke", url.Values{"token": {tok[kind].(string)}, "client_id": {other}}); status != 400 || e["error"] != "unauthorized_client" {
				t.Fatalf("another client revoked: %d %v", status, e)
			}
			if status, _ := h.postForm("/revoke", url.Values{"token": {tok[kind].(string)}, "client_id": {client}, "token_type_hint": {kind}}); status != http.StatusOK {
				t.Fatalf("revoke: %d", status)
			}
			res, err := directory.Resolve(context.Background(), h.dir, "acme", "carol", p.AgentID)
			if err != nil || res.Active || res.Reason != directory.ReasonAgentDisabled {
				t.Fatalf("agent after revocation: %+v %v", res, err)
			}
			status, e := h.postForm("/token", url.Values{"grant_type": {"refresh_token"}, "client_id": {client}, "refresh_token": {tok["refresh_token"].(string)}})
			if status != 400 || e["error"] != "invalid_grant" {
				t.Fatalf("refresh after revocation: %d %v", status, e)
			}
		})
	}
	if status, _ := h.postForm("/revoke", url.Values{"token": {"unknown"}, "client_id": {client}}); status != http.StatusOK {
		t.Fatalf("unknown token: %d", status)
	}
	// Approving again is the user's fresh decision: the agent is back.
	_, tok := h.exchange(client, h.authorizeAs("carol", client, cb, challenge), cb, verifier)
	p, _ := h.verifier.Verify(context.Background(), tok["access_token"].(string))
	if res, err := directory.Resolve(context.Background(), h.dir, "acme", "carol", p.AgentID); err != nil || !res.Active {
		t.Fatalf("agent after approving again: %+v %v", res, err)
	}
}

// TestAgentPerUser: one client approved by two users is two agents.
func TestAgentPerUser(t *testing.T) {
	h := newHarness(t)
	client := h.register("shared", cb)
	verifier, challenge := pkce("two")
	var agents []string
	for _, user := range []string{"carol", "alice"} {
		_, tok := h.exchange(client, h.authorizeAs(user, client, cb, challenge), cb, verifier)
		p, err := h.verifier.Verify(context.Background(), tok["access_token"].(string))
		if err != nil || p.UserID != user {
			t.Fatalf("%s: %+v %v", user, p, err)
		}
		agents = append(agents, p.AgentID)
	}
	if agents[0] == agents[1] {
		t.Fatalf("one agent for two users: %v", agents)
	}
	snap := snapshot(t, h)
	if len(snap.Agents) != 2 || !slices.ContainsFunc(snap.Agents, func(a directory.Agent) bool {
		return a.ID == agents[1] && a.UserID == "alice" && a.Host == directory.HostHeadless
	}) {
		t.Fatalf("agents %+v", snap.Agents)
	}
}

func snapshot(t *testing.T, h *harness) directory.Snapshot {
	t.Helper()
	var snap directory.Snapshot
	err := h.dir.Update(context.Background(), func(tx directory.Tx) error {
		var err error
		snap, err = tx.Snapshot(context.Background(), "acme")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// TestGoSDKReadsTheServer: the Go MCP SDK's OAuth helpers accept the
// metadata (issuer match, PKCE, endpoint URLs) and register a client.
func TestGoSDKReadsTheServer(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	meta, err := oauthex.GetAuthServerMeta(ctx, h.srv.URL+"/.well-known/oauth-authorization-server", h.srv.URL, nil)
	if err != nil || meta == nil {
		t.Fatalf("metadata: %v", err)
	}
	reg, err := oauthex.RegisterClient(ctx, meta.RegistrationEndpoint, &oauthex.ClientRegistrationMetadata{
		ClientName: "go-sdk", RedirectURIs: []string{cb}, TokenEndpointAuthMethod: "none",
	}, nil)
	if err != nil || reg.ClientID == "" || reg.TokenEndpointAuthMethod != "none" {
		t.Fatalf("registration: %+v %v", reg, err)
	}
}
