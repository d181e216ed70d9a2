package mcpbridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/edgelimit"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/tooldesc"
	"github.com/mandate-dev/mandate/services/mcpbridge/internal/replica"
	"github.com/mandate-dev/mandate/services/mcpbridge/internal/sealed"
)

// Config wires a Bridge.
type Config struct {
	// Catalog lists each principal's tools and serves the manifest; its
	// tools must come from Manifest. Required.
	Catalog Catalog
	// Confirm, when set, lets the bridge ask the client's user to confirm a
	// call through elicitation. Without it every confirmation goes through
	// the approval URL.
	Confirm Confirmer
	// Executor runs tools/call. Required.
	Executor Executor
	// Manifest tells a published command (sent to the executor, listed or
	// not) from a name that is no command (JSON-RPC -32602). Required.
	Manifest *manifest.Set
	// Verifier checks bearer tokens, audience included. Required.
	Verifier *identity.Verifier
	// ResourceURL is the canonical URL of the MCP endpoint, e.g.
	// "https://mandate.example.com/mcp" (the RFC 9728 `resource`). Required.
	ResourceURL string
	// AuthorizationServers are the issuer URLs of the authorization servers
	// clients get tokens from (RFC 9728 `authorization_servers`): each an
	// absolute http(s) URL with RFC 8414 metadata, such as the OIDC issuer
	// of a deployment or `mandate dev` itself. Empty: the metadata names
	// none, and clients bring a token of their own.
	AuthorizationServers []string
	// ScopesSupported is advertised in the protected-resource metadata.
	ScopesSupported []string
	// IdleTimeout is how long a principal's server, and its watch of the
	// catalog, outlive the principal's last request once no session of it
	// is open (default DefaultIdleTimeout). A principal with an open session
	// keeps its server for as long as the session lives.
	IdleTimeout time.Duration
	// SessionTimeout closes a session that made no request for this long
	// (the SDK's StreamableHTTPOptions.SessionTimeout; zero keeps sessions
	// until the client ends them). A session that only listens on its GET
	// stream counts as idle, so clients should ping within the timeout.
	SessionTimeout time.Duration
	// StateKey, when set, makes the bridge also serve MCP 2026-07-28
	// (ProtocolStateless) clients, on a stateless transport, and is the
	// HMAC-SHA256 key that seals the requestState of their confirmation
	// round trips (at least MinStateKeyBytes; keep it secret and the same
	// on every replica). Without it only 2025-11-25 and 2025-06-18 are
	// served, and a 2026 client falls back to initialize.
	StateKey []byte
	// AdvertiseURL, when set (with StateKey), is where the other replicas
	// reach this one: scheme://host:port of its own HTTP listener, such as
	// a pod's address, not the balancer's. Each session id the bridge
	// issues names it, sealed with StateKey, and a request for a session of
	// another replica is forwarded to that replica, so that
	// the replicas work behind a round-robin balancer without sticky
	// sessions. Empty: session ids are random and a request for a session
	// held elsewhere is answered 404.
	AdvertiseURL string
	// Clock reads the time that seals and checks requestState expiry
	// (default time.Now).
	Clock func() time.Time
	// EdgeLimit, when set, bounds each principal's MCP requests
	// (edgelimit; docs/architecture/limits.md): past it a request is
	// answered HTTP 429 rate.limited with Retry-After. Nil: no limit.
	EdgeLimit *edgelimit.Limiter
	// MaxSessions bounds the MCP sessions one principal holds open on this
	// bridge (default DefaultMaxSessions): an initialize past it is
	// answered HTTP 429 session.too_many.
	MaxSessions int
	// MaxTasks bounds the MCP tasks (tasks.go) one principal may have
	// waiting for a human on this bridge (default DefaultMaxTasks): a
	// task-augmented tools/call past it is answered HTTP 429 task.too_many.
	MaxTasks int
	// TaskPollInterval is the pollInterval a waiting task suggests, and how
	// often it reads its challenge when the confirm client cannot stream it
	// (default DefaultTaskPollInterval).
	TaskPollInterval time.Duration
	// EdgeRecorder records the audit row of each request refused at the
	// edge (rate.limited, session.too_many, task.too_many, task.not_found),
	// bounded per principal (nil: none are recorded).
	EdgeRecorder *edgelimit.Recorder
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Metadata keys read from a tools/call's `_meta`.
const (
	// MetaConversation names the conversation the call belongs to.
	MetaConversation = "mandate.dev/conversation"
	// MetaIdempotencyKey is the caller's idempotency key.
	MetaIdempotencyKey = "mandate.dev/idempotency_key"
	// MetaApproval is the id of an approved grant (the challenge id of a
	// confirmation.required refusal).
	MetaApproval = contract.GrantMeta
)

// extraCaller is the key of auth.TokenInfo.Extra under which the
// bridge's token verifier leaves the *caller it verified.
const extraCaller = "mandate.caller"

// Version is the server version announced in initialize.
const Version = "0.1.0"

// Bridge is the MCP endpoint. It is safe for concurrent use.
type Bridge struct {
	cfg         Config
	log         *slog.Logger
	metadataURL string
	metadataPth string

	// advertise is Config.AdvertiseURL normalised; fwd forwards requests
	// for other replicas' sessions and tasks (nil: forwarding is off).
	advertise string
	fwd       *replica.Forwarder
	// sealer seals and opens the session and task ids that name their
	// replica (Config.StateKey, advertise).
	sealer *sealed.Sealer

	// callSpans are the tools/call span names by command (trace.go).
	callSpans map[string]string

	// ctx ends with Close; every watch runs under it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	servers  map[string]*entry
	closed   bool
	sweeping bool

	// opening counts the sessions being opened per principal (edge.go).
	opening opening

	// tasks are the MCP tasks of this replica's sessions (tasks.go).
	tasks *taskStore
}

// entry is one principal's server, the tool names registered on it, and
// the state of its catalog watch (watch.go).
type entry struct {
	srv    *mcp.Server
	ctx    context.Context // ends when the entry is dropped
	cancel context.CancelFunc
	// lastUsed is guarded by Bridge.mu.
	lastUsed time.Time

	mu    sync.Mutex
	tools map[string]bool
	// p and token are the principal's newest credentials, which (re)starts
	// of the watch relay; fresh is signalled when they change.
	p     identity.Principal
	token string
	fresh chan struct{}
	// live is true while a watch stream is delivering the set; gen counts
	// the sets it delivered.
	live bool
	gen  uint64
}

// New validates cfg and returns a Bridge.
func New(cfg Config) (*Bridge, error) {
	switch {
	case cfg.Catalog == nil:
		return nil, errors.New("mcpbridge: Catalog is required")
	case cfg.Executor == nil:
		return nil, errors.New("mcpbridge: Executor is required")
	case cfg.Manifest == nil:
		return nil, errors.New("mcpbridge: Manifest is required")
	case cfg.Verifier == nil:
		return nil, errors.New("mcpbridge: Verifier is required")
	}
	if len(cfg.StateKey) > 0 && len(cfg.StateKey) < MinStateKeyBytes {
		return nil, fmt.Errorf("mcpbridge: StateKey has %d bytes; at least %d are needed", len(cfg.StateKey), MinStateKeyBytes)
	}
	u, err := url.Parse(cfg.ResourceURL)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("mcpbridge: ResourceURL %q is not an absolute URL", cfg.ResourceURL)
	}
	for _, as := range cfg.AuthorizationServers {
		if !IsIssuerURL(as) {
			return nil, fmt.Errorf("mcpbridge: authorization server %q is not an issuer URL (absolute http(s), no query or fragment)", as)
		}
	}
	var advertise string
	if cfg.AdvertiseURL != "" {
		if len(cfg.StateKey) == 0 {
			return nil, errors.New("mcpbridge: AdvertiseURL needs a StateKey, which seals the owner into session ids")
		}
		if advertise, err = advertiseURL(cfg.AdvertiseURL); err != nil {
			return nil, err
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.MaxTasks <= 0 {
		cfg.MaxTasks = DefaultMaxTasks
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	// RFC 9728 §3.1: the well-known segment goes between host and path.
	pth := "/.well-known/oauth-protected-resource" + strings.TrimSuffix(u.Path, "/")
	b := &Bridge{
		cfg:         cfg,
		log:         cfg.Logger,
		metadataPth: pth,
		metadataURL: u.Scheme + "://" + u.Host + pth,
		advertise:   advertise,
		sealer:      sealed.New(cfg.StateKey, advertise),
		callSpans:   callSpanNames(cfg.Manifest),
		servers:     map[string]*entry{},
		opening:     opening{n: map[string]int{}},
		tasks:       newTaskStore(),
		ctx:         ctx,
		cancel:      cancel,
	}
	if advertise != "" {
		b.fwd = replica.New(ctx, cfg.StateKey, b.sealer, b.log)
	}
	return b, nil
}

// Handler returns the MCP endpoint, to mount at the path of ResourceURL
// (usually /mcp): bearer authentication, cross-origin protection,
// DNS-rebinding protection and the stateful Streamable HTTP transport.
// With Config.StateKey set, requests whose Mcp-Protocol-Version is
// 2026-07-28 or later go to a stateless transport over the same
// per-principal servers instead; older clients keep their sessions. With
// Config.AdvertiseURL set, a request for another replica's session is
// forwarded to it (package replica).
func (b *Bridge) Handler() http.Handler {
	var h http.Handler = mcp.NewStreamableHTTPHandler(b.server, &mcp.StreamableHTTPOptions{Logger: b.log, SessionTimeout: b.cfg.SessionTimeout})
	if len(b.cfg.StateKey) > 0 {
		stateful := h
		stateless := mcp.NewStreamableHTTPHandler(b.server, &mcp.StreamableHTTPOptions{Logger: b.log, Stateless: true})
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if statelessRequest(r) {
				stateless.ServeHTTP(w, r)
				return
			}
			stateful.ServeHTTP(w, r)
		})
	}
	// MCP tasks (tasks.go) on the body the envelope check read.
	h = b.serveTasks(h)
	h = b.checkEnvelope(h) // strict JSON (envelope.go), after authentication
	// The edge's limits (edge.go), after authentication and before the
	// body is read; a replica limits the requests it serves itself, so a
	// forwarded one is counted where its session lives.
	h = b.limitEdge(h)
	if b.fwd != nil {
		// Authenticated before it is forwarded, body untouched.
		h = b.fwd.RouteSessions(h, statelessRequest)
	}
	protected := auth.RequireBearerToken(b.verifyToken, &auth.RequireBearerTokenOptions{
		ResourceMetadataURL: b.metadataURL,
	})(h)
	checked := http.NewCrossOriginProtection().Handler(protected)
	if b.fwd == nil {
		return checked
	}
	return b.fwd.AcceptForwarded(checked, protected)
}

// MetadataPath is where MetadataHandler belongs: the RFC 9728 well-known
// path of ResourceURL, e.g. /.well-known/oauth-protected-resource/mcp.
func (b *Bridge) MetadataPath() string { return b.metadataPth }

// IsIssuerURL reports whether s can name an authorization server in the
// protected-resource metadata: an RFC 8414 issuer, i.e. an absolute http(s)
// URL without query, fragment or user info.
func IsIssuerURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != "" &&
		u.RawQuery == "" && !u.ForceQuery && u.Fragment == "" && u.User == nil && !strings.Contains(s, "#")
}

