package oauth

import (
	"bytes"
	"context"
	"crypto/subtle"
	"embed"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/mandate-dev/mandate/internal/directory"
)

const (
	flowCookie    = "mandate_oauth_flow"
	sessionCookie = "mandate_oauth_session"
	maxFormBytes  = 16 << 10
	maxStateBytes = 2048
)

//go:embed templates/consent.html
var templateFS embed.FS

var pageTemplate = template.Must(template.ParseFS(templateFS, "templates/consent.html"))

// challengeRE is an S256 code challenge: BASE64URL(SHA-256), 43 characters.
var challengeRE = regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)

// hostRE is what may appear as the host of a redirect URI in the consent
// page's Content-Security-Policy.
var hostRE = regexp.MustCompile(`^[A-Za-z0-9.\-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$`)

// authorize is the authorization endpoint (RFC 6749 §4.1.1 with PKCE). A
// request whose client or redirect URI cannot be trusted gets an error page
// and is never redirected (§4.1.2.1); any other refusal goes back to the
// client's redirect URI with error, state and iss.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k, v := range q {
		if len(v) > 1 {
			s.errorPage(w, r, http.StatusBadRequest, "Invalid request", fmt.Sprintf("The parameter %q appears more than once.", k))
			return
		}
	}
	c, oe := s.client(r, q.Get("client_id"))
	if oe != nil {
		s.errorPage(w, r, http.StatusBadRequest, "Unknown application", "The application that sent you here is not known to Mandate: "+oe.Description+".")
		return
	}
	redirectURI := q.Get("redirect_uri")
	if redirectURI == "" || !matchRedirectURI(c.RedirectURIs, redirectURI) {
		s.log.InfoContext(r.Context(), "oauth: redirect_uri refused", "client_id", c.ID, "redirect_uri", redirectURI)
		s.errorPage(w, r, http.StatusBadRequest, "Invalid redirect",
			"The application asked to be sent back to an address it did not register. Mandate will not send you there.")
		return
	}
	st := q.Get("state")
	fail := func(code, desc string) {
		s.log.InfoContext(r.Context(), "oauth: authorization request refused", "client_id", c.ID, "error", code, "reason", desc)
		s.redirectBack(w, r, redirectURI, st, url.Values{"error": {code}, "error_description": {desc}})
	}
	switch {
	case len(st) > maxStateBytes:
		s.errorPage(w, r, http.StatusBadRequest, "Invalid request", "The state parameter is too long.")
		return
	case q.Get("response_type") != "code":
		fail(errUnsupportedResponseType, "only response_type=code is supported")
		return
	case q.Get("code_challenge") == "":
		fail(errInvalidRequest, "PKCE is required: send code_challenge with code_challenge_method=S256")
		return
	case q.Get("code_challenge_method") != "S256":
		fail(errInvalidRequest, "code_challenge_method must be S256; plain is not accepted")
		return
	case !challengeRE.MatchString(q.Get("code_challenge")):
		fail(errInvalidRequest, "code_challenge is not an S256 challenge (43 base64url characters)")
		return
	case q.Get("resource") != "" && q.Get("resource") != s.cfg.Resource:
		fail(errInvalidTarget, "this server issues tokens for "+s.cfg.Resource+" only")
		return
	case len(q.Get("scope")) > maxStateBytes:
		fail(errInvalidRequest, "scope is too long")
		return
	}
	browser := ""
	if ck, err := r.Cookie(flowCookie); err == nil && len(ck.Value) == 43 {
		browser = ck.Value
	} else {
		browser = randomToken()
		s.setCookie(w, flowCookie, browser, 0)
	}
	id := randomToken()
	p := &pending{
		client: *c, redirectURI: redirectURI, state: st, challenge: q.Get("code_challenge"),
		resource: s.cfg.Resource, scope: q.Get("scope"), browser: hashKey(browser), csrf: randomToken(),
		expires: s.cfg.Now().Add(pendingTTL),
	}
	now := s.cfg.Now()
	s.st.mu.Lock()
	room := sweep(s.st.pending, maxPending, func(p *pending) bool { return now.After(p.expires) })
	if room {
		s.st.pending[id] = p
	}
	s.st.mu.Unlock()
	if !room {
		fail(errTemporarilyUnavailable, "too many authorization requests in progress")
		return
	}
	http.Redirect(w, r, s.prefix+consentPath+"?req="+id, http.StatusSeeOther)
}

