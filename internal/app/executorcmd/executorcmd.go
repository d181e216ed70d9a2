// Package executorcmd builds the executor and runs it as a command:
// `mandate executor` and the mandate-executor binary. `mandate dev` builds
// it with the same Build. It imports no other service: the executor
// reaches audit, confirm and the backends through their generated
// clients, so that mandate-executor links only the executor.
package executorcmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/edgelimit"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/openapi"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/executor"
	execapi "github.com/mandate-dev/mandate/services/executor/api"
	execmem "github.com/mandate-dev/mandate/services/executor/memory"
	execpg "github.com/mandate-dev/mandate/services/executor/postgres"
	"github.com/mandate-dev/mandate/services/executor/restgateway"
)

// Deps are what the executor is built from.
type Deps struct {
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
	IdempotencyTTL, DefaultDeadline, Lease time.Duration
	// AuditStreamMaxAge is how long the executor keeps one append stream
	// to the audit service before it opens the next (zero: the default).
	AuditStreamMaxAge time.Duration
	// HeldFile is where audit rows held in memory at shutdown are kept
	// (executor.Config.HeldFile; "" keeps none, and says how many).
	HeldFile string
	// RelayLinger is how long the audit relay waits after a wake-up for
	// more rows (executor.Config.RelayLinger; zero: none).
	RelayLinger time.Duration
	// Events configure the relay and purger of the event outbox.
	Events EventsFlags
	// RESTServices are the other proto services whose REST routes share
	// the executor's HTTP server (`mandate dev`: catalog, audit, confirm);
	// its /openapi.json describes them too.
	RESTServices []string
	// Edge limits each principal's REST requests; their refusals are
	// audited on the executor's own authority.
	Edge   clicore.EdgeFlags
	Logger *slog.Logger
}

// openAPIDescription introduces the document served at /openapi.json.
const openAPIDescription = "The REST surface of this executor, generated at startup from the manifest it loaded (docs/rest.md). " +
	"Every command's own route (google.api.http) and `POST /v1/commands/{code}:execute` run the call through the governed " +
	"pipeline. Field names are the proto names, 64-bit integers are strings, enums are names, unset message fields are `null`; " +
	"every refusal is an RFC 9457 `application/problem+json` body naming the stage and the stable code."

// Service is the executor's API, the governed proxy, and the loops of its
// event outbox.
type Service struct {
	api    *execapi.Service
	exec   *executor.Executor
	events []func(context.Context) error
	// routes are the REST routes (google.api.http) of the manifest's
	// commands, and openAPI the document of what the server serves.
	routes  *restgateway.Routes
	openAPI []byte
	// limit and refusals are the REST edge's limiter and the recorder of
	// its refusals (nil without a limit).
	limit    *edgelimit.Limiter
	refusals *edgelimit.Recorder
}

// Build builds the executor; what it opens is closed with cl.
func Build(d Deps, cl *clicore.Closers) (*Service, error) {
	events, err := d.Events.loops(d.Store, d.Logger, cl)
	if err != nil {
		return nil, err
	}
	// The generated clients are the executor's ports.
	auditClient := mandatev1.NewAuditServiceClient(d.Audit)
	trail := executor.NewAuditStream(auditClient, d.AuditStreamMaxAge)
	cl.Add(trail.Close) // closers run last-in first-out: after the executor's
	cfg := executor.Config{
		Manifest: d.Manifest, Directory: d.Directory, Audit: trail,
		ReconcileAfter: d.ReconcileAfter, ReconcileInterval: d.ReconcileInterval,
		Confirm: mandatev1.NewConfirmServiceClient(d.Confirm), Dispatcher: executor.NewGRPCDispatcher(d.Backends),
		Store: d.Store, ConfirmSideEffects: d.ConfirmSideEffects, IdempotencyTTL: d.IdempotencyTTL,
		DefaultDeadline: d.DefaultDeadline, Lease: d.Lease, Logger: d.Logger, HeldFile: d.HeldFile,
		RelayLinger: d.RelayLinger,
	}
	if d.SettleIntents {
		cfg.Intents = auditClient
	}
	exec, err := executor.New(cfg)
	if err != nil {
		return nil, err
	}
	// Closed once the servers have stopped (Start), and here should the
	// process fail before it runs; Close is idempotent.
	cl.Add(exec.Close)
	routes, err := restgateway.New(d.Manifest)
	if err != nil {
		return nil, err
	}
	doc, err := openapi.Deployment(d.Manifest, append([]string{mandatev1.ExecutorService_ServiceDesc.ServiceName}, d.RESTServices...), openapi.Options{Description: openAPIDescription})
	if err != nil {
		return nil, err
	}
	svc := &Service{api: execapi.New(exec, d.Manifest), exec: exec, events: events, routes: routes, openAPI: doc, limit: d.Edge.Limiter()}
	if svc.limit != nil {
		if svc.refusals, err = edgelimit.NewRecorder(edgelimit.RecorderConfig{Audit: auditClient, Logger: d.Logger}); err != nil {
			return nil, err
		}
	}
	return svc, nil
}