// MetadataHandler serves the RFC 9728 protected-resource metadata.
func (b *Bridge) MetadataHandler() http.Handler {
	return auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource:               b.cfg.ResourceURL,
		AuthorizationServers:   b.cfg.AuthorizationServers,
		ScopesSupported:        b.cfg.ScopesSupported,
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "Mandate",
	})
}

// now is the clock of requestState expiry.
func (b *Bridge) now() time.Time { return b.cfg.Clock() }

// verifyToken is the SDK's TokenVerifier over identity.Verifier.
func (b *Bridge) verifyToken(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	p, err := b.cfg.Verifier.Verify(ctx, token)
	if err != nil {
		code := identity.ErrorCode(err)
		if code == "" {
			code = failure.CodeAuthenticationInvalidToken
		}
		return nil, fmt.Errorf("%w: %s", auth.ErrInvalidToken, code)
	}
	c := &caller{p: p, token: token}
	c.info = auth.TokenInfo{
		Expiration: p.ExpiresAt,
		UserID:     principalKey(p), // the server cache's key too
		Extra:      map[string]any{extraCaller: c},
	}
	return &c.info, nil
}

// caller is a verified request's principal and raw token, with the
// TokenInfo that carries them through the SDK: one allocation for all
// three, on every request.
type caller struct {
	info  auth.TokenInfo
	p     identity.Principal
	token string
	// task is the `task` param of a task-augmented tools/call, which the
	// SDK drops: serveTasks reads it off the request (tasks.go).
	task *taskRequest
	// held is the task cap's reservation for that call, which the task
	// takes over when it is stored (taskStore.add).
	held *taskReservation
}

