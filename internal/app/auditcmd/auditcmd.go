// Package auditcmd builds the audit service and runs it as a command:
// `mandate audit` and the mandate-audit binary. `mandate dev` builds it
// with the same Build, so that the two wirings cannot drift apart. It
// imports no other service, so that mandate-audit links only the audit
// trail.
package auditcmd

import (
	"context"
	"log/slog"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/audit"
	auditapi "github.com/mandate-dev/mandate/services/audit/api"
	auditmem "github.com/mandate-dev/mandate/services/audit/memory"
	auditpg "github.com/mandate-dev/mandate/services/audit/postgres"
)

// Deps are what the audit service is built from.
type Deps struct {
	Store     audit.Store
	Directory directory.Resolver
	// ReconcileInterval and ReconcileAfter set how often and after how
	// long intents without outcome are recorded as unknown (zero: the
	// reconciler's defaults).
	ReconcileInterval, ReconcileAfter time.Duration
	Logger                            *slog.Logger
}

// Service is the audit trail's API and its reconciler of intents without
// outcome.
type Service struct {
	api        *auditapi.Service
	reconciler *audit.Reconciler
}

// Build builds the audit service on d.Store; the writer it opens is closed
// with cl.
func Build(d Deps, cl *clicore.Closers) *Service {
	w := audit.NewWriter(d.Store, audit.WriterOptions{Logger: d.Logger})
	cl.Add(func() { _ = w.Close() })
	return &Service{
		api: auditapi.New(w, d.Directory, d.Logger),
		reconciler: audit.NewReconciler(w, audit.ReconcilerOptions{
			Interval: d.ReconcileInterval, OlderThan: d.ReconcileAfter, Logger: d.Logger,
		}),
	}
}

// Register serves the AuditService and its REST routes on srv.
func (a *Service) Register(srv *server.Server) {
	a.RegisterAPI(srv)
	srv.HandleGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return mandatev1.RegisterAuditServiceHandler(ctx, mux, conn)
	})
}

// RegisterAPI serves the AuditService alone on srv, without REST routes:
// `mandate dev` serves it to the executor on an internal server.
func (a *Service) RegisterAPI(srv *server.Server) { a.api.Register(srv) }

// Start runs the reconciler in p.
func (a *Service) Start(p *clicore.Group) { p.Loop(a.reconciler.Run) }

// Run runs the audit service: `mandate audit` without a tool's name.
func Run(ctx context.Context, args []string, io clicore.IO) error {
	var (
		f          clicore.ServiceFlags
		reconcile  time.Duration
		intentsAge time.Duration
		retain     int
	)
	s := config.New("audit", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	f.Declare(s, "127.0.0.1:9094", "127.0.0.1:8084")
	s.Duration(&reconcile, "reconcile-interval", audit.DefaultReconcileInterval, "how often intents without an outcome are looked for")
	s.Duration(&intentsAge, "reconcile-after", audit.DefaultReconcileAfter, "age after which an intent without an outcome is recorded as unknown; keep it above the executor's --reconcile-after plus its --reconcile-interval, so that the executors settle intents from the backends' receipts first (the variable MANDATE_RECONCILE_AFTER sets both services' flags: set the flag instead where they share an environment)")
	s.Int(&retain, "audit-retain", auditmem.DefaultMaxRows, "with --store memory: rows kept per tenant; older ones are evicted (0 keeps every row)")
	s.Check(func() error { return CheckRetain(s, retain) })
	if err := s.Parse(args); err != nil {
		return err
	}
	log := f.Logger(io.Stderr, "audit")
	var cl clicore.Closers
	defer cl.Close()
	metrics, err := f.Tracing(ctx, io, "audit", log, &cl)
	if err != nil {
		return err
	}

	// The executor appends the rows it spooled during an outage on its own
	// authority (services/audit/api Append).
	auth, err := f.ServiceOnlyAuthenticator(ctx)
	if err != nil {
		return err
	}
	pool, err := f.Pool(ctx, &cl)
	if err != nil {
		return err
	}
	var store audit.Store
	if pool != nil {
		ps := auditpg.New(pool, auditpg.Options{Logger: log})
		cl.Add(ps.Close)
		store = ps
	} else {
		ms := auditmem.New(auditmem.Options{MaxRows: retain})
		cl.Add(ms.Close)
		store = ms
	}
	svc := Build(Deps{Store: store, Directory: f.Directory(pool, &cl),
		ReconcileInterval: reconcile, ReconcileAfter: intentsAge, Logger: log}, &cl)
	return f.Serve(ctx, server.Config{Name: "mandate.v1.AuditService", Auth: auth, Logger: log, Metrics: metrics}, svc.Register,
		func(p *clicore.Group) {
			svc.Start(p)
			// The executor's append stream would hold the graceful stop: end
			// it as soon as stopping begins (the executor opens a new one).
			p.OnStopping(svc.api.Drain)
		})
}

// CheckRetain refuses a negative --audit-retain.
func CheckRetain(s *config.Set, retain int) error {
	if retain < 0 {
		return s.Errorf("audit-retain", "must be 0 (keep every row) or more")
	}
	return nil
}
