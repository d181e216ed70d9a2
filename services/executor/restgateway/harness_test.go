package restgateway_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpmem "github.com/mandate-dev/mandate/examples/helpdesk/memory"
	"github.com/mandate-dev/mandate/internal/app/servicetest"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/audit"
	auditmem "github.com/mandate-dev/mandate/services/audit/memory"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmmem "github.com/mandate-dev/mandate/services/confirm/memory"
	"github.com/mandate-dev/mandate/services/executor"
	"github.com/mandate-dev/mandate/services/executor/api"
	execmem "github.com/mandate-dev/mandate/services/executor/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	devSecret     = []byte("dev-secret-0123456789abcdef0123456789")
	serviceSecret = []byte("svc-secret-0123456789abcdef0123456789")
)

const policy = `
tenants:
  - id: acme
    features: [refunds, expenses]
    roles:
      support: [ticket.read, expense.report.submit]
      manager: [ticket.read, expense.report.approve]
      finance: [ticket.read, payment.refund]
    users:
      - {id: alice, org: support, roles: [support]}
      - {id: bob, org: support, roles: [manager]}
      - {id: carol, org: finance, roles: [finance]}
    agents:
      - {id: support-bot, user: alice}
      - {id: finance-bot, user: carol}
`

// stack is the governed topology on loopback, memory stores: the helpdesk
// backend behind its own server, the executor with its proxy and the REST
// routes gateway registers, audit and confirm in process.
type stack struct {
	base    string
	audit   audit.Store
	confirm *confirm.Service
	gateway *helpdesk.Gateway
}

func authenticator(t *testing.T, ctx context.Context) *identity.Authenticator {
	t.Helper()
	users, services := verifiers(t, ctx)
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services})
	if err != nil {
		t.Fatal(err)
	}
	return auth
}

func verifiers(t *testing.T, ctx context.Context) (*identity.Verifier, *identity.ServiceVerifier) {
	t.Helper()
	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{"mandate"}, Issuers: []string{"test"}, DevSecret: devSecret})
	if err != nil {
		t.Fatal(err)
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{Secret: serviceSecret, Audience: []string{"mandate"}, Issuers: []string{"test"}})
	if err != nil {
		t.Fatal(err)
	}
	return users, services
}

func serve(t *testing.T, ctx context.Context, srv *server.Server) {
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

// newStack builds a topology whose executor serves the REST routes gw
// registers (besides nothing else: Execute's route is left out, both
// stacks compare command routes).
func newStack(t *testing.T, set *manifest.Set, gw server.GatewayRegistrar) *stack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dir := dirmem.New()
	if _, err := directory.Apply(ctx, dir, []byte(policy)); err != nil {
		t.Fatal(err)
	}
	auditStore := auditmem.New(auditmem.Options{})
	confirmStore := confirmmem.New(confirmmem.Options{})
	cache := directory.NewCache(dir, directory.CacheOptions{TTL: time.Hour})
	writer := audit.NewWriter(auditStore, audit.WriterOptions{Attempts: 1})
	t.Cleanup(func() {
		_ = writer.Close()
		cache.Close()
		auditStore.Close()
		confirmStore.Close()
	})
	confirmSvc, err := confirm.New(confirm.Config{Store: confirmStore, Directory: cache, Commands: set, ApprovalBaseURL: "http://approve.test"})
	if err != nil {
		t.Fatal(err)
	}
	hstore := helpmem.New()
	if err := helpdesk.Seed(ctx, hstore); err != nil {
		t.Fatal(err)
	}
	payments := helpdesk.NewGateway()
	backend, err := helpdesk.New(helpdesk.Config{Store: hstore, Gateway: payments, TrustedServices: []string{executor.ServiceName}})
	if err != nil {
		t.Fatal(err)
	}
	hsrv, err := server.New(server.Config{Name: "helpdesk", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: authenticator(t, ctx)})
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
	users, services := verifiers(t, ctx)
	ports := servicetest.Executor(t, users, services, src, writer, cache, confirmSvc)
	trail := executor.NewAuditStream(ports.Audit, 0)
	t.Cleanup(trail.Close)
	exec, err := executor.New(executor.Config{
		Manifest: set, Directory: cache, Audit: trail, Confirm: ports.Confirm,
		Dispatcher: executor.NewGRPCDispatcher(map[string]grpc.ClientConnInterface{"examples.helpdesk.v1.HelpdeskService": backendConn}),
		Store:      execmem.New(execmem.Options{}),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(exec.Close)
	svc := api.New(exec, set)
	esrv, err := server.New(server.Config{Name: "mandate.v1.ExecutorService", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Auth: authenticator(t, ctx), GRPCOptions: svc.ServerOptions()})
	if err != nil {
		t.Fatal(err)
	}
	svc.Register(esrv)
	esrv.HandleGateway(gw)
	serve(t, ctx, esrv)
	t.Cleanup(func() {
		_ = backendConn.Close()
		cancel()
	})
	return &stack{base: "http://" + esrv.HTTPAddr(), audit: auditStore, confirm: confirmSvc, gateway: payments}
}

func token(t *testing.T, tenant, user, agent string) string {
	t.Helper()
	model := ""
	if agent != "" {
		model = "test-model"
	}
	tok, err := identity.MintDev(devSecret, identity.MintRequest{
		Issuer: "test", Audience: "mandate", User: user, Tenant: tenant, Agent: agent, Model: model, TTL: time.Hour, Now: time.Now(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// settled returns the tenant's audit rows, oldest first, once every
// intent has its outcome and no row came for a while: an outcome (and a
// replay's only row) is written just after the reply.
func (s *stack) settled(t *testing.T, tenant string) []audit.Stored {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	last := -1
	for {
		var rows []audit.Stored
		f := audit.Filter{Tenant: tenant, PageSize: audit.MaxPageSize}
		for {
			page, err := s.audit.Query(context.Background(), f)
			if err != nil {
				t.Fatal(err)
			}
			rows = append(rows, page.Records...)
			if page.NextPageToken == "" {
				break
			}
			f.PageToken = page.NextPageToken
		}
		slices.SortFunc(rows, func(a, b audit.Stored) int { return int(a.Seq - b.Seq) })
		open := map[string]bool{}
		for _, r := range rows {
			switch r.Phase {
			case audit.PhaseIntent:
				open[r.InvocationID] = true
			case audit.PhaseOutcome:
				delete(open, r.InvocationID)
			}
		}
		if (len(open) == 0 && len(rows) == last) || time.Now().After(deadline) {
			return rows
		}
		last = len(rows)
		time.Sleep(25 * time.Millisecond)
	}
}
