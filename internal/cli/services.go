package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/audit"
	auditapi "github.com/mandate-dev/mandate/services/audit/api"
	"github.com/mandate-dev/mandate/services/catalog"
	catalogapi "github.com/mandate-dev/mandate/services/catalog/api"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmapi "github.com/mandate-dev/mandate/services/confirm/api"
	"github.com/mandate-dev/mandate/services/confirm/page"
	"github.com/mandate-dev/mandate/services/executor"
	execapi "github.com/mandate-dev/mandate/services/executor/api"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// One function per service builds it from its dependencies, for its own
// command (`mandate audit`, …) and for `mandate dev` alike, so that the
// two wirings cannot drift apart. A service reaches the others through
// connections (grpc.ClientConnInterface) carrying its service credentials:
// gRPC connections when each service runs on its own, the in-process
// channels of the servers (server.Server.InProcess) in `mandate dev`.
// Each built service registers its APIs and routes on a server (register)
// and adds what runs beside them to the process (start).

// auditDeps are what the audit service is built from.
type auditDeps struct {
	Store     audit.Store
	Directory directory.Resolver
	// ReconcileInterval and ReconcileAfter set how often and after how
	// long intents without outcome are recorded as unknown (zero: the
	// reconciler's defaults).
	ReconcileInterval, ReconcileAfter time.Duration
	Logger                            *slog.Logger
}

// auditService is the audit trail's API and its reconciler of intents
// without outcome.
type auditService struct {
	api        *auditapi.Service
	reconciler *audit.Reconciler
}

// buildAudit builds the audit service on d.Store; the writer it opens is
// closed with cl.
func buildAudit(d auditDeps, cl *closers) *auditService {
	w := audit.NewWriter(d.Store, audit.WriterOptions{Logger: d.Logger})
	cl.add(func() { _ = w.Close() })
	return &auditService{
		api: auditapi.New(w, d.Directory, d.Logger),
		reconciler: audit.NewReconciler(w, audit.ReconcilerOptions{
			Interval: d.ReconcileInterval, OlderThan: d.ReconcileAfter, Logger: d.Logger,
		}),
	}
}

// register serves the AuditService and its REST routes on srv.
func (a *auditService) register(srv *server.Server) {
	a.api.Register(srv)
	srv.HandleGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return mandatev1.RegisterAuditServiceHandler(ctx, mux, conn)
	})
}

// start runs the reconciler in p.
func (a *auditService) start(p *processGroup) { p.loop(a.reconciler.Run) }

// confirmDeps are what the confirm service is built from.
type confirmDeps struct {
	Store     confirm.Store
	Sessions  confirm.SessionStore
	Directory directory.Resolver
	Manifest  *manifest.Set
	// BaseURL is the public origin of the approval pages.
	BaseURL string
	// LoginSecret signs the one-time sign-in links of the approval pages,
	// issued by one of Issuers.
	LoginSecret []byte
	Issuers     []string
	Logger      *slog.Logger
}

// confirmService is the confirm service's API and its approval pages.
type confirmService struct {
	api   *confirmapi.Service
	pages http.Handler
}

func buildConfirm(d confirmDeps) (*confirmService, error) {
	svc, err := confirm.New(confirm.Config{Store: d.Store, Directory: d.Directory, Commands: d.Manifest, ApprovalBaseURL: d.BaseURL, Logger: d.Logger})
	if err != nil {
		return nil, err
	}
	pages, err := page.New(page.Config{
		Confirm: svc, Sessions: d.Sessions, Directory: d.Directory, LoginSecret: d.LoginSecret,
		Issuers: d.Issuers, BaseURL: d.BaseURL, Logger: d.Logger,
	})
	if err != nil {
		return nil, err
	}
	return &confirmService{api: confirmapi.New(svc, d.Logger), pages: pages}, nil
}

// register serves the ConfirmService, its REST routes and the approval
// pages on srv.
func (c *confirmService) register(srv *server.Server) {
	c.api.Register(srv)
	srv.HandleGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return mandatev1.RegisterConfirmServiceHandler(ctx, mux, conn)
	})
	srv.Handle(page.Pattern, c.pages)
}

// catalogDeps are what the catalog is built from.
type catalogDeps struct {
	Manifest *manifest.Set
	// Directory is watched for the changes of principals' tool lists.
	Directory          directory.Store
	ConfirmSideEffects bool
	Logger             *slog.Logger
}

