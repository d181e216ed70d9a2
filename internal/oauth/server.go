package oauth

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/identity"
)

// Defaults of Config's lifetimes.
const (
	DefaultAccessTTL  = time.Hour
	DefaultRefreshTTL = 24 * time.Hour
	DefaultCodeTTL    = time.Minute
	// pendingTTL is how long the human has to sign in and answer.
	pendingTTL = 10 * time.Minute
	sessionTTL = 8 * time.Hour
	// metadataTTL is how long a fetched client ID metadata document is
	// trusted before it is fetched again.
	metadataTTL = 5 * time.Minute
)

// Scope is the one scope the server grants: act for the signed-in user
// through Mandate's tools, with that user's permissions.
const Scope = "mandate"

// User is a demo user the consent page offers to sign in as.
type User struct {
	// Tenant and ID name the user in the directory.
	Tenant, ID string
}

// Config wires a Server.
type Config struct {
	// Issuer is the authorization server's identifier and base URL (RFC 8414
	// `issuer`), e.g. "http://127.0.0.1:8080". Its endpoints live under it.
	// Required: an absolute http(s) URL without query or fragment.
	Issuer string
	// Resource is the MCP endpoint tokens are for (RFC 8707), e.g.
	// "http://127.0.0.1:8080/mcp". A request naming another resource is
	// refused with invalid_target. Required.
	Resource string
	// Directory is where an approved client becomes an agent of its user,
	// and where revocation disables it. Required.
	Directory directory.Store
	// Users are the demo users the dev sign-in offers. Required.
	Users []User
	// TokenSecret, TokenIssuer and TokenAudience mint access tokens with
	// identity.MintDev: the same HS256 JWTs `mandate dev` hands out.
	// Required.
	TokenSecret                []byte
	TokenIssuer, TokenAudience string
	// Verifier lets revocation recognise an access token. Optional: without
	// it only refresh tokens can be revoked by value.
	Verifier *identity.Verifier
	// LoopbackDev says the server serves this machine only (`mandate dev`
	// listening on a loopback address): client ID metadata documents may
	// then be fetched from loopback addresses, and over plain http from a
	// loopback host. Otherwise a document must be https and every
	// connection to it goes to a public unicast address. Private,
	// link-local, multicast and other special-purpose addresses are
	// refused either way.
	LoopbackDev bool
	// FetchTimeout bounds fetching one client ID metadata document.
	// Default: DefaultFetchTimeout.
	FetchTimeout time.Duration
	// AccessTTL, RefreshTTL and CodeTTL default to DefaultAccessTTL,
	// DefaultRefreshTTL and DefaultCodeTTL.
	AccessTTL, RefreshTTL, CodeTTL time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now replaces time.Now (tests).
	Now func() time.Time
}

// Server is the authorization server. Mount Handler at every path of Paths.
// It is safe for concurrent use.
type Server struct {
	cfg      Config
	log      *slog.Logger
	st       *state
	fetch    *fetcher
	mux      *http.ServeMux
	origin   string // scheme://host of Issuer
	secure   bool
	prefix   string // path of Issuer without the trailing slash
	wellKnow string
	meta     []byte
}

// Endpoint paths, relative to the issuer's path.
const (
	authorizePath = "/authorize"
	consentPath   = "/authorize/consent"
	signInPath    = "/authorize/signin"
	signOutPath   = "/authorize/signout"
	tokenPath     = "/token"
	registerPath  = "/register"
	revokePath    = "/revoke"
	// cookiePath confines the flow and session cookies to the pages that
	// read them.
	cookiePath = "/authorize"
)

