package oauth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"regexp"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/identity"
)

// verifierRE is a PKCE code verifier (RFC 7636 §4.1).
var verifierRE = regexp.MustCompile(`^[A-Za-z0-9._~-]{43,128}$`)

// tokenResponse is RFC 6749 §5.1.
type tokenResponse struct {
	AccessToken  string `json:"access_token"`
	TokenType    string `json:"token_type"`
	ExpiresIn    int64  `json:"expires_in"`
	RefreshToken string `json:"refresh_token,omitempty"`
	Scope        string `json:"scope"`
}

// readForm parses an application/x-www-form-urlencoded body and refuses
// repeated parameters (RFC 6749 §3.2).
func readForm(w http.ResponseWriter, r *http.Request) (url.Values, *oauthError) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		return nil, oerr(errInvalidRequest, "the body must be an application/x-www-form-urlencoded form of at most %d bytes", maxFormBytes)
	}
	for k, v := range r.PostForm {
		if len(v) > 1 {
			return nil, oerr(errInvalidRequest, "the parameter %q appears more than once", k)
		}
	}
	return r.PostForm, nil
}

// clientID reads the client's identity: client_id in the body, or HTTP
// Basic with an empty password (every client is public). Both must agree.
func clientID(r *http.Request, form url.Values) (string, *oauthError) {
	id := form.Get("client_id")
	if user, pass, ok := r.BasicAuth(); ok {
		u, err := url.QueryUnescape(user)
		if err != nil || pass != "" || (id != "" && u != id) {
			return "", oerr(errInvalidClient, "client authentication failed: clients here are public (token_endpoint_auth_method none)")
		}
		id = u
	}
	if form.Has("client_secret") {
		return "", oerr(errInvalidClient, "client authentication failed: clients here are public (token_endpoint_auth_method none)")
	}
	if id == "" {
		return "", oerr(errInvalidClient, "client_id is required")
	}
	return id, nil
}

// token is the token endpoint: authorization_code with PKCE, and
// refresh_token with rotation.
func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	cors(w)
	form, oe := readForm(w, r)
	if oe == nil {
		switch form.Get("grant_type") {
		case grantAuthorizationCode:
			oe = s.exchangeCode(w, r, form)
		case grantRefreshToken:
			oe = s.refreshGrant(w, r, form)
		case "":
			oe = oerr(errInvalidRequest, "grant_type is required")
		default:
			oe = oerr(errUnsupportedGrantType, "grant_type must be authorization_code or refresh_token")
		}
	}
	if oe != nil {
		s.writeError(w, r, oe)
	}
}

func (s *Server) exchangeCode(w http.ResponseWriter, r *http.Request, form url.Values) *oauthError {
	cid, oe := clientID(r, form)
	if oe != nil {
		return oe
	}
	raw, redirectURI, verifier := form.Get("code"), form.Get("redirect_uri"), form.Get("code_verifier")
	switch {
	case raw == "":
		return oerr(errInvalidRequest, "code is required")
	case redirectURI == "":
		return oerr(errInvalidRequest, "redirect_uri is required")
	case verifier == "":
		return oerr(errInvalidRequest, "code_verifier is required (PKCE)")
	}
	if oe := s.knownClient(cid); oe != nil {
		return oe
	}
	now := s.cfg.Now()
	s.st.mu.Lock()
	c, ok := s.st.codes[hashKey(raw)]
	var first bool
	if ok {
		first = !c.used
		if c.used {
			// A code presented twice was stolen or replayed: what it
			// bought is revoked too (OAuth 2.1 §4.1.3).
			c.reused = true
			s.st.revokeFamily(c.family)
		} else {
			c.family = randomToken()
		}
		c.used = true // single use, whatever happens next
	}
	s.st.mu.Unlock()
	switch {
	case !ok:
		return oerr(errInvalidGrant, "unknown authorization code")
	case !first:
		s.log.WarnContext(r.Context(), "oauth: authorization code reused; its tokens are revoked", "client_id", cid, "agent", c.agent)
		s.revokeGrant(r.Context(), c.grant)
		return oerr(errInvalidGrant, "the authorization code was already used")
	case now.After(c.expires):
		return oerr(errInvalidGrant, "the authorization code has expired")
	case c.clientID != cid:
		return oerr(errInvalidGrant, "the authorization code was issued to another client")
	case c.redirectURI != redirectURI:
		return oerr(errInvalidGrant, "redirect_uri differs from the authorization request's")
	case !verifierRE.MatchString(verifier) || !s256Matches(verifier, c.challenge):
		return oerr(errInvalidGrant, "code_verifier does not match the code_challenge")
	case form.Get("resource") != "" && form.Get("resource") != c.resource:
		return oerr(errInvalidTarget, "this server issues tokens for %s only", c.resource)
	}
	resp, oe := s.issue(r.Context(), c.grant, c.family)
	if oe != nil {
		return oe
	}
	s.st.mu.Lock()
	reused := c.reused
	if reused {
		s.st.revokeFamily(c.family) // the replay raced this exchange
	}
	s.st.mu.Unlock()
	if reused {
		s.revokeGrant(r.Context(), c.grant)
		return oerr(errInvalidGrant, "the authorization code was already used")
	}
	s.log.InfoContext(r.Context(), "oauth: token issued", "grant_type", grantAuthorizationCode, "client_id", cid, "tenant", c.tenant, "user", c.user, "agent", c.agent)
	writeJSON(w, http.StatusOK, resp)
	return nil
}

