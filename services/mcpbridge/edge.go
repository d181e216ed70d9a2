package mcpbridge

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/edgelimit"
	"github.com/mandate-dev/mandate/internal/failure"
)

// DefaultMaxSessions bounds the MCP sessions one principal (tenant, user,
// agent) may hold open on one bridge: hosts open one or two per
// connection, and each session holds server state until it ends or
// SessionTimeout closes it.
const DefaultMaxSessions = 32

// sessionHeader names a request's MCP session (Streamable HTTP).
const sessionHeader = "Mcp-Session-Id"

// jsonrpcServerError is JSON-RPC 2.0's first implementation-defined
// server error code, used for a refusal at the edge, before any method.
const jsonrpcServerError = -32000

// opening counts, per principal, the initialize requests being served,
// whose sessions do not exist yet, so that concurrent ones cannot pass the
// session cap together.
type opening struct {
	mu sync.Mutex
	n  map[string]int
}

// limitEdge is the bridge's edge (docs/architecture/limits.md), after
// authentication: a request past its principal's rate (Config.EdgeLimit)
// is refused 429 rate.limited with Retry-After; a request that would open
// a session past Config.MaxSessions is refused 429 session.too_many. Each
// refusal is recorded (Config.EdgeRecorder), at most a bounded number of
// rows per principal, the rest counted.
func (b *Bridge) limitEdge(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := verifiedCaller(auth.TokenInfoFromContext(r.Context()))
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		session := r.Header.Get(sessionHeader)
		if allowed, retry := b.cfg.EdgeLimit.Allow(edgelimit.Key(c.p)); !allowed {
			b.refuseAtEdge(w, c, session, edgelimit.RateLimited(retry), retry)
			return
		}
		if session != "" || r.Method != http.MethodPost || statelessRequest(r) && len(b.cfg.StateKey) > 0 {
			next.ServeHTTP(w, r)
			return
		}
		if _, ok := b.taskPeer(r); ok {
			// A tasks/* request another replica forwarded without its
			// session (tasks2026.go): it opens none.
			next.ServeHTTP(w, r)
			return
		}
		// A POST without a session on the stateful transport: an
		// initialize, which opens one.
		key := c.info.UserID
		if !b.openSession(key) {
			e := failure.New(failure.StageRequest, failure.CodeSessionTooMany,
				"this caller already holds "+strconv.Itoa(b.cfg.MaxSessions)+" open MCP sessions; end one (HTTP DELETE with its Mcp-Session-Id) or wait for an idle one to time out")
			b.refuseAtEdge(w, c, "", e, time.Minute)
			return
		}
		// The reservation ends once the answer starts: by then the
		// session, if the initialize opened one, counts itself.
		rw := &releasing{ResponseWriter: w, release: sync.OnceFunc(func() { b.opened(key) })}
		defer rw.release()
		next.ServeHTTP(rw, r)
	})
}

// releasing is a ResponseWriter that calls release before the answer's
// first byte.
type releasing struct {
	http.ResponseWriter
	release func()
}

func (w *releasing) WriteHeader(code int) {
	w.release()
	w.ResponseWriter.WriteHeader(code)
}

func (w *releasing) Write(b []byte) (int, error) {
	w.release()
	return w.ResponseWriter.Write(b)
}

// Flush keeps the answer streamable (SSE).
func (w *releasing) Flush() {
	w.release()
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *releasing) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// openSession reserves a session for key unless its open sessions and
// those being opened reach Config.MaxSessions; opened releases the
// reservation once the initialize has been served (the session, if any,
// then counts itself).
func (b *Bridge) openSession(key string) bool {
	b.opening.mu.Lock()
	defer b.opening.mu.Unlock()
	if b.openSessions(key)+b.opening.n[key] >= b.cfg.MaxSessions {
		return false
	}
	b.opening.n[key]++
	return true
}

func (b *Bridge) opened(key string) {
	b.opening.mu.Lock()
	defer b.opening.mu.Unlock()
	if b.opening.n[key]--; b.opening.n[key] <= 0 {
		delete(b.opening.n, key)
	}
}

// openSessions counts the sessions open on key's server.
func (b *Bridge) openSessions(key string) int {
	b.mu.Lock()
	e := b.servers[key]
	b.mu.Unlock()
	if e == nil {
		return 0
	}
	n := 0
	for range e.srv.Sessions() {
		n++
	}
	return n
}

// refuseAtEdge answers e (retriable, after retry) as HTTP 429 with
// Retry-After and a JSON-RPC error whose data is the refusal, as every
// MCP client can read it, and records it.
func (b *Bridge) refuseAtEdge(w http.ResponseWriter, c *caller, session string, e *failure.Error, retry time.Duration) {
	spec, _ := failure.Lookup(e.Code)
	e.Retriable, e.Remedy, e.RetryAfter = spec.Retriable, spec.Remedy, retry
	b.cfg.EdgeRecorder.Record(edgelimit.Refusal{Principal: c.p, Channel: contract.ChannelMCP, Code: e.Code, Message: e.Message, Session: session})
	secs := failure.RetryAfterSeconds(retry)
	body, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": nil,
		"error": map[string]any{
			"code": jsonrpcServerError, "message": e.Message,
			"data": map[string]any{"code": e.Code, "stage": e.Stage, "retriable": e.Retriable, "remedy": e.Remedy, "retry_after": secs},
		},
	})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body)
}