// New validates cfg and builds the server.
func New(cfg Config) (*Server, error) {
	iss, err := url.Parse(cfg.Issuer)
	switch {
	case err != nil || (iss.Scheme != "http" && iss.Scheme != "https") || iss.Host == "" || iss.RawQuery != "" || iss.Fragment != "" || iss.User != nil:
		return nil, fmt.Errorf("oauth: Issuer %q must be an absolute http(s) URL without query or fragment", cfg.Issuer)
	case cfg.Directory == nil:
		return nil, errors.New("oauth: Directory is required")
	case len(cfg.Users) == 0:
		return nil, errors.New("oauth: Users is required")
	case len(cfg.TokenSecret) < identity.MinSecretBytes:
		return nil, fmt.Errorf("oauth: TokenSecret must be at least %d bytes", identity.MinSecretBytes)
	case cfg.TokenIssuer == "" || cfg.TokenAudience == "":
		return nil, errors.New("oauth: TokenIssuer and TokenAudience are required")
	}
	if r, err := url.Parse(cfg.Resource); err != nil || r.Scheme == "" || r.Host == "" || r.Fragment != "" {
		return nil, fmt.Errorf("oauth: Resource %q must be an absolute URL without fragment", cfg.Resource)
	}
	if cfg.AccessTTL <= 0 {
		cfg.AccessTTL = DefaultAccessTTL
	}
	if cfg.RefreshTTL <= 0 {
		cfg.RefreshTTL = DefaultRefreshTTL
	}
	if cfg.CodeTTL <= 0 {
		cfg.CodeTTL = DefaultCodeTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = DefaultFetchTimeout
	}
	cfg.TokenSecret = slices.Clone(cfg.TokenSecret)
	cfg.Users = slices.Clone(cfg.Users)
	s := &Server{
		cfg: cfg, log: cfg.Logger, st: newState(), mux: http.NewServeMux(),
		fetch:  newFetcher(cfg.FetchTimeout, cfg.LoopbackDev, cfg.Now),
		origin: iss.Scheme + "://" + iss.Host, secure: iss.Scheme == "https",
		prefix: strings.TrimSuffix(iss.Path, "/"),
	}
	// RFC 8414 §3: the well-known segment goes between host and path.
	s.wellKnow = "/.well-known/oauth-authorization-server" + s.prefix
	s.cfg.Issuer = s.origin + s.prefix
	if s.meta, err = json.Marshal(s.metadata()); err != nil {
		return nil, fmt.Errorf("oauth: metadata: %w", err)
	}
	s.mux.HandleFunc("GET "+s.wellKnow, s.serveMetadata)
	s.mux.HandleFunc("OPTIONS "+s.wellKnow, s.preflight)
	s.mux.HandleFunc("POST "+s.prefix+registerPath, s.register)
	s.mux.HandleFunc("OPTIONS "+s.prefix+registerPath, s.preflight)
	s.mux.HandleFunc("GET "+s.prefix+authorizePath, s.authorize)
	s.mux.HandleFunc("GET "+s.prefix+consentPath, s.showConsent)
	s.mux.HandleFunc("POST "+s.prefix+consentPath, s.decide)
	s.mux.HandleFunc("POST "+s.prefix+signInPath, s.signIn)
	s.mux.HandleFunc("POST "+s.prefix+signOutPath, s.signOut)
	s.mux.HandleFunc("POST "+s.prefix+tokenPath, s.token)
	s.mux.HandleFunc("OPTIONS "+s.prefix+tokenPath, s.preflight)
	s.mux.HandleFunc("POST "+s.prefix+revokePath, s.revoke)
	s.mux.HandleFunc("OPTIONS "+s.prefix+revokePath, s.preflight)
	return s, nil
}

// Issuer is the server's issuer URL, as protected-resource metadata names it.
func (s *Server) Issuer() string { return s.cfg.Issuer }

// Paths are the patterns to mount Handler at on a server's mux.
func (s *Server) Paths() []string {
	return []string{
		s.wellKnow,
		s.prefix + registerPath,
		s.prefix + authorizePath,
		s.prefix + authorizePath + "/",
		s.prefix + tokenPath,
		s.prefix + revokePath,
	}
}

// Handler serves every endpoint.
func (s *Server) Handler() http.Handler { return s.mux }