// redirectBack sends the browser to the client's redirect URI with params,
// state and iss (RFC 9207) added to its query.
func (s *Server) redirectBack(w http.ResponseWriter, r *http.Request, redirectURI, state string, params url.Values) {
	u, err := url.Parse(redirectURI)
	if err != nil {
		s.errorPage(w, r, http.StatusBadRequest, "Invalid redirect", "The redirect URI cannot be used.")
		return
	}
	q := u.Query()
	for k, v := range params {
		q[k] = v
	}
	if state != "" {
		q.Set("state", state)
	}
	q.Set("iss", s.cfg.Issuer)
	u.RawQuery = q.Encode()
	w.Header().Set("Cache-Control", "no-store")
	// The URI was registered by the client and matched above.
	http.Redirect(w, r, u.String(), http.StatusSeeOther) //nolint:gosec // G710: a registered, matched redirect URI
}

// pendingFor returns the request a consent-page form or view names, if this
// browser made it and it has not expired.
func (s *Server) pendingFor(r *http.Request, id string) (*pending, bool) {
	ck, err := r.Cookie(flowCookie)
	if err != nil || id == "" || len(id) > 64 {
		return nil, false
	}
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	p, ok := s.st.pending[id]
	if !ok || s.cfg.Now().After(p.expires) || subtle.ConstantTimeCompare([]byte(p.browser), []byte(hashKey(ck.Value))) != 1 {
		return nil, false
	}
	return p, true
}

func (s *Server) session(r *http.Request) (*session, string) {
	ck, err := r.Cookie(sessionCookie)
	if err != nil || len(ck.Value) != 43 {
		return nil, ""
	}
	key := hashKey(ck.Value)
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	ss, ok := s.st.sessions[key]
	if !ok || s.cfg.Now().After(ss.expires) {
		return nil, ""
	}
	return ss, key
}

// pageData is what the consent template renders.
type pageData struct {
	Page, Title, Detail string
	Request, CSRF       string
	Prefix              string
	Users               []userView
	User, Tenant        string
	Client              clientView
	Agent               string
	Resource            string
	// Ceiling is the tenant's trust ceiling, which the opt-in names.
	Ceiling string
}

type userView struct{ Tenant, ID, Org, Button string }

type clientView struct {
	Name, ID, RedirectHost string
	MetadataDocument       bool
	DocumentHost           string
}

// showConsent is the consent page: the dev sign-in when nobody is signed in
// on this browser, the client and approve/deny otherwise.
func (s *Server) showConsent(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("req")
	p, ok := s.pendingFor(r, id)
	if !ok {
		s.errorPage(w, r, http.StatusBadRequest, "This request has expired",
			"Go back to the application and connect again.")
		return
	}
	ss, _ := s.session(r)
	if ss == nil {
		s.showSignIn(w, r, id, p)
		return
	}
	ceiling := directory.DefaultTrustCeiling
	if f, err := s.cfg.Directory.Lookup(r.Context(), ss.tenant, ss.user, ""); err == nil && f.TrustCeiling != "" {
		ceiling = f.TrustCeiling
	}
	s.render(w, r, http.StatusOK, p, pageData{
		Page: "consent", Title: "Allow access", Request: id, CSRF: ss.csrf, User: ss.user, Tenant: ss.tenant,
		Client: viewClient(p), Agent: agentID(&p.client, ss.tenant, ss.user), Resource: p.resource, Ceiling: ceiling,
	})
}

func (s *Server) showSignIn(w http.ResponseWriter, r *http.Request, id string, p *pending) {
	if !fromLoopback(r) {
		s.errorPage(w, r, http.StatusForbidden, "Sign in on this machine",
			"The development sign-in of mandate dev works only in a browser on the machine it runs on.")
		return
	}
	d := pageData{Page: "signin", Title: "Sign in", Request: id, CSRF: p.csrf, Client: viewClient(p)}
	for _, u := range s.cfg.Users {
		org := ""
		if f, err := s.cfg.Directory.Lookup(r.Context(), u.Tenant, u.ID, ""); err == nil && f.UserFound {
			if f.User.Disabled {
				continue
			}
			org = f.User.Org
		}
		d.Users = append(d.Users, userView{Tenant: u.Tenant, ID: u.ID, Org: org, Button: "signin-" + u.Tenant + "-" + u.ID})
	}
	s.render(w, r, http.StatusOK, p, d)
}

