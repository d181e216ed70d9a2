package oauth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/mandate-dev/mandate/internal/strictjson"
)

const (
	maxRegistrationBytes = 16 << 10
	// maxMetadataBytes bounds a client ID metadata document (the draft
	// suggests 5 KiB).
	maxMetadataBytes = 5 << 10
	maxRedirectURIs  = 10
	maxURILength     = 2000
	maxNameLength    = 200
	maxClientIDBytes = 2000
)

// clientMetadata is the part of RFC 7591 client metadata the server reads.
// Anything else is accepted and ignored, as §2 asks.
type clientMetadata struct {
	ClientID                string   `json:"client_id,omitempty"`
	ClientName              string   `json:"client_name,omitempty"`
	RedirectURIs            []string `json:"redirect_uris"`
	GrantTypes              []string `json:"grant_types,omitempty"`
	ResponseTypes           []string `json:"response_types,omitempty"`
	TokenEndpointAuthMethod string   `json:"token_endpoint_auth_method,omitempty"`
	ClientSecret            *string  `json:"client_secret,omitempty"`
	Scope                   string   `json:"scope,omitempty"`
}

// registration is the RFC 7591 §3.2.1 response.
type registration struct {
	ClientID                string   `json:"client_id"`
	ClientIDIssuedAt        int64    `json:"client_id_issued_at"`
	ClientName              string   `json:"client_name,omitempty"`
	RedirectURIs            []string `json:"redirect_uris"`
	GrantTypes              []string `json:"grant_types"`
	ResponseTypes           []string `json:"response_types"`
	TokenEndpointAuthMethod string   `json:"token_endpoint_auth_method"`
	Scope                   string   `json:"scope"`
}

// register is dynamic client registration (RFC 7591). Every client is
// public: whatever authentication method it asks for, it gets "none" and
// proves itself with PKCE.
func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	cors(w)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRegistrationBytes))
	if err != nil {
		s.writeError(w, r, oerr(errInvalidClientMetadata, "the registration body is unreadable or larger than %d bytes", maxRegistrationBytes))
		return
	}
	if err := strictjson.Check(body, 0); err != nil {
		s.writeError(w, r, oerr(errInvalidClientMetadata, "the registration body is not one strict JSON object: %v", err))
		return
	}
	var md clientMetadata
	if err := json.Unmarshal(body, &md); err != nil {
		s.writeError(w, r, oerr(errInvalidClientMetadata, "the registration body does not fit RFC 7591 client metadata"))
		return
	}
	if oe := checkClientMetadata(md); oe != nil {
		s.writeError(w, r, oe)
		return
	}
	c := &Client{ID: "mcp-" + randomToken(), Name: md.ClientName, RedirectURIs: md.RedirectURIs, IssuedAt: s.cfg.Now()}
	s.st.mu.Lock()
	// Registered clients never expire; the cap only stops a flood.
	room := sweep(s.st.clients, maxClients, func(c *Client) bool { return c.MetadataDocument })
	if room {
		s.st.clients[c.ID] = c
	}
	s.st.mu.Unlock()
	if !room {
		s.writeError(w, r, oerr(errTemporarilyUnavailable, "too many registered clients"))
		return
	}
	s.log.InfoContext(r.Context(), "oauth: client registered", "client_id", c.ID, "client_name", c.Name, "redirect_uris", c.RedirectURIs)
	writeJSON(w, http.StatusCreated, registration{
		ClientID: c.ID, ClientIDIssuedAt: c.IssuedAt.Unix(), ClientName: c.Name, RedirectURIs: c.RedirectURIs,
		GrantTypes: []string{grantAuthorizationCode, grantRefreshToken}, ResponseTypes: []string{"code"},
		TokenEndpointAuthMethod: authNone, Scope: Scope,
	})
}

// checkClientMetadata validates registration or document metadata.
func checkClientMetadata(md clientMetadata) *oauthError {
	if len(md.RedirectURIs) == 0 {
		return oerr(errInvalidRedirectURI, "redirect_uris is required")
	}
	if len(md.RedirectURIs) > maxRedirectURIs {
		return oerr(errInvalidRedirectURI, "at most %d redirect_uris", maxRedirectURIs)
	}
	for _, u := range md.RedirectURIs {
		if err := checkRedirectURI(u); err != nil {
			return oerr(errInvalidRedirectURI, "%v", err)
		}
	}
	for _, g := range md.GrantTypes {
		if g != grantAuthorizationCode && g != grantRefreshToken {
			return oerr(errInvalidClientMetadata, "grant type %q is not supported; use authorization_code and refresh_token", g)
		}
	}
	for _, t := range md.ResponseTypes {
		if t != "code" {
			return oerr(errInvalidClientMetadata, "response type %q is not supported; use code", t)
		}
	}
	if len(md.ClientName) > maxNameLength || !utf8.ValidString(md.ClientName) ||
		strings.IndexFunc(md.ClientName, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) }) >= 0 {
		return oerr(errInvalidClientMetadata, "client_name must be at most %d characters of text without control characters", maxNameLength)
	}
	return nil
}