func (s *Server) refreshGrant(w http.ResponseWriter, r *http.Request, form url.Values) *oauthError {
	cid, oe := clientID(r, form)
	if oe != nil {
		return oe
	}
	raw := form.Get("refresh_token")
	if raw == "" {
		return oerr(errInvalidRequest, "refresh_token is required")
	}
	if oe := s.knownClient(cid); oe != nil {
		return oe
	}
	now := s.cfg.Now()
	s.st.mu.Lock()
	rt, ok := s.st.refresh[hashKey(raw)]
	var reused bool
	if ok {
		switch {
		case rt.used:
			// A rotated token came back: someone holds a copy. Revoke
			// the whole family (OAuth 2.1 §4.3.1).
			reused = true
			s.st.revokeFamily(rt.family)
		case rt.clientID == cid:
			rt.used = true
		}
	}
	s.st.mu.Unlock()
	switch {
	case !ok:
		return oerr(errInvalidGrant, "unknown or revoked refresh token")
	case reused:
		s.log.WarnContext(r.Context(), "oauth: refresh token reused; its family is revoked", "client_id", cid, "agent", rt.agent)
		s.revokeGrant(r.Context(), rt.grant)
		return oerr(errInvalidGrant, "the refresh token was already used")
	case rt.clientID != cid:
		return oerr(errInvalidGrant, "the refresh token was issued to another client")
	case now.After(rt.expires):
		return oerr(errInvalidGrant, "the refresh token has expired")
	case form.Get("resource") != "" && form.Get("resource") != rt.resource:
		return oerr(errInvalidTarget, "this server issues tokens for %s only", rt.resource)
	}
	resp, oe := s.issue(r.Context(), rt.grant, rt.family)
	if oe != nil {
		return oe
	}
	s.log.InfoContext(r.Context(), "oauth: token issued", "grant_type", grantRefreshToken, "client_id", cid, "tenant", rt.tenant, "user", rt.user, "agent", rt.agent)
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// knownClient refuses a client_id the server never registered nor fetched.
func (s *Server) knownClient(id string) *oauthError {
	s.st.mu.Lock()
	_, ok := s.st.clients[id]
	s.st.mu.Unlock()
	if !ok {
		return oerr(errInvalidClient, "unknown client_id")
	}
	return nil
}

// issue mints an access token and a refresh token of family for g, once
// the directory says the agent is still active.
func (s *Server) issue(ctx context.Context, g grant, family string) (tokenResponse, *oauthError) {
	res, err := directory.Resolve(ctx, s.cfg.Directory, g.tenant, g.user, g.agent)
	if err != nil {
		s.log.ErrorContext(ctx, "oauth: directory unavailable", "error", err)
		return tokenResponse{}, oerr(errServerError, "try again later")
	}
	if !res.Active {
		return tokenResponse{}, oerr(errInvalidGrant, "the agent is not active (%s); authorize again", res.Reason)
	}
	now := s.cfg.Now()
	// A token is dated no earlier than the agent's latest revocation
	// allows (JWT times have whole seconds): one minted right after the
	// user re-authorizes must not read as issued before it.
	iat := now
	if nb := res.NotBefore(); iat.Before(nb) {
		iat = nb
	}
	at, err := identity.MintDev(s.cfg.TokenSecret, identity.MintRequest{
		Issuer: s.cfg.TokenIssuer, Audience: s.cfg.TokenAudience,
		User: g.user, Tenant: g.tenant, Org: res.Org, Agent: g.agent, TTL: s.cfg.AccessTTL - iat.Sub(now), Now: iat,
	})
	if err != nil {
		s.log.ErrorContext(ctx, "oauth: minting failed", "error", err)
		return tokenResponse{}, oerr(errServerError, "try again later")
	}
	rt := randomToken()
	s.st.mu.Lock()
	room := sweep(s.st.refresh, maxRefresh, func(r *refresh) bool { return r.used || now.After(r.expires) })
	if room {
		s.st.refresh[hashKey(rt)] = &refresh{grant: g, family: family, expires: now.Add(s.cfg.RefreshTTL)}
	}
	s.st.mu.Unlock()
	resp := tokenResponse{AccessToken: at, TokenType: "Bearer", ExpiresIn: int64(s.cfg.AccessTTL.Seconds()), Scope: Scope}
	if room {
		resp.RefreshToken = rt
	}
	return resp, nil
}

// s256Matches is the PKCE S256 check: BASE64URL(SHA256(verifier)) equals
// the challenge.
func s256Matches(verifier, challenge string) bool {
	sum := sha256.Sum256([]byte(verifier))
	got := base64.RawURLEncoding.EncodeToString(sum[:])
	return subtle.ConstantTimeCompare([]byte(got), []byte(challenge)) == 1
}

// revokeGrant voids the access tokens a replayed code or refresh token
// bought, which are JWTs the server cannot recall one by one: it disables
// the agent, so every token issued before now stays void (the directory's
// revocation instant) until the user authorizes the app again.
func (s *Server) revokeGrant(ctx context.Context, g grant) {
	if err := directory.SetAgentDisabled(ctx, s.cfg.Directory, g.tenant, g.agent, true); err != nil {
		s.log.ErrorContext(ctx, "oauth: disabling the agent of a replayed grant failed", "tenant", g.tenant, "agent", g.agent, "error", err)
		return
	}
	s.st.mu.Lock()
	s.st.revokeAgent(g.tenant, g.agent)
	s.st.mu.Unlock()
}

// revoke is RFC 7009 revocation. Revoking a refresh token or an access
// token of a client disables the agent it became, so every token of that
// client for that user stops working at once (the executor resolves the
// directory on every call), and deletes its refresh tokens. Tokens the
// server does not know are answered 200, as §2.2 asks.
func (s *Server) revoke(w http.ResponseWriter, r *http.Request) {
	cors(w)
	form, oe := readForm(w, r)
	if oe != nil {
		s.writeError(w, r, oe)
		return
	}
	cid, oe := clientID(r, form)
	if oe != nil {
		s.writeError(w, r, oe)
		return
	}
	raw := form.Get("token")
	if raw == "" {
		s.writeError(w, r, oerr(errInvalidRequest, "token is required"))
		return
	}
	var tenant, agent, owner string
	s.st.mu.Lock()
	if rt, ok := s.st.refresh[hashKey(raw)]; ok {
		tenant, agent, owner = rt.tenant, rt.agent, rt.clientID
	}
	s.st.mu.Unlock()
	if agent == "" && s.cfg.Verifier != nil {
		if p, err := s.cfg.Verifier.Verify(r.Context(), raw); err == nil && p.AgentID != "" {
			s.st.mu.Lock()
			owner = s.st.agents[agentKey(p.Tenant, p.AgentID)]
			s.st.mu.Unlock()
			if owner != "" {
				tenant, agent = p.Tenant, p.AgentID
			}
		}
	}
	if agent == "" {
		w.WriteHeader(http.StatusOK)
		return
	}
	if owner != cid {
		s.writeError(w, r, oerr(errUnauthorizedClient, "the token was issued to another client"))
		return
	}
	if err := directory.SetAgentDisabled(r.Context(), s.cfg.Directory, tenant, agent, true); err != nil {
		s.log.ErrorContext(r.Context(), "oauth: disabling the agent failed", "tenant", tenant, "agent", agent, "error", err)
		s.writeError(w, r, oerr(errServerError, "try again later"))
		return
	}
	s.st.mu.Lock()
	s.st.revokeAgent(tenant, agent)
	s.st.mu.Unlock()
	s.log.InfoContext(r.Context(), "oauth: access revoked; agent disabled", "client_id", cid, "tenant", tenant, "agent", agent)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
}