// principalKey identifies a principal for the server cache and session
// pinning.
func principalKey(p identity.Principal) string {
	return p.Issuer + "\x00" + p.Tenant + "\x00" + p.UserID + "\x00" + p.AgentID
}

// verifiedCaller reads the verified caller from a request's TokenInfo.
func verifiedCaller(ti *auth.TokenInfo) (*caller, bool) {
	if ti == nil {
		return nil, false
	}
	c, ok := ti.Extra[extraCaller].(*caller)
	return c, ok && c != nil
}

// principalOf reads the verified principal from a request's TokenInfo.
func principalOf(ti *auth.TokenInfo) (identity.Principal, string, bool) {
	c, ok := verifiedCaller(ti)
	if !ok {
		return identity.Principal{}, "", false
	}
	return c.p, c.token, true
}

// withCaller returns ctx carrying the principal and its raw token, as the
// executor and the backends it calls expect.
func withCaller(ctx context.Context, ti *auth.TokenInfo) (context.Context, identity.Principal, bool) {
	p, tok, ok := principalOf(ti)
	if !ok {
		return ctx, p, false
	}
	ctx = identity.WithPrincipal(ctx, p)
	if tok != "" {
		ctx = identity.WithRawToken(ctx, tok)
	}
	return ctx, p, true
}