// fromLoopback reports whether the request came from this machine. The dev
// sign-in trusts whoever picks a user, so it is offered to nobody else.
func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func viewClient(p *pending) clientView {
	v := clientView{Name: p.client.Name, ID: p.client.ID, MetadataDocument: p.client.MetadataDocument}
	if u, err := url.Parse(p.redirectURI); err == nil {
		v.RedirectHost = u.Scheme + "://" + u.Host
	}
	if p.client.MetadataDocument {
		if u, err := url.Parse(p.client.ID); err == nil {
			v.DocumentHost = u.Host
		}
	}
	if v.Name == "" {
		v.Name = "An unnamed application"
	}
	return v
}

// signIn is the dev sign-in: the human picks a demo user. It needs the
// pending request's CSRF token and the browser that made the request.
func (s *Server) signIn(w http.ResponseWriter, r *http.Request) {
	if !s.checkPost(w, r) {
		return
	}
	id := r.PostForm.Get("req")
	p, ok := s.pendingFor(r, id)
	if !ok {
		s.errorPage(w, r, http.StatusBadRequest, "This request has expired", "Go back to the application and connect again.")
		return
	}
	if !fromLoopback(r) {
		s.errorPage(w, r, http.StatusForbidden, "Sign in on this machine",
			"The development sign-in of mandate dev works only in a browser on the machine it runs on.")
		return
	}
	if !csrfOK(r.PostForm.Get("csrf"), p.csrf) {
		s.forbidden(w, r, "missing or wrong CSRF token on sign-in")
		return
	}
	tenant, user := r.PostForm.Get("tenant"), r.PostForm.Get("user")
	if !slices.Contains(s.cfg.Users, User{Tenant: tenant, ID: user}) {
		s.errorPage(w, r, http.StatusBadRequest, "Unknown user", "Pick one of the users on the sign-in page.")
		return
	}
	res, err := directory.Resolve(r.Context(), s.cfg.Directory, tenant, user, "")
	if err != nil {
		s.serverError(w, r, err)
		return
	}
	if !res.Active {
		s.errorPage(w, r, http.StatusForbidden, "This account is not active", "Ask your administrator.")
		return
	}
	if old, err := r.Cookie(sessionCookie); err == nil {
		s.st.mu.Lock()
		delete(s.st.sessions, hashKey(old.Value)) // a sign-in never reuses a session id
		s.st.mu.Unlock()
	}
	sid := randomToken()
	now := s.cfg.Now()
	s.st.mu.Lock()
	room := sweep(s.st.sessions, maxSessions, func(ss *session) bool { return now.After(ss.expires) })
	if room {
		s.st.sessions[hashKey(sid)] = &session{tenant: tenant, user: user, csrf: randomToken(), expires: now.Add(sessionTTL)}
	}
	s.st.mu.Unlock()
	if !room {
		s.errorPage(w, r, http.StatusServiceUnavailable, "Try again later", "Too many people are signed in.")
		return
	}
	s.setCookie(w, sessionCookie, sid, sessionTTL.Seconds())
	s.log.InfoContext(r.Context(), "oauth: signed in on the consent page", "tenant", tenant, "user", user, "client_id", p.client.ID)
	http.Redirect(w, r, s.prefix+consentPath+"?req="+url.QueryEscape(id), http.StatusSeeOther) //nolint:gosec // G710: a path of this server; id names a pending request
}

