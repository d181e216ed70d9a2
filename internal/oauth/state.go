package oauth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"sync"
	"time"
)

// Bounds on what anonymous callers can make the server keep. Registration
// and the authorization endpoint need no credential, so each table is capped;
// past the cap the oldest expired entries go first, then requests are
// refused with temporarily_unavailable.
const (
	maxClients  = 10000
	maxPending  = 10000
	maxSessions = 1000
	maxCodes    = 10000
	maxRefresh  = 100000
)

// Client is a client the server knows: registered (RFC 7591) or described
// by a client ID metadata document (its ID is the document's URL).
type Client struct {
	// ID is the client_id.
	ID string
	// Name is the client_name the client gave itself (self-asserted).
	Name string
	// RedirectURIs are the registered redirection URIs.
	RedirectURIs []string
	// MetadataDocument is true when ID is the URL of a client ID metadata
	// document, fetched and checked by the server.
	MetadataDocument bool
	// IssuedAt is when the client registered or its document was fetched.
	IssuedAt time.Time
}

// pending is an authorization request awaiting the human's answer.
type pending struct {
	client                                  Client
	redirectURI, state, challenge, resource string
	scope                                   string
	// browser is the hash of the flow cookie of the browser that made the
	// request; only that browser may answer it.
	browser string
	// csrf guards the sign-in form of this request.
	csrf    string
	expires time.Time
}

// session is a signed-in human on the consent page.
type session struct {
	tenant, user, csrf string
	expires            time.Time
}

// grant is what an authorization code or a refresh token stands for.
type grant struct {
	clientID, clientName               string
	tenant, user, org, agent, resource string
}

type code struct {
	grant
	redirectURI, challenge string
	expires                time.Time
	used, reused           bool
	// family is the refresh-token family issued for the code, revoked when
	// the code is presented again (OAuth 2.1 §4.1.3).
	family string
}

type refresh struct {
	grant
	family  string
	expires time.Time
	used    bool
}

// state is the server's memory. Secrets (codes, refresh tokens, session
// and flow cookies) are keyed by their SHA-256, never stored as given.
type state struct {
	mu       sync.Mutex
	clients  map[string]*Client
	pending  map[string]*pending
	sessions map[string]*session
	codes    map[string]*code
	refresh  map[string]*refresh
	// agents maps tenant + agent id to the client it was registered for.
	agents map[string]string
}

func newState() *state {
	return &state{
		clients: map[string]*Client{}, pending: map[string]*pending{}, sessions: map[string]*session{},
		codes: map[string]*code{}, refresh: map[string]*refresh{}, agents: map[string]string{},
	}
}

// sweep drops expired entries of m when it is at its cap, and reports
// whether there is room for one more.
func sweep[T any](m map[string]*T, limit int, expired func(*T) bool) bool {
	if len(m) < limit {
		return true
	}
	for k, v := range m {
		if expired(v) {
			delete(m, k)
		}
	}
	return len(m) < limit
}

// revokeFamily deletes every refresh token of a family. Callers hold mu.
func (s *state) revokeFamily(family string) {
	if family == "" {
		return
	}
	for k, r := range s.refresh {
		if r.family == family {
			delete(s.refresh, k)
		}
	}
}

// revokeAgent deletes every refresh token issued to an agent. Callers hold mu.
func (s *state) revokeAgent(tenant, agent string) {
	for k, r := range s.refresh {
		if r.tenant == tenant && r.agent == agent {
			delete(s.refresh, k)
		}
	}
}

func agentKey(tenant, agent string) string { return tenant + "\x00" + agent }

// randomToken returns 256 random bits, base64url without padding.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// hashKey is the map key of a secret value.
func hashKey(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}
