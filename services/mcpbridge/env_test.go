package mcpbridge_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpmem "github.com/mandate-dev/mandate/examples/helpdesk/memory"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/app/servicetest"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/server/inprocess"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/audit"
	auditapi "github.com/mandate-dev/mandate/services/audit/api"
	"github.com/mandate-dev/mandate/services/catalog"
	catalogapi "github.com/mandate-dev/mandate/services/catalog/api"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmapi "github.com/mandate-dev/mandate/services/confirm/api"
	"github.com/mandate-dev/mandate/services/executor"
	execapi "github.com/mandate-dev/mandate/services/executor/api"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

var (
	devSecret     = []byte("dev-secret-0123456789abcdef0123456789")
	serviceSecret = []byte("svc-secret-0123456789abcdef0123456789")
)

// policy is the demo directory (services/executor/api's harness).
const policy = `
tenants:
  - id: acme
    features: [refunds, expenses]
    # as the demo's: finance-bot's refunds (L3) may be confirmed in its form
    trust_ceiling: L3
    roles:
      support: [ticket.read, expense.report.submit]
      manager: [ticket.read, expense.report.approve]
      finance: [ticket.read, payment.refund]
      ops: [ops.read]
    users:
      - {id: olga, org: ops, roles: [ops]}
      - {id: alice, org: support, roles: [support]}
      - {id: bob, org: support, roles: [manager]}
      - {id: carol, org: finance, roles: [finance]}
    agents:
      - {id: support-bot, user: alice}
      - {id: finance-bot, user: carol, host: interactive}
      - {id: payout-bot, user: carol}
  - id: globex
    features: [refunds]
    roles:
      support: [ticket.read, payment.refund]
    users:
      - {id: dave, org: support, roles: [support]}
`

// env is the governed topology in process: the helpdesk backend behind its
// own authenticated gRPC server; the executor, confirm, audit and the
// catalog on fresh stores (newStores), their APIs on one authenticated
// server; and the bridge on an httptest server, calling them through that
// server's in-process channel with its service token, as mandate dev
// wires it.
type env struct {
	url     string
	set     *manifest.Set
	catalog *catalog.Catalog
	gateway *helpdesk.Gateway
	audit   audit.Store
	confirm *confirm.Service
	dir     directory.Store
	// helpdeskAddr is the helpdesk backend's own gRPC address.
	helpdeskAddr string
	// services serves ExecutorService, CatalogService and ConfirmService;
	// local is the bridge's in-process connection to it.
	services *server.Server
	local    grpc.ClientConnInterface
	users    *identity.Verifier
	authn    *identity.Authenticator
	bridge   *mcpbridge.Bridge
	// auditAPI is the audit service's API over e.audit, for a server of
	// its own (edge_test.go).
	auditAPI *auditapi.Service
}