// Edge is the limiter of the REST edge and the recorder of its refusals,
// for the server the executor's routes are served on (server.Config
// EdgeLimit, EdgeRecorder); both nil without a limit.
func (e *Service) Edge() (*edgelimit.Limiter, *edgelimit.Recorder) { return e.limit, e.refusals }

// ServerOptions are the options of the server the executor is registered
// on: the governed proxy serves the backends' services there.
func (e *Service) ServerOptions() []grpc.ServerOption { return e.api.ServerOptions() }

// Register serves the ExecutorService, the governed proxy and their REST
// routes on srv, which must be built with ServerOptions: Execute's, and
// every command's own google.api.http route, read from the manifest's
// descriptors, which reaches the command through the governed proxy like
// every other call; /openapi.json describes them.
func (e *Service) Register(srv *server.Server) {
	e.api.Register(srv)
	srv.HandleGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		if err := mandatev1.RegisterExecutorServiceHandler(ctx, mux, conn); err != nil {
			return err
		}
		return e.routes.Register(ctx, mux, conn)
	})
	srv.Handle("GET /openapi.json", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(e.openAPI)
	}))
}

// Start runs the outbox's relay and purger in p, and closes the executor
// once the servers have stopped: its last outcomes are written, and their
// events relayed, before the loops end.
func (e *Service) Start(p *clicore.Group) {
	p.Loop(e.events...)
	if e.refusals != nil {
		p.Loop(e.refusals.Run)
	}
	p.OnStopped(e.exec.Close)
}

// CheckBackends refuses a backend map that names no address for the
// service of a published command.
func CheckBackends(set *manifest.Set, backends map[string]string) error {
	for _, c := range set.Commands() {
		if _, ok := backends[c.RPC.Service]; !ok && c.Published() {
			return errors.New("--backend names no address for " + c.RPC.Service + ", which serves " + c.Code)
		}
	}
	return nil
}

// ParseBackends reads "pkg.Service=host:port,…".
func ParseBackends(list []string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range list {
		svc, addr, ok := strings.Cut(item, "=")
		if !ok || svc == "" || addr == "" {
			return nil, fmt.Errorf("%q is not service=address", item)
		}
		out[svc] = addr
	}
	return out, nil
}