// signOut ends the browser's session and shows the sign-in again.
func (s *Server) signOut(w http.ResponseWriter, r *http.Request) {
	if !s.checkPost(w, r) {
		return
	}
	ss, key := s.session(r)
	if ss == nil || !csrfOK(r.PostForm.Get("csrf"), ss.csrf) {
		s.forbidden(w, r, "missing or wrong CSRF token on sign-out")
		return
	}
	s.st.mu.Lock()
	delete(s.st.sessions, key)
	s.st.mu.Unlock()
	s.setCookie(w, sessionCookie, "", -1)
	id := r.PostForm.Get("req")
	if _, ok := s.pendingFor(r, id); !ok {
		s.errorPage(w, r, http.StatusOK, "Signed out", "You can close this page.")
		return
	}
	http.Redirect(w, r, s.prefix+consentPath+"?req="+url.QueryEscape(id), http.StatusSeeOther) //nolint:gosec // G710: a path of this server; id names a pending request
}

// decide records the human's answer. Approving registers the client as an
// interactive agent of the signed-in user and sends the browser back with a
// single-use code; denying sends it back with access_denied.
func (s *Server) decide(w http.ResponseWriter, r *http.Request) {
	if !s.checkPost(w, r) {
		return
	}
	ss, _ := s.session(r)
	if ss == nil {
		s.forbidden(w, r, "consent without a session")
		return
	}
	if !csrfOK(r.PostForm.Get("csrf"), ss.csrf) {
		s.forbidden(w, r, "missing or wrong CSRF token on consent")
		return
	}
	id := r.PostForm.Get("req")
	p, ok := s.pendingFor(r, id)
	if !ok {
		s.errorPage(w, r, http.StatusBadRequest, "This request has expired", "Go back to the application and connect again.")
		return
	}
	decision := r.PostForm.Get("decision")
	if decision != "approve" && decision != "deny" {
		s.errorPage(w, r, http.StatusBadRequest, "Unknown answer", "Use the Allow or Deny button.")
		return
	}
	// The request is answered once, whatever the answer.
	s.st.mu.Lock()
	delete(s.st.pending, id)
	s.st.mu.Unlock()
	if decision == "deny" {
		s.log.InfoContext(r.Context(), "oauth: access denied", "tenant", ss.tenant, "user", ss.user, "client_id", p.client.ID)
		s.redirectBack(w, r, p.redirectURI, p.state, url.Values{"error": {errAccessDenied}, "error_description": {"the user denied access"}})
		return
	}
	// The app's own answers to confirmation forms count only if the user
	// said so, here, in so many words; an app is headless otherwise.
	host := directory.HostHeadless
	if r.PostForm.Get("attest") == "yes" {
		host = directory.HostInteractive
	}
	g, err := s.registerAgent(r.Context(), &p.client, ss.tenant, ss.user, host)
	if err != nil {
		s.log.ErrorContext(r.Context(), "oauth: registering the agent failed", "tenant", ss.tenant, "user", ss.user, "client_id", p.client.ID, "error", err)
		s.redirectBack(w, r, p.redirectURI, p.state, url.Values{"error": {errServerError}, "error_description": {"the agent could not be registered"}})
		return
	}
	g.resource = p.resource
	raw := randomToken()
	now := s.cfg.Now()
	s.st.mu.Lock()
	room := sweep(s.st.codes, maxCodes, func(c *code) bool { return now.After(c.expires) })
	if room {
		s.st.codes[hashKey(raw)] = &code{grant: g, redirectURI: p.redirectURI, challenge: p.challenge, expires: now.Add(s.cfg.CodeTTL)}
	}
	s.st.mu.Unlock()
	if !room {
		s.redirectBack(w, r, p.redirectURI, p.state, url.Values{"error": {errTemporarilyUnavailable}})
		return
	}
	s.log.InfoContext(r.Context(), "oauth: access approved", "tenant", ss.tenant, "user", ss.user, "agent", g.agent, "client_id", p.client.ID, "host", string(host))
	s.redirectBack(w, r, p.redirectURI, p.state, url.Values{"code": {raw}})
}