func start(t testing.TB) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st := newStores(t)
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	dir := st.dir
	if _, err := directory.Apply(ctx, dir, []byte(policy)); err != nil {
		t.Fatal(err)
	}
	cache := directory.NewCache(dir, directory.CacheOptions{TTL: time.Hour})
	writer := audit.NewWriter(st.audit, audit.WriterOptions{Attempts: 1})
	t.Cleanup(func() {
		_ = writer.Close()
		cache.Close()
	})
	confirmSvc, err := confirm.New(confirm.Config{
		Store: st.confirm, Directory: cache, Commands: set,
		ApprovalBaseURL: "http://approve.test",
	})
	if err != nil {
		t.Fatal(err)
	}

	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{"mandate"}, Issuers: []string{"test"}, DevSecret: devSecret})
	if err != nil {
		t.Fatal(err)
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{Secret: serviceSecret, Audience: []string{"mandate"}, Issuers: []string{"test"}})
	if err != nil {
		t.Fatal(err)
	}
	authn, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services})
	if err != nil {
		t.Fatal(err)
	}

	hstore := helpmem.New()
	if err := helpdesk.Seed(ctx, hstore); err != nil {
		t.Fatal(err)
	}
	gw := helpdesk.NewGateway()
	backend, err := helpdesk.New(helpdesk.Config{Store: hstore, Gateway: gw, TrustedServices: []string{executor.ServiceName}})
	if err != nil {
		t.Fatal(err)
	}
	hsrv, err := server.New(server.Config{Name: "helpdesk", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: authn})
	if err != nil {
		t.Fatal(err)
	}
	backend.Register(hsrv)
	serve(t, ctx, hsrv)

	src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", executor.ServiceName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	backendConn, err := grpc.NewClient(hsrv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)))
	if err != nil {
		t.Fatal(err)
	}
	ports := servicetest.Executor(t, users, services, src, writer, cache, confirmSvc)
	exec, err := executor.New(executor.Config{
		Manifest: set, Directory: cache, Audit: ports.Audit, Confirm: ports.Confirm,
		Dispatcher: executor.NewGRPCDispatcher(map[string]grpc.ClientConnInterface{"examples.helpdesk.v1.HelpdeskService": backendConn}),
		Store:      st.exec,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(exec.Close)
	cat, err := catalog.New(catalog.Config{Manifest: set, Directory: dir, TrustedServices: []string{executor.ServiceName}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cat.Close)
	svc := serveServices(t, ctx, authn, set, exec, cat, confirmSvc)
	local := bridgeChannel(t, svc)

	mux := http.NewServeMux()
	srv := httptest.NewUnstartedServer(mux)
	srv.Start()
	b, err := mcpbridge.New(mcpbridge.Config{
		Catalog: mandatev1.NewCatalogServiceClient(local), Executor: mandatev1.NewExecutorServiceClient(local),
		Manifest: set, Verifier: users,
		ResourceURL: srv.URL + "/mcp", AuthorizationServers: []string{"https://issuer.test"},
	})
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/mcp", b.Handler())
	mux.Handle(b.MetadataPath(), b.MetadataHandler())
	t.Cleanup(func() {
		b.Close() // ends the sessions, so that their SSE streams do not hold up srv.Close
		srv.Close()
		_ = backendConn.Close()
		cancel()
	})
	return &env{url: srv.URL, set: set, catalog: cat, gateway: gw, audit: st.audit, confirm: confirmSvc, dir: dir, helpdeskAddr: hsrv.GRPCAddr(),
		services: svc, local: local, users: users, authn: authn, bridge: b, auditAPI: auditapi.New(writer, cache, nil)}
}

// serveServices serves the APIs of exec, cat and confirmSvc on one
// authenticated gRPC server, as mandate dev does, until ctx ends.
func serveServices(t testing.TB, ctx context.Context, authn *identity.Authenticator, set *manifest.Set, exec *executor.Executor, cat *catalog.Catalog, confirmSvc *confirm.Service) *server.Server {
	t.Helper()
	execSvc := execapi.New(exec, set)
	srv, err := server.New(server.Config{Name: "mandate", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: authn, GRPCOptions: execSvc.ServerOptions()})
	if err != nil {
		t.Fatal(err)
	}
	execSvc.Register(srv)
	catalogapi.New(cat, nil).Register(srv)
	confirmapi.New(confirmSvc, nil).Register(srv)
	serve(t, ctx, srv)
	return srv
}

// bridgeChannel is the bridge's in-process connection to srv's services,
// with its service token (which relays each caller's token).
func bridgeChannel(t testing.TB, srv *server.Server) grpc.ClientConnInterface {
	t.Helper()
	src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", identity.MCPBridgeService, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return inprocess.Conn(srv, src)
}

func serve(t testing.TB, ctx context.Context, srv *server.Server) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	for range 200 {
		resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("server never became SERVING")
}

func token(t testing.TB, tenant, user, agent string) string {
	t.Helper()
	return tokenTTL(t, tenant, user, agent, time.Hour)
}

// tokenTTL is a token that expires ttl from now.
func tokenTTL(t testing.TB, tenant, user, agent string, ttl time.Duration) string {
	t.Helper()
	model := ""
	if agent != "" {
		model = "test-model"
	}
	tok, err := identity.MintDev(devSecret, identity.MintRequest{
		Issuer: "test", Audience: "mandate", User: user, Tenant: tenant, Agent: agent, Model: model, TTL: ttl, Now: time.Now(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