// Run runs the executor: the governed pipeline and proxy in front of the
// backends.
func Run(ctx context.Context, args []string, io clicore.IO) error {
	var (
		f                      clicore.ServiceFlags
		mf                     clicore.ManifestFlags
		ef                     EventsFlags
		edge                   clicore.EdgeFlags
		backends               []string
		auditAddr, confirmAddr string
		confirmSideEffects     bool
		idemTTL, deadline      time.Duration
		lease                  time.Duration
		streamMaxAge           time.Duration
		heldFile               string
		reconcileAfter         time.Duration
		reconcileEvery         time.Duration
		relayLinger            time.Duration
	)
	s := config.New("executor", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	f.Declare(s, "127.0.0.1:9092", "127.0.0.1:8082")
	f.DeclareDialing(s)
	mf.Declare(s)
	ef.Declare(s)
	edge.Declare(s, "the REST routes")
	s.Strings(&backends, "backend", nil, "backend per proto service: examples.helpdesk.v1.HelpdeskService=127.0.0.1:9191 (a target such as dns:///helpdesk:9191 is balanced over every address the name resolves to)")
	s.String(&auditAddr, "audit-addr", "127.0.0.1:9094", "gRPC address of the audit service: host:port, or dns:///host:port, balanced round robin over every address the name resolves to")
	s.String(&confirmAddr, "confirm-addr", "127.0.0.1:9093", "gRPC address of the confirm service (host:port or dns:///host:port, balanced like --audit-addr)")
	s.Bool(&confirmSideEffects, "confirm-side-effects", false, "require confirmation for every command that declares side effects")
	s.Duration(&idemTTL, "idempotency-ttl", 24*time.Hour, "how long idempotency keys are remembered")
	s.Duration(&deadline, "default-deadline", 30*time.Second, "backend deadline for commands that declare none")
	s.Duration(&reconcileAfter, "reconcile-after", executor.DefaultReconcileAfter, "age after which an intent without outcome (its executor died) is settled from the backend's receipt; must exceed the longest call, and stay below the audit service's --reconcile-after (15m), after which it records the intent unknown (a retry with the call's idempotency key settles it at once)")
	s.Duration(&reconcileEvery, "reconcile-interval", executor.DefaultReconcileInterval, "how often intents without outcome are settled from receipts")
	s.Duration(&streamMaxAge, "audit-stream-max-age", executor.DefaultAuditStreamMaxAge, "how long the executor appends on one stream to the audit service before it opens the next, so that a balancer spreads the streams over the audit replicas")
	s.Duration(&relayLinger, "audit-relay-linger", executor.StoreRelayLinger, "over Postgres (--database-url), how long the relay of the executor's outbox of audit rows waits, once a row is spooled, for more rows before it appends them to the audit trail: longer puts more calls' rows, and each call's intent with its outcome, in one append (less work for Postgres), and delays their arrival in the trail by as much; 0 appends at once; at most 1s. A call's intent is durable before dispatch either way. In memory rows are appended at once")
	s.String(&heldFile, "held-file", "", "file where the audit rows that neither the audit trail nor the executor's store would take (both down) are written at shutdown, fsynced, and read back at the next start; one per executor, on a volume that outlives the process (empty: they are lost at shutdown, and the log says how many)")
	s.Duration(&lease, "lease", 6*time.Second, "how long an idempotency key stays claimed by a call whose executor stopped renewing it (it died) before a retry asks the backend's receipt; a live executor renews its calls' claims every third of it, however long they run")
	var backendMap map[string]string
	s.Check(func() error {
		var err error
		if backendMap, err = ParseBackends(backends); err != nil {
			return s.Errorf("backend", "%v", err)
		}
		if len(backendMap) == 0 {
			return s.Errorf("backend", "is required: name the address of every command's service")
		}
		if relayLinger < 0 || relayLinger > time.Second {
			return s.Errorf("audit-relay-linger", "%s is out of range: from 0 to 1s (a row must reach the trail within a second of its call)", relayLinger)
		}
		return nil
	})
	if err := s.Parse(args); err != nil {
		return err
	}
	log := f.Logger(io.Stderr, "executor")
	var cl clicore.Closers
	defer cl.Close()
	metrics, err := f.Tracing(ctx, io, "executor", log, &cl)
	if err != nil {
		return err
	}
	set, err := mf.Load()
	if err != nil {
		return err
	}
	if err := CheckBackends(set, backendMap); err != nil {
		return err
	}
	auth, err := f.Authenticator(ctx)
	if err != nil {
		return err
	}
	dial, err := f.ServiceDialer(executor.ServiceName, set.Digest(), &cl)
	if err != nil {
		return err
	}
	conns, err := dial.Backends(backendMap)
	if err != nil {
		return err
	}
	auditConn, err := dial.Service(auditAddr)
	if err != nil {
		return err
	}
	confirmConn, err := dial.Service(confirmAddr)
	if err != nil {
		return err
	}
	pool, err := f.Pool(ctx, &cl)
	if err != nil {
		return err
	}
	var (
		store  executor.Store
		linger time.Duration
	)
	if pool != nil {
		store, linger = execpg.New(pool, execpg.Options{}), relayLinger
	} else {
		store = execmem.New(execmem.Options{})
	}
	svc, err := Build(Deps{
		Manifest: set, Directory: f.Directory(pool, &cl), Store: store,
		Audit: auditConn, Confirm: confirmConn, Backends: conns,
		SettleIntents: true, ReconcileAfter: reconcileAfter, ReconcileInterval: reconcileEvery,
		ConfirmSideEffects: confirmSideEffects, IdempotencyTTL: idemTTL, DefaultDeadline: deadline, Lease: lease, AuditStreamMaxAge: streamMaxAge, HeldFile: heldFile,
		RelayLinger: linger, Events: ef, Edge: edge, Logger: log,
	}, &cl)
	if err != nil {
		return err
	}
	limit, refusals := svc.Edge()
	return f.Serve(ctx, server.Config{Name: "mandate.v1.ExecutorService", Auth: auth, Logger: log, Metrics: metrics, GRPCOptions: svc.ServerOptions(), ProxiedMethod: ProxiedMethod(set),
		ManifestDigest: set.Digest(), EdgeLimit: limit, EdgeRecorder: refusals},
		svc.Register, svc.Start)
}