// registerAgent creates (or re-enables) the agent the client becomes for
// the user, with the host the user chose on the consent page: headless
// unless they opted in to answering confirmations in the app's own window.
// Every consent decides it again, so re-connecting without the opt-in
// takes it back.
func (s *Server) registerAgent(ctx context.Context, c *Client, tenant, user string, host directory.AgentHost) (grant, error) {
	g := grant{clientID: c.ID, clientName: c.Name, tenant: tenant, user: user, agent: agentID(c, tenant, user)}
	err := s.cfg.Directory.Update(ctx, func(tx directory.Tx) error {
		snap, err := tx.Snapshot(ctx, tenant)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(snap.Users, func(u directory.User) bool { return u.ID == user })
		if i < 0 || snap.Users[i].Disabled {
			return fmt.Errorf("%w: user %q is not active", directory.ErrNotFound, user)
		}
		g.org = snap.Users[i].Org
		if j := slices.IndexFunc(snap.Agents, func(a directory.Agent) bool { return a.ID == g.agent }); j >= 0 && snap.Agents[j].UserID != user {
			return fmt.Errorf("%w: agent %q already acts for another user", directory.ErrInvalid, g.agent)
		}
		return tx.PutAgent(ctx, directory.Agent{Tenant: tenant, ID: g.agent, UserID: user, Host: host})
	})
	if err != nil {
		return g, err
	}
	s.st.mu.Lock()
	s.st.agents[agentKey(tenant, g.agent)] = c.ID
	s.st.mu.Unlock()
	return g, nil
}

// checkPost guards a state-changing form: it must come from this server's
// pages (Sec-Fetch-Site and Origin, when the browser sends them), and be a
// readable form. It answers 403 itself and returns false otherwise. The
// CSRF token is checked by each handler against its own secret.
func (s *Server) checkPost(w http.ResponseWriter, r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		s.forbidden(w, r, "Sec-Fetch-Site "+site)
		return false
	}
	// With Referrer-Policy no-referrer browsers may send "Origin: null" for
	// our own form; such a request stands on Sec-Fetch-Site and the token.
	if origin := r.Header.Get("Origin"); origin != "" && origin != "null" && !strings.EqualFold(origin, s.origin) {
		s.forbidden(w, r, "foreign Origin")
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		s.forbidden(w, r, "unreadable form")
		return false
	}
	return true
}

func csrfOK(got, want string) bool {
	return got != "" && want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func (s *Server) forbidden(w http.ResponseWriter, r *http.Request, why string) {
	s.log.WarnContext(r.Context(), "oauth: forged or stale form refused", "reason", why)
	s.errorPage(w, r, http.StatusForbidden, "Refused",
		"This form did not come from this page or has expired. Go back to the application and connect again.")
}

func (s *Server) serverError(w http.ResponseWriter, r *http.Request, err error) {
	s.log.ErrorContext(r.Context(), "oauth: consent page failed", "error", err)
	s.errorPage(w, r, http.StatusInternalServerError, "Something went wrong", "Try again.")
}

func (s *Server) errorPage(w http.ResponseWriter, r *http.Request, status int, title, detail string) {
	s.render(w, r, status, nil, pageData{Page: "error", Title: title, Detail: detail})
}

func (s *Server) setCookie(w http.ResponseWriter, name, value string, maxAge float64) {
	//nolint:gosec // G124: Secure whenever the issuer is https; dev runs plain http on loopback.
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: value, Path: s.prefix + cookiePath, MaxAge: int(maxAge),
		HttpOnly: true, Secure: s.secure, SameSite: http.SameSiteLaxMode,
	})
}

// render writes a page with the headers of the approval page. A consent
// page's forms may lead to the client's redirect URI (the answer is a 303
// there), so its form-action names that origin too.
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, p *pending, d pageData) {
	d.Prefix = s.prefix
	var buf bytes.Buffer
	if err := pageTemplate.ExecuteTemplate(&buf, "page", d); err != nil {
		s.log.ErrorContext(r.Context(), "oauth: rendering failed", "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	formAction := "'self'"
	if p != nil {
		if src, ok := cspSource(p.redirectURI); ok {
			formAction += " " + src
		}
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action "+formAction+"; frame-ancestors 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// cspSource is the CSP source expression of a redirect URI's origin, or of
// its scheme for a private-use scheme.
func cspSource(redirectURI string) (string, bool) {
	u, err := url.Parse(redirectURI)
	if err != nil {
		return "", false
	}
	switch u.Scheme {
	case "http", "https":
		if !hostRE.MatchString(u.Host) {
			return "", false
		}
		return u.Scheme + "://" + u.Host, true
	default:
		if !schemeRE.MatchString(u.Scheme) {
			return "", false
		}
		return u.Scheme + ":", true
	}
}
