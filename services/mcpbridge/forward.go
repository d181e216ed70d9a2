package mcpbridge

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/mandate-dev/mandate/services/mcpbridge/internal/sealed"
)

// Sessions of the 2024–2025 revisions live in the memory of the replica
// that initialised them, and so does a call waiting for its elicitation
// answer. With Config.AdvertiseURL set, the bridge names the owner in every
// session id it issues, sealed with the state key, and a replica that
// receives a request for a session of another replica forwards it there:
// behind a plain round-robin balancer, any replica answers any request.

// ForwardedHeader marks a request one replica forwarded to the owner of its
// session. Its value is an HMAC of the session id under the state key, so
// only replicas can set it; a replica never forwards a request that carries
// a valid one (no loops), and ignores and drops any other.
const ForwardedHeader = "Mandate-Forwarded-Session"

// ForwardDialTimeout bounds connecting to a session's owner. An owner that
// cannot be reached in time is taken as lost: the session is answered 404
// (session not found), on which clients initialise a new one.
const ForwardDialTimeout = 2 * time.Second

const (
	sessionIDHeader = "Mcp-Session-Id"
	// forwardLabel separates these MACs from the sealed ids' (package
	// sealed) and from the requestState's.
	forwardLabel = "mandate.dev/mcp-forwarded/v1\x00"
)

// errSessionNotFound is the text the SDK answers an unknown session with.
const errSessionNotFound = "session not found"

type (
	ownerKey     struct{}
	forwardedKey struct{}
)

// IsAdvertiseURL reports whether s can be Config.AdvertiseURL: an
// absolute http(s) URL without query, fragment or user info.
func IsAdvertiseURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" &&
		u.RawQuery == "" && !u.ForceQuery && u.Fragment == "" && u.User == nil && !strings.Contains(s, "#")
}

// advertiseURL validates Config.AdvertiseURL and returns it normalised
// (no trailing slash).
func advertiseURL(s string) (string, error) {
	if !IsAdvertiseURL(s) {
		return "", fmt.Errorf("mcpbridge: AdvertiseURL %q is not an absolute http(s) URL without query, fragment or user info", s)
	}
	u, _ := url.Parse(s) // checked above
	return strings.TrimSuffix(u.String(), "/"), nil
}

// newSessionID is the servers' ServerOptions.GetSessionID when forwarding
// is on: an id sealed to this replica (package sealed).
func (b *Bridge) newSessionID() string { return b.sealer.Seal(sealed.SessionLabel) }

// sessionOwner opens a session id the bridge issued and returns its owner's
// advertised URL; ok is false for any id not sealed with this state key.
func (b *Bridge) sessionOwner(id string) (owner string, ok bool) {
	return b.sealer.Open(sealed.SessionLabel, id)
}

// forwardMark is the ForwardedHeader value for a session id.
func (b *Bridge) forwardMark(id string) string {
	h := hmac.New(sha256.New, b.cfg.StateKey)
	h.Write([]byte(forwardLabel))
	h.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// fromReplica reports whether r was forwarded by another replica: it
// carries a session id and the ForwardedHeader sealed for it.
func (b *Bridge) fromReplica(r *http.Request) bool {
	mark, id := r.Header.Get(ForwardedHeader), r.Header.Get(sessionIDHeader)
	return mark != "" && id != "" && hmac.Equal([]byte(mark), []byte(b.forwardMark(id)))
}

// acceptForwarded wraps the bridge's handler chain. A request another
// replica forwarded skips the cross-origin check, which the receiving
// replica made against the Host the client used (the forwarded request
// names the owner's); it is still authenticated. Any other request loses
// a ForwardedHeader it may carry.
func (b *Bridge) acceptForwarded(checked, protected http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b.fromReplica(r) {
			r.Header.Del(ForwardedHeader)
			protected.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), forwardedKey{}, true)))
			return
		}
		r.Header.Del(ForwardedHeader)
		checked.ServeHTTP(w, r)
	})
}

// routeSessions serves a request for a session of this replica (or no
// session) with local, forwards one for another replica's session to its
// owner, and answers 404 for a session id the bridge did not issue: it is
// never forwarded, so a client cannot steer a replica anywhere else. A
// forwarded request is served here whatever its id names (the SDK answers
// 404 for a session it does not hold), so forwarding never loops.
func (b *Bridge) routeSessions(local http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(sessionIDHeader)
		if id == "" || statelessRequest(r) || r.Context().Value(forwardedKey{}) != nil {
			local.ServeHTTP(w, r)
			return
		}
		owner, ok := b.sessionOwner(id)
		if !ok {
			http.Error(w, errSessionNotFound, http.StatusNotFound)
			return
		}
		if owner == b.advertise {
			local.ServeHTTP(w, r)
			return
		}
		u, err := url.Parse(owner)
		if err != nil {
			http.Error(w, errSessionNotFound, http.StatusNotFound)
			return
		}
		// The forwarded request ends with the client's or when this bridge
		// closes, so that a forwarded SSE stream does not hold up shutdown.
		ctx, cancel := context.WithCancel(context.WithValue(r.Context(), ownerKey{}, u))
		defer cancel()
		stop := context.AfterFunc(b.ctx, cancel)
		defer stop()
		b.log.DebugContext(ctx, "mcpbridge: forwarding to the session's owner", "owner", owner, "method", r.Method)
		b.proxy.ServeHTTP(w, r.WithContext(ctx))
		if b.ctx.Err() != nil {
			// A connection pooled after Close would outlive the bridge.
			if tr, ok := b.proxy.Transport.(*http.Transport); ok {
				tr.CloseIdleConnections()
			}
		}
	})
}

// newProxy is the forwarder: method, headers (Authorization and
// Mcp-Session-Id among them) and body go to the owner as they came, with
// the ForwardedHeader added; responses, SSE streams included, are flushed
// as they arrive. Connections to owners skip any HTTP proxy of the
// environment.
func (b *Bridge) newProxy() (*httputil.ReverseProxy, *http.Transport) {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: ForwardDialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: ForwardDialTimeout,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(pr.In.Context().Value(ownerKey{}).(*url.URL))
			pr.SetXForwarded()
			pr.Out.Header.Set(ForwardedHeader, b.forwardMark(pr.In.Header.Get(sessionIDHeader)))
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler:  b.forwardFailed,
		ErrorLog:      slog.NewLogLogger(b.log.Handler(), slog.LevelWarn),
	}, tr
}

// forwardFailed answers a request whose owner could not be reached: the
// owner is gone and its sessions with it, so 404 (session not found), on
// which MCP clients initialise a new session. A client that went away gets
// nothing; a bridge that is closing answers 503.
func (b *Bridge) forwardFailed(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case b.ctx.Err() != nil:
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
	case errors.Is(err, context.Canceled) || r.Context().Err() != nil:
		// The client is gone; there is no one to answer.
	default:
		owner, _ := r.Context().Value(ownerKey{}).(*url.URL)
		b.log.WarnContext(r.Context(), "mcpbridge: the session's owner is unreachable; answering session not found",
			"owner", owner.String(), "error", err)
		http.Error(w, errSessionNotFound, http.StatusNotFound)
	}
}

// sessionIDs is the servers' session id generator: sealed ids naming this
// replica when forwarding is on, the SDK's random ones otherwise.
func (b *Bridge) sessionIDs() func() string {
	if b.proxy == nil {
		return nil
	}
	return b.newSessionID
}