// catalogService is the catalog's API: tool lists, manifest reads, change
// streams, and the ops.review command the executor relays.
type catalogService struct{ api *catalogapi.Service }

// buildCatalog builds the catalog; it is closed with cl.
func buildCatalog(d catalogDeps, cl *closers) (*catalogService, error) {
	cat, err := catalog.New(catalog.Config{Manifest: d.Manifest, Directory: d.Directory, ConfirmSideEffects: d.ConfirmSideEffects,
		TrustedServices: []string{executor.ServiceName}, Logger: d.Logger})
	if err != nil {
		return nil, err
	}
	cl.add(cat.Close)
	return &catalogService{api: catalogapi.New(cat, d.Logger)}, nil
}

// register serves the CatalogService and its REST routes on srv.
func (c *catalogService) register(srv *server.Server) {
	c.api.Register(srv)
	srv.HandleGateway(catalogapi.Gateway)
}

// helpdeskDeps are what the sample backend is built from.
type helpdeskDeps struct {
	Store helpdesk.Store
	// Seed creates the demo tickets and expense reports if missing.
	Seed   bool
	Logger *slog.Logger
}

// helpdeskService is the sample backend: its HelpdeskService and
// ReceiptService, which serve only calls relayed by the executor, and its
// fake payment gateway.
type helpdeskService struct {
	backend *helpdesk.Backend
	gateway *helpdesk.Gateway
}

func buildHelpdesk(ctx context.Context, d helpdeskDeps) (*helpdeskService, error) {
	if d.Seed {
		if err := helpdesk.Seed(ctx, d.Store); err != nil {
			return nil, err
		}
	}
	gateway := helpdesk.NewGateway()
	backend, err := helpdesk.New(helpdesk.Config{Store: d.Store, Gateway: gateway,
		TrustedServices: []string{executor.ServiceName}, Logger: d.Logger})
	if err != nil {
		return nil, err
	}
	return &helpdeskService{backend: backend, gateway: gateway}, nil
}

// register serves the backend on srv, with the fake gateway's counters
// (read-only, for end-to-end tests).
func (h *helpdeskService) register(srv *server.Server) {
	h.backend.Register(srv) // HelpdeskService and its ReceiptService (pkg/receipt)
	srv.Handle("GET /gateway/counters", h.gateway.CountersHandler())
}

// executorDeps are what the executor is built from.
type executorDeps struct {
	Manifest  *manifest.Set
	Directory directory.Resolver
	Store     executor.Store
	// Audit, Confirm and Backends (by proto service name) reach the other
	// services; their connections carry the executor's service
	// credentials, which forward the caller.
	Audit, Confirm grpc.ClientConnInterface
	Backends       map[string]grpc.ClientConnInterface
	// SettleIntents has the executor settle the intents its predecessor
	// left without outcome (it died mid-call) from the backends' receipts,
	// every ReconcileInterval once older than ReconcileAfter. Where the
	// executor shares its process with the audit trail, nothing outlives
	// it to settle.
	SettleIntents                     bool
	ReconcileAfter, ReconcileInterval time.Duration
	ConfirmSideEffects                bool
	// Zero values take the executor's defaults.
	IdempotencyTTL, DefaultDeadline, LeaseMargin time.Duration
	// AuditStreamMaxAge is how long the executor keeps one append stream
	// to the audit service before it opens the next (zero: the default).
	AuditStreamMaxAge time.Duration
	// Events configure the relay and purger of the event outbox.
	Events eventsFlags
	Logger *slog.Logger
}

// executorService is the executor's API, the governed proxy, and the loops
// of its event outbox.
type executorService struct {
	api    *execapi.Service
	exec   *executor.Executor
	events []func(context.Context) error
}