// server is the SDK's getServer: the caller's server, with its tools up
// to date. It runs on every HTTP request. While the principal's catalog
// watch is live the watch keeps the tools current and the request costs
// no catalog call; otherwise the set is read here.
func (b *Bridge) server(r *http.Request) *mcp.Server {
	c, ok := verifiedCaller(auth.TokenInfoFromContext(r.Context()))
	if !ok {
		return nil
	}
	p, tok := c.p, c.token
	e := b.entry(c.info.UserID, p, tok)
	if e == nil {
		return nil // closed
	}
	live, gen := e.watchState()
	if live {
		return e.srv
	}
	ctx := identity.WithPrincipal(r.Context(), p)
	if tok != "" {
		ctx = identity.WithRawToken(ctx, tok)
	}
	ts, err := b.listTools(ctx)
	if err != nil {
		// Keep serving the last known set; the pipeline still decides every call.
		b.log.WarnContext(r.Context(), "mcpbridge: listing tools", "tenant", p.Tenant, "user", p.UserID, "error", err)
		return e.srv
	}
	e.syncRead(b, ts, gen)
	return e.srv
}

// sync makes the server's tools exactly ts. AddTool and RemoveTools
// notify the server's open sessions (tools/list_changed). e.mu is held.
func (e *entry) sync(b *Bridge, ts toolSet) {
	want := make(map[string]bool, len(ts))
	for _, t := range ts {
		name := t.GetName()
		want[name] = true
		if !e.tools[name] {
			if err := addTool(e.srv, t, b.callTool); err != nil {
				b.log.Error("mcpbridge: registering tool", "tool", name, "error", err)
				continue
			}
			e.tools[name] = true
		}
	}
	// The check tool goes with the tools it checks.
	if len(ts) > 0 && b.offersCheck() {
		want[CheckTool] = true
		if !e.tools[CheckTool] {
			e.srv.AddTool(checkTool(), b.callTool)
			e.tools[CheckTool] = true
		}
	}
	// So does the plan tool, which lists them.
	if len(ts) > 0 && b.offersPlan() {
		want[PlanTool] = true
		if !e.tools[PlanTool] {
			e.srv.AddTool(planTool(), b.callTool)
			e.tools[PlanTool] = true
		}
	}
	var gone []string
	for name := range e.tools {
		if !want[name] {
			gone = append(gone, name)
			delete(e.tools, name)
		}
	}
	if len(gone) > 0 {
		e.srv.RemoveTools(gone...)
	}
}