// Metadata is the RFC 8414 authorization server metadata.
type Metadata struct {
	Issuer                                     string   `json:"issuer"`
	AuthorizationEndpoint                      string   `json:"authorization_endpoint"`
	TokenEndpoint                              string   `json:"token_endpoint"`
	RegistrationEndpoint                       string   `json:"registration_endpoint"`
	RevocationEndpoint                         string   `json:"revocation_endpoint"`
	ScopesSupported                            []string `json:"scopes_supported"`
	ResponseTypesSupported                     []string `json:"response_types_supported"`
	ResponseModesSupported                     []string `json:"response_modes_supported"`
	GrantTypesSupported                        []string `json:"grant_types_supported"`
	TokenEndpointAuthMethodsSupported          []string `json:"token_endpoint_auth_methods_supported"`
	RevocationEndpointAuthMethodsSupported     []string `json:"revocation_endpoint_auth_methods_supported"`
	CodeChallengeMethodsSupported              []string `json:"code_challenge_methods_supported"`
	AuthorizationResponseIssParameterSupported bool     `json:"authorization_response_iss_parameter_supported"`
	ClientIDMetadataDocumentSupported          bool     `json:"client_id_metadata_document_supported"`
}

func (s *Server) metadata() Metadata {
	return Metadata{
		Issuer:                                     s.cfg.Issuer,
		AuthorizationEndpoint:                      s.cfg.Issuer + authorizePath,
		TokenEndpoint:                              s.cfg.Issuer + tokenPath,
		RegistrationEndpoint:                       s.cfg.Issuer + registerPath,
		RevocationEndpoint:                         s.cfg.Issuer + revokePath,
		ScopesSupported:                            []string{Scope},
		ResponseTypesSupported:                     []string{"code"},
		ResponseModesSupported:                     []string{"query"},
		GrantTypesSupported:                        []string{grantAuthorizationCode, grantRefreshToken},
		TokenEndpointAuthMethodsSupported:          []string{authNone},
		RevocationEndpointAuthMethodsSupported:     []string{authNone},
		CodeChallengeMethodsSupported:              []string{"S256"},
		AuthorizationResponseIssParameterSupported: true,
		ClientIDMetadataDocumentSupported:          true,
	}
}

func (s *Server) serveMetadata(w http.ResponseWriter, _ *http.Request) {
	cors(w)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_, _ = w.Write(s.meta)
}

// cors lets browser-based clients (the MCP Inspector) call the endpoints
// that take no cookie: metadata, registration, token and revocation.
func cors(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, MCP-Protocol-Version")
	h.Set("Access-Control-Max-Age", "600")
}

func (s *Server) preflight(w http.ResponseWriter, _ *http.Request) {
	cors(w)
	w.WriteHeader(http.StatusNoContent)
}

// OAuth error codes (RFC 6749 §4.1.2.1, §5.2; RFC 7591 §3.2.2; RFC 8707 §2).
const (
	errInvalidRequest          = "invalid_request"
	errInvalidClient           = "invalid_client"
	errInvalidGrant            = "invalid_grant"
	errUnauthorizedClient      = "unauthorized_client"
	errUnsupportedGrantType    = "unsupported_grant_type"
	errUnsupportedResponseType = "unsupported_response_type"
	errAccessDenied            = "access_denied"
	errInvalidTarget           = "invalid_target"
	errServerError             = "server_error"
	errTemporarilyUnavailable  = "temporarily_unavailable"
	errInvalidRedirectURI      = "invalid_redirect_uri"
	errInvalidClientMetadata   = "invalid_client_metadata"
)

const (
	grantAuthorizationCode = "authorization_code"
	grantRefreshToken      = "refresh_token"
	authNone               = "none"
)

// oauthError is an error response of the JSON endpoints.
type oauthError struct {
	Code        string `json:"error"`
	Description string `json:"error_description,omitempty"`
}

func (e *oauthError) Error() string { return e.Code + ": " + e.Description }

func oerr(code, format string, args ...any) *oauthError {
	return &oauthError{Code: code, Description: fmt.Sprintf(format, args...)}
}

// writeJSON writes v with the headers RFC 6749 §5.1 asks of token responses.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"server_error"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Pragma", "no-cache")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, e *oauthError) {
	status := http.StatusBadRequest
	switch e.Code {
	case errInvalidClient:
		status = http.StatusUnauthorized
	case errServerError:
		status = http.StatusInternalServerError
	case errTemporarilyUnavailable:
		status = http.StatusServiceUnavailable
	}
	s.log.InfoContext(r.Context(), "oauth: request refused", "path", r.URL.Path, "error", e.Code, "reason", e.Description)
	writeJSON(w, status, e)
}
