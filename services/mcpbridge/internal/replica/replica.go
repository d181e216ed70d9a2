// Package replica is the MCP bridge's replica edge: it forwards a request
// for a session or a task another replica owns to that replica, and
// recognises the requests other replicas forwarded to this one.
//
// Sessions of the 2024–2025 revisions live in the memory of the replica
// that initialised them, and so does a call waiting for its elicitation
// answer. The bridge names the owner in every session (and task) id it
// issues, sealed with the state key (package sealed), and a replica that
// receives a request for a session of another replica forwards it there:
// behind a plain round-robin balancer, any replica answers any request.
package replica

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/mandate-dev/mandate/services/mcpbridge/internal/sealed"
)

// ForwardedHeader marks a request one replica forwarded to the owner of its
// session. Its value is an HMAC of the session id under the state key, so
// only replicas can set it; a replica never forwards a request that carries
// a valid one (no loops), and ignores and drops any other.
const ForwardedHeader = "Mandate-Forwarded-Session"

// TaskForwardedHeader marks a 2025-11-25 tasks/* request one replica
// forwarded to the replica that holds the task, from a session of its own:
// "mac:taskId", the mac an HMAC of the task id under the state key, so
// only replicas can set it.
const TaskForwardedHeader = "Mandate-Forwarded-Task"

// DialTimeout bounds connecting to a session's owner. An owner that
// cannot be reached in time is taken as lost: the session is answered 404
// (session not found), on which clients initialise a new one.
const DialTimeout = 2 * time.Second

const (
	sessionIDHeader = "Mcp-Session-Id"
	// forwardLabel separates these MACs from the sealed ids' (package
	// sealed) and from the bridge's other MACs under the state key.
	forwardLabel = "mandate.dev/mcp-forwarded/v1\x00"
	// taskForwardLabel separates the TaskForwardedHeader's MACs likewise.
	taskForwardLabel = "mandate.dev/mcp-task-forwarded/v1\x00"
)

// errSessionNotFound is the text the SDK answers an unknown session with.
const errSessionNotFound = "session not found"

type (
	ownerKey     struct{}
	forwardedKey struct{}
)

// Forwarder forwards requests to the replicas that own their sessions or
// tasks. It is safe for concurrent use.
type Forwarder struct {
	key    []byte
	sealer *sealed.Sealer
	log    *slog.Logger
	closed context.Context
	proxy  *httputil.ReverseProxy
}

// New returns a Forwarder for the replica sealer names, marking the
// requests it forwards with key (the state key, kept as given). Requests
// it forwards end when closed is done, and so do its pooled connections.
func New(closed context.Context, key []byte, sealer *sealed.Sealer, log *slog.Logger) *Forwarder {
	f := &Forwarder{key: key, sealer: sealer, log: log, closed: closed}
	var tr *http.Transport
	f.proxy, tr = f.newProxy()
	context.AfterFunc(closed, tr.CloseIdleConnections)
	return f
}

// mark is the ForwardedHeader value for a session id.
func (f *Forwarder) mark(id string) string {
	h := hmac.New(sha256.New, f.key)
	h.Write([]byte(forwardLabel))
	h.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// TaskMark is the TaskForwardedHeader value for a task id.
func (f *Forwarder) TaskMark(id string) string {
	h := hmac.New(sha256.New, f.key)
	h.Write([]byte(taskForwardLabel))
	h.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)) + ":" + id
}

// TaskPeer returns the task id of a request a replica forwarded to this
// one for that task (TaskForwardedHeader); ok is false for any other.
func (f *Forwarder) TaskPeer(r *http.Request) (id string, ok bool) {
	mark := r.Header.Get(TaskForwardedHeader)
	_, id, found := strings.Cut(mark, ":")
	if !found || id == "" || !hmac.Equal([]byte(mark), []byte(f.TaskMark(id))) {
		return "", false
	}
	return id, true
}

// fromReplica reports whether r was forwarded by another replica: it
// carries a session id and the ForwardedHeader sealed for it.
func (f *Forwarder) fromReplica(r *http.Request) bool {
	mark, id := r.Header.Get(ForwardedHeader), r.Header.Get(sessionIDHeader)
	return mark != "" && id != "" && hmac.Equal([]byte(mark), []byte(f.mark(id)))
}