// addTool registers one catalog tool as its descriptor states it, schemas
// verbatim. The SDK panics on a schema it refuses; that becomes an error
// here.
func addTool(s *mcp.Server, t *mandatev1.Tool, h mcp.ToolHandler) (err error) {
	var d tooldesc.Tool
	if err := json.Unmarshal([]byte(t.GetDescriptorJson()), &d); err != nil {
		return fmt.Errorf("decoding the descriptor: %w", err)
	}
	if d.Name != t.GetName() {
		return fmt.Errorf("the descriptor names %q", d.Name)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	tool := &mcp.Tool{
		Name:        d.Name,
		Title:       d.Title,
		Description: d.Description,
		InputSchema: d.InputSchema,
		Annotations: &mcp.ToolAnnotations{
			Title:           d.Annotations.Title,
			ReadOnlyHint:    d.Annotations.ReadOnlyHint,
			DestructiveHint: &d.Annotations.DestructiveHint,
			IdempotentHint:  d.Annotations.IdempotentHint,
			OpenWorldHint:   &d.Annotations.OpenWorldHint,
		},
		Meta: mcp.Meta(d.Meta),
	}
	if s := strings.TrimSpace(string(d.OutputSchema)); s != "" && s != "null" {
		tool.OutputSchema = d.OutputSchema
	}
	s.AddTool(tool, h)
	return nil
}

// newServer builds one principal's server: resources, and the tools/call
// interception that sends every published command to the executor.
func (b *Bridge) newServer() *mcp.Server {
	// Every revision the SDK serves: clients of 2025-03-26 and 2024-11-05
	// predate elicitation, so their confirmations go to the approval URL.
	versions := []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}
	if len(b.cfg.StateKey) > 0 {
		// The stateful transport never negotiates it; the stateless one does.
		versions = append([]string{ProtocolStateless}, versions...)
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "mandate", Title: "Mandate", Version: Version}, &mcp.ServerOptions{
		Instructions: "Governed commands. Every call is authorised, validated, possibly confirmed by a human, and audited. " +
			"A refusal is a tool result with isError and a structured code; follow its remedy.",
		Logger: b.log,
		Capabilities: &mcp.ServerCapabilities{
			Tools:     &mcp.ToolCapabilities{ListChanged: true},
			Resources: &mcp.ResourceCapabilities{},
		},
		SupportedProtocolVersions: versions,
		GetSessionID:              b.sessionIDs(),
		// Lists and resources differ per principal (2026-07-28 cacheScope).
		SetCacheable: privateCache,
	})
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "tools/call" {
				if r, ok := req.(*mcp.CallToolRequest); ok {
					if c, ok := taskCaller(r); ok {
						return b.callAsTask(ctx, r, c)
					}
					if b.cfg.Confirm != nil && r.Extra != nil && modern(r) && declaresTasks(r) {
						if c, ok := verifiedCaller(r.Extra.TokenInfo); ok {
							return b.callMaybeTask(ctx, r, c)
						}
					}
					res, err := b.callTool(ctx, r)
					if err != nil || res == nil {
						return res, err
					}
					return encoded(res, modern(r)), nil
				}
			}
			if method == "initialize" || method == "tools/list" || method == "server/discover" {
				res, err := next(ctx, method, req)
				if err != nil || res == nil {
					return res, err
				}
				return b.spliceTasks(method, req, res), nil
			}
			return next(ctx, method, req)
		}
	})
	b.addResources(s)
	return s
}

// taskCaller returns the caller of a task-augmented tools/call.
func taskCaller(r *mcp.CallToolRequest) (*caller, bool) {
	if r.Extra == nil {
		return nil, false
	}
	c, ok := verifiedCaller(r.Extra.TokenInfo)
	return c, ok && c.task != nil
}