// buildExecutor builds the executor; what it opens is closed with cl.
func buildExecutor(d executorDeps, cl *closers) (*executorService, error) {
	events, err := d.Events.loops(d.Store, d.Logger, cl)
	if err != nil {
		return nil, err
	}
	// The generated clients are the executor's ports.
	auditClient := mandatev1.NewAuditServiceClient(d.Audit)
	trail := executor.NewAuditStream(auditClient, d.AuditStreamMaxAge)
	cl.add(trail.Close) // closers run last-in first-out: after the executor's
	cfg := executor.Config{
		Manifest: d.Manifest, Directory: d.Directory, Audit: trail,
		ReconcileAfter: d.ReconcileAfter, ReconcileInterval: d.ReconcileInterval,
		Confirm: mandatev1.NewConfirmServiceClient(d.Confirm), Dispatcher: executor.NewGRPCDispatcher(d.Backends),
		Store: d.Store, ConfirmSideEffects: d.ConfirmSideEffects, IdempotencyTTL: d.IdempotencyTTL,
		DefaultDeadline: d.DefaultDeadline, LeaseMargin: d.LeaseMargin, Logger: d.Logger,
	}
	if d.SettleIntents {
		cfg.Intents = auditClient
	}
	exec, err := executor.New(cfg)
	if err != nil {
		return nil, err
	}
	// Closed once the servers have stopped (start), and here should the
	// process fail before it runs; Close is idempotent.
	cl.add(exec.Close)
	return &executorService{api: execapi.New(exec, d.Manifest), exec: exec, events: events}, nil
}

// serverOptions are the options of the server the executor is registered
// on: the governed proxy serves the backends' services there.
func (e *executorService) serverOptions() []grpc.ServerOption { return e.api.ServerOptions() }

// register serves the ExecutorService, the governed proxy and their REST
// routes on srv, which must be built with serverOptions.
func (e *executorService) register(srv *server.Server) {
	e.api.Register(srv)
	srv.HandleGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		if err := mandatev1.RegisterExecutorServiceHandler(ctx, mux, conn); err != nil {
			return err
		}
		// The sample's own REST routes (google.api.http) go through the
		// governed proxy like every other call.
		return helpdeskv1.RegisterHelpdeskServiceHandler(ctx, mux, conn)
	})
}

// start runs the outbox's relay and purger in p, and closes the executor
// once the servers have stopped: its last outcomes are written, and their
// events relayed, before the loops end.
func (e *executorService) start(p *processGroup) {
	p.loop(e.events...)
	p.onStopped(e.exec.Close)
}

// bridgeDeps are what the MCP bridge is built from.
type bridgeDeps struct {
	// Catalog, Executor and Confirm reach those services with the bridge's
	// service credentials, which relay the caller's. Confirm nil: every
	// confirmation goes through the approval URL.
	Catalog, Executor, Confirm grpc.ClientConnInterface
	Manifest                   *manifest.Set
	Verifier                   *identity.Verifier
	// ResourceURL is the public URL of the MCP endpoint; the bridge serves
	// at its path.
	ResourceURL          string
	AuthorizationServers []string
	AdvertiseURL         string
	IdleTimeout          time.Duration
	SessionTimeout       time.Duration
	StateKey             []byte
	Logger               *slog.Logger
}

// bridgeService is the MCP bridge and the path it serves at.
type bridgeService struct {
	bridge *mcpbridge.Bridge
	path   string
}

// buildBridge builds the bridge; it is closed with cl.
func buildBridge(d bridgeDeps, cl *closers) (*bridgeService, error) {
	u, err := url.Parse(d.ResourceURL)
	if err != nil {
		return nil, fmt.Errorf("resource URL: %w", err)
	}
	path := u.Path
	if path == "" {
		path = "/"
	}
	cfg := mcpbridge.Config{
		Catalog:  mandatev1.NewCatalogServiceClient(d.Catalog),
		Executor: mandatev1.NewExecutorServiceClient(d.Executor),
		Manifest: d.Manifest, Verifier: d.Verifier,
		ResourceURL: d.ResourceURL, AuthorizationServers: d.AuthorizationServers,
		IdleTimeout: d.IdleTimeout, SessionTimeout: d.SessionTimeout, Logger: d.Logger,
		StateKey: d.StateKey, AdvertiseURL: d.AdvertiseURL,
	}
	if d.Confirm != nil {
		cfg.Confirm = mandatev1.NewConfirmServiceClient(d.Confirm)
	}
	bridge, err := mcpbridge.New(cfg)
	if err != nil {
		return nil, err
	}
	cl.add(bridge.Close)
	return &bridgeService{bridge: bridge, path: path}, nil
}

// register serves MCP and the protected-resource metadata on srv.
func (b *bridgeService) register(srv *server.Server) {
	srv.Handle(b.path, b.bridge.Handler())
	srv.Handle(b.bridge.MetadataPath(), b.bridge.MetadataHandler())
}

// start ends the open sessions' SSE streams as soon as p begins to stop:
// they would hold the HTTP shutdown until its timeout.
func (b *bridgeService) start(p *processGroup) { p.onStopping(b.bridge.Close) }