// AcceptForwarded wraps the bridge's handler chain. A request another
// replica forwarded skips the cross-origin check, which the receiving
// replica made against the Host the client used (the forwarded request
// names the owner's); it is still authenticated. Any other request loses
// a ForwardedHeader it may carry.
func (f *Forwarder) AcceptForwarded(checked, protected http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.fromReplica(r) {
			r.Header.Del(ForwardedHeader)
			protected.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), forwardedKey{}, true)))
			return
		}
		r.Header.Del(ForwardedHeader)
		checked.ServeHTTP(w, r)
	})
}

// RouteSessions serves a request for a session of this replica (or no
// session, or one for which local reports true) with local, forwards one
// for another replica's session to its owner, and answers 404 for a
// session id the bridge did not issue: it is never forwarded, so a client
// cannot steer a replica anywhere else. A forwarded request is served here
// whatever its id names (the SDK answers 404 for a session it does not
// hold), so forwarding never loops.
func (f *Forwarder) RouteSessions(local http.Handler, servedHere func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(sessionIDHeader)
		if id == "" || servedHere(r) || r.Context().Value(forwardedKey{}) != nil {
			local.ServeHTTP(w, r)
			return
		}
		owner, ok := f.sealer.Open(sealed.SessionLabel, id)
		if !ok {
			http.Error(w, errSessionNotFound, http.StatusNotFound)
			return
		}
		if owner == f.sealer.Owner() {
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
		stop := context.AfterFunc(f.closed, cancel)
		defer stop()
		f.log.DebugContext(ctx, "mcpbridge: forwarding to the session's owner", "owner", owner, "method", r.Method)
		f.proxy.ServeHTTP(w, r.WithContext(ctx))
		if f.closed.Err() != nil {
			// A connection pooled after Close would outlive the bridge.
			if tr, ok := f.proxy.Transport.(*http.Transport); ok {
				tr.CloseIdleConnections()
			}
		}
	})
}

// ForwardTask sends a request for a task of another replica there, as it
// came (the owner authenticates it again).
func (f *Forwarder) ForwardTask(w http.ResponseWriter, r *http.Request, owner string) {
	u, err := url.Parse(owner)
	if err != nil {
		http.Error(w, "task not found", http.StatusNotFound)
		return
	}
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), ownerKey{}, u))
	defer cancel()
	stop := context.AfterFunc(f.closed, cancel)
	defer stop()
	f.log.DebugContext(ctx, "mcpbridge: forwarding to the task's owner", "owner", owner)
	f.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// newProxy is the forwarder: method, headers (Authorization and
// Mcp-Session-Id among them) and body go to the owner as they came, with
// the ForwardedHeader added; responses, SSE streams included, are flushed
// as they arrive. Connections to owners skip any HTTP proxy of the
// environment.
func (f *Forwarder) newProxy() (*httputil.ReverseProxy, *http.Transport) {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: DialTimeout,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(pr.In.Context().Value(ownerKey{}).(*url.URL))
			pr.SetXForwarded()
			pr.Out.Header.Set(ForwardedHeader, f.mark(pr.In.Header.Get(sessionIDHeader)))
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler:  f.failed,
		ErrorLog:      slog.NewLogLogger(f.log.Handler(), slog.LevelWarn),
	}, tr
}

// failed answers a request whose owner could not be reached: the owner is
// gone and its sessions with it, so 404 (session not found), on which MCP
// clients initialise a new session. A client that went away gets nothing;
// a bridge that is closing answers 503.
func (f *Forwarder) failed(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case f.closed.Err() != nil:
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
	case errors.Is(err, context.Canceled) || r.Context().Err() != nil:
		// The client is gone; there is no one to answer.
	default:
		owner, _ := r.Context().Value(ownerKey{}).(*url.URL)
		f.log.WarnContext(r.Context(), "mcpbridge: the session's owner is unreachable; answering session not found",
			"owner", owner.String(), "error", err)
		http.Error(w, errSessionNotFound, http.StatusNotFound)
	}
}