var schemeRE = regexp.MustCompile(`^[a-z][a-z0-9+.-]*$`)

// hostSchemes are the private-use schemes of MCP hosts that predate RFC
// 8252's reverse-domain rule (a scheme without a dot): accepted by name,
// so that a scheme of the operating system (ms-settings:, view-source:,
// tel:) never is.
var hostSchemes = map[string]bool{"cursor": true, "vscode": true, "vscode-insiders": true}

// checkRedirectURI accepts https URIs, http URIs on a loopback host
// (RFC 8252 §7.3) and private-use schemes of native apps (§7.1): a reverse
// domain name the app owns (com.example.app:/cb), or one of hostSchemes;
// never with fragment or user info.
func checkRedirectURI(raw string) error {
	if len(raw) > maxURILength {
		return fmt.Errorf("redirect URI longer than %d bytes", maxURILength)
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || !u.IsAbs() {
		return fmt.Errorf("redirect URI %q is not an absolute URI", raw)
	}
	if strings.Contains(raw, "#") {
		return fmt.Errorf("redirect URI %q has a fragment", raw)
	}
	if u.User != nil {
		return fmt.Errorf("redirect URI %q has user info", raw)
	}
	switch u.Scheme {
	case "https":
		if u.Host == "" {
			return fmt.Errorf("redirect URI %q has no host", raw)
		}
	case "http":
		if !isLoopback(u.Hostname()) {
			return fmt.Errorf("redirect URI %q: plain http only on a loopback host (127.0.0.1, [::1], localhost)", raw)
		}
	case "javascript", "data", "file", "vbscript", "about", "blob", "filesystem", "ws", "wss":
		return fmt.Errorf("redirect URI scheme %q is not allowed", u.Scheme)
	default:
		if !schemeRE.MatchString(u.Scheme) {
			return fmt.Errorf("redirect URI %q has an invalid scheme", raw)
		}
		if !strings.Contains(u.Scheme, ".") && !hostSchemes[u.Scheme] {
			return fmt.Errorf("redirect URI scheme %q is not a private-use scheme: use https, http on a loopback host, or a reverse domain name you own (RFC 8252 §7.1), e.g. com.example.app", u.Scheme)
		}
	}
	return nil
}

// isLoopback reports whether host names this machine.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// matchRedirectURI finds the registered URI the request's redirect_uri
// matches: exactly, or — for http on a loopback host — in everything but
// the port, which native apps pick at run time (RFC 8252 §7.3).
func matchRedirectURI(registered []string, got string) bool {
	if slices.Contains(registered, got) {
		return true
	}
	g, err := url.Parse(got)
	if err != nil || g.Scheme != "http" || !isLoopback(g.Hostname()) || strings.Contains(got, "#") || g.User != nil {
		return false
	}
	for _, reg := range registered {
		r, err := url.Parse(reg)
		if err != nil || r.Scheme != "http" || !isLoopback(r.Hostname()) {
			continue
		}
		if r.Hostname() == g.Hostname() && r.EscapedPath() == g.EscapedPath() && r.RawQuery == g.RawQuery {
			return true
		}
	}
	return false
}

// isMetadataDocumentID reports whether a client_id names a client ID
// metadata document rather than a registered client.
func isMetadataDocumentID(id string) bool {
	return strings.HasPrefix(id, "https://") || strings.HasPrefix(id, "http://")
}

// client returns the client a client_id names: a registered one, or the
// client its metadata document describes, fetched (and cached for
// metadataTTL) within the fetcher's bounds on r's behalf.
func (s *Server) client(r *http.Request, id string) (*Client, *oauthError) {
	ctx := r.Context()
	if id == "" {
		return nil, oerr(errInvalidRequest, "client_id is required")
	}
	if len(id) > maxClientIDBytes {
		return nil, oerr(errInvalidClient, "client_id is too long")
	}
	now := s.cfg.Now()
	s.st.mu.Lock()
	c, ok := s.st.clients[id]
	s.st.mu.Unlock()
	if ok && (!c.MetadataDocument || now.Sub(c.IssuedAt) < metadataTTL) {
		return c, nil
	}
	if !isMetadataDocumentID(id) {
		return nil, oerr(errInvalidClient, "unknown client_id; register first")
	}
	u, err := s.checkMetadataDocumentURL(id)
	if err != nil {
		// The URL's own text breaks the rules: saying how tells the caller
		// nothing it did not write.
		s.log.InfoContext(ctx, "oauth: client ID metadata document refused", "client_id", id, "reason", err.Error())
		return nil, oerr(errInvalidClient, "the client ID metadata document could not be used: %v", err)
	}
	// One answer for every way a fetched document fails (no answer, an
	// address that is not public, a status, a size, a content, a failure
	// remembered, too many fetches): the error page must not tell an
	// unauthenticated caller what a URL it named answers, nor where it is.
	uniform := oerr(errInvalidClient, "the client ID metadata document could not be fetched, or is not valid client metadata (try again in a minute)")
	switch {
	case s.fetch.failed(id):
		s.log.InfoContext(ctx, "oauth: client ID metadata document refused", "client_id", id, "reason", "it failed less than "+failureTTL.String()+" ago")
		return nil, uniform
	case !s.fetch.allow(clientAddr(r)):
		s.log.WarnContext(ctx, "oauth: client ID metadata document refused", "client_id", id, "reason", errRateLimited.Error(), "client_addr", clientAddr(r))
		return nil, uniform
	}
	c, err = s.fetch.fetch(ctx, id, func(ctx context.Context) (*Client, error) { return s.fetchDocument(ctx, u, id) })
	if err != nil {
		s.log.InfoContext(ctx, "oauth: client ID metadata document refused", "client_id", id, "reason", err.Error())
		return nil, uniform
	}
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	if !sweep(s.st.clients, maxClients, func(c *Client) bool { return c.MetadataDocument && now.Sub(c.IssuedAt) >= metadataTTL }) {
		return nil, oerr(errTemporarilyUnavailable, "too many clients")
	}
	s.st.clients[id] = c
	return c, nil
}

// checkMetadataDocumentURL applies the client ID metadata document rules to
// the URL: https (or loopback http when allowed), a path, no fragment, user
// info or dot segments.
func (s *Server) checkMetadataDocumentURL(id string) (*url.URL, error) {
	u, err := url.Parse(id)
	if err != nil || u.Host == "" {
		return nil, errors.New("client_id is not an absolute URL")
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && s.cfg.LoopbackDev && isLoopback(u.Hostname()):
	default:
		return nil, errors.New("client_id must be an https URL")
	}
	if u.Path == "" || u.Path == "/" || u.Fragment != "" || strings.Contains(id, "#") || u.User != nil {
		return nil, errors.New("client_id must have a path and no fragment or user info")
	}
	for _, seg := range strings.Split(u.Path, "/") {
		if seg == "." || seg == ".." {
			return nil, errors.New("client_id must not have dot segments")
		}
	}
	return u, nil
}

// fetchDocument fetches the document at u, which checkMetadataDocumentURL
// accepted, and checks that it describes the client id. Its errors are
// logged, never shown.
func (s *Server) fetchDocument(ctx context.Context, u *url.URL, id string) (*Client, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil) //nolint:gosec // G704: fetching the client's document is the point; the URL is checked above
	if err != nil {
		return nil, errors.New("client_id is not a fetchable URL")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := s.fetch.client.Do(req) //nolint:gosec // G704: as above; the transport connects to public addresses only
	if err != nil {
		if errors.Is(err, errNonPublicAddress) {
			return nil, fmt.Errorf("its host resolves to an address this server does not fetch from: %w", err)
		}
		return nil, fmt.Errorf("fetching it failed: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetching it answered HTTP %d", resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxMetadataBytes+1))
	if err != nil {
		return nil, errors.New("reading it failed")
	}
	if len(body) > maxMetadataBytes {
		return nil, fmt.Errorf("it is larger than %d bytes", maxMetadataBytes)
	}
	if err := strictjson.Check(body, 0); err != nil {
		return nil, fmt.Errorf("it is not one strict JSON object: %w", err)
	}
	var md clientMetadata
	if err := json.Unmarshal(body, &md); err != nil {
		return nil, errors.New("it does not fit RFC 7591 client metadata")
	}
	switch {
	case md.ClientID != id:
		return nil, errors.New("its client_id is not its own URL")
	case md.ClientSecret != nil:
		return nil, errors.New("it carries a client_secret")
	case md.TokenEndpointAuthMethod != "" && md.TokenEndpointAuthMethod != authNone:
		return nil, fmt.Errorf("token_endpoint_auth_method %q is not supported; use none", md.TokenEndpointAuthMethod)
	}
	if oe := checkClientMetadata(md); oe != nil {
		return nil, errors.New(oe.Description)
	}
	return &Client{ID: id, Name: md.ClientName, RedirectURIs: md.RedirectURIs, MetadataDocument: true, IssuedAt: s.cfg.Now()}, nil
}

// agentID derives the directory id of the agent a client becomes for one
// user: the client's name slugged, and a short hash of client, tenant and
// user, so two users of one client are two agents.
func agentID(c *Client, tenant, user string) string {
	name := c.Name
	if name == "" && c.MetadataDocument {
		if u, err := url.Parse(c.ID); err == nil {
			name = u.Hostname()
		}
	}
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(name) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
		if b.Len() >= 32 {
			break
		}
	}
	slug := strings.Trim(b.String(), "-")
	if slug == "" {
		slug = "mcp-client"
	}
	h := sha256.Sum256([]byte(c.ID + "\x00" + tenant + "\x00" + user))
	return slug + "-" + hex.EncodeToString(h[:4])
}
