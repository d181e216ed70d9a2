package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpmem "github.com/mandate-dev/mandate/examples/helpdesk/memory"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/app/servicetest"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	dirpg "github.com/mandate-dev/mandate/internal/directory/postgres"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/audit"
	auditmem "github.com/mandate-dev/mandate/services/audit/memory"
	auditpg "github.com/mandate-dev/mandate/services/audit/postgres"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmmem "github.com/mandate-dev/mandate/services/confirm/memory"
	confirmpg "github.com/mandate-dev/mandate/services/confirm/postgres"
	"github.com/mandate-dev/mandate/services/executor"
	"github.com/mandate-dev/mandate/services/executor/api"
	execmem "github.com/mandate-dev/mandate/services/executor/memory"
	execpg "github.com/mandate-dev/mandate/services/executor/postgres"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

var (
	devSecret     = []byte("dev-secret-0123456789abcdef0123456789")
	serviceSecret = []byte("svc-secret-0123456789abcdef0123456789")
)

// policy is the demo directory plus lena, who may both submit and approve
// expense reports (separation of duties must stop her doing both on one
// report).
const policy = `
tenants:
  - id: acme
    features: [refunds, expenses]
    roles:
      support: [ticket.read, expense.report.submit]
      manager: [ticket.read, expense.report.approve]
      finance: [ticket.read, payment.refund]
      lead: [ticket.read, expense.report.submit, expense.report.approve]
    users:
      - {id: alice, org: support, roles: [support]}
      - {id: bob, org: support, roles: [manager]}
      - {id: carol, org: finance, roles: [finance]}
      - {id: lena, org: support, roles: [lead]}
    agents:
      - {id: support-bot, user: alice}
      - {id: finance-bot, user: carol}
  - id: globex
    features: [refunds]
    roles:
      support: [ticket.read, payment.refund]
    users:
      - {id: dave, org: support, roles: [support]}
`

// env is the governed topology on loopback: the helpdesk backend behind
// its own authenticated server, the executor with its proxy, and confirm
// and audit in process, all on a fresh Postgres database.
type env struct {
	exec     *server.Server
	conn     *grpc.ClientConn
	gateway  *helpdesk.Gateway
	helpdesk *helpmem.Store
	audit    audit.Store
	confirm  *confirm.Service
	// takeAuditAway makes the audit store unreachable.
	takeAuditAway func()
	// backend is the executor's own connection to the helpdesk backend
	// (service token, forwarding the caller's token from the context).
	backend *grpc.ClientConn
	writer  *audit.Writer
	// pipeline is the executor itself.
	pipeline *executor.Executor
	// dir is the directory the executor resolves principals in.
	dir directory.Store
	// execStore is the executor's own store (idempotency, executions).
	execStore executor.Store
	// backing is its stores, for a redeploy on them (startOn).
	backing backing
}

func verifiers(t testing.TB, ctx context.Context) (*identity.Verifier, *identity.ServiceVerifier) {
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

func authenticator(t testing.TB, ctx context.Context) *identity.Authenticator {
	t.Helper()
	users, services := verifiers(t, ctx)
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services})
	if err != nil {
		t.Fatal(err)
	}
	return auth
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

// stores names the stores a topology runs on.
type stores string

const (
	postgresStores stores = "postgres"
	memoryStores   stores = "memory"
)

// eachStore runs test over the Postgres stores (skipped when no server
// answers) and over the memory stores, so that the pipeline is exercised
// on a machine without Postgres too.
func eachStore(t *testing.T, test func(t *testing.T, st stores)) {
	t.Helper()
	for _, st := range []stores{postgresStores, memoryStores} {
		t.Run(string(st), func(t *testing.T) { test(t, st) })
	}
}

// backing is the stores of one topology.
type backing struct {
	dir        directory.Store
	auditStore audit.Store
	execStore  executor.Store
	confirm    confirm.Store
	// takeAuditAway makes the audit store unreachable.
	takeAuditAway func()
	// database is the Postgres database every store uses ("" in memory).
	database string
}

// postgresBacking puts every store on a fresh Postgres database; the
// audit trail has its own pool, so that a test can take it away.
func postgresBacking(t testing.TB, ctx context.Context) backing {
	t.Helper()
	pool, url := pgtest.NewURL(t, dirpg.Migrations, auditpg.Migrations, execpg.Migrations, confirmpg.Migrations)
	dir := dirpg.New(pool, dirpg.Options{})
	auditPool, err := pg.Open(ctx, url, pg.Options{})
	if err != nil {
		t.Fatal(err)
	}
	auditStore := auditpg.New(auditPool, auditpg.Options{})
	t.Cleanup(func() {
		auditStore.Close()
		auditPool.Close()
		dir.Close()
	})
	return backing{dir: dir, auditStore: auditStore, execStore: execpg.New(pool, execpg.Options{}),
		confirm: confirmpg.New(pool, confirmpg.Options{}), takeAuditAway: auditPool.Close, database: pool.Config().ConnConfig.Database}
}

// memoryBacking puts every store in memory.
func memoryBacking(t testing.TB) backing {
	t.Helper()
	auditStore := &unplugged{Store: auditmem.New(auditmem.Options{})}
	confirmStore := confirmmem.New(confirmmem.Options{})
	t.Cleanup(func() {
		auditStore.Close()
		confirmStore.Close()
	})
	return backing{dir: dirmem.New(), auditStore: auditStore, execStore: execmem.New(execmem.Options{}),
		confirm: confirmStore, takeAuditAway: func() { auditStore.down.Store(true) }}
}

// unplugged is a memory audit store that can be taken away, as closing
// its pool takes the Postgres one away: appends then fail as a store that
// cannot be reached does.
type unplugged struct {
	*auditmem.Store
	down atomic.Bool
}

func (u *unplugged) AppendBatch(ctx context.Context, recs []audit.Record) ([]audit.Stored, error) {
	if u.down.Load() {
		return nil, fmt.Errorf("%w: unplugged", audit.ErrUnavailable)
	}
	return u.Store.AppendBatch(ctx, recs)
}

// start builds the topology on the stores st; opts adjust the executor's
// configuration.
func start(t testing.TB, st stores, opts ...func(*executor.Config)) *env {
	t.Helper()
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	var b backing
	if st == postgresStores {
		b = postgresBacking(t, context.Background())
	} else {
		b = memoryBacking(t)
	}
	return startOn(t, b, set, opts...)
}

// startOn is start on the stores b with the manifest set: a second
// topology on the same stores is a redeploy of the first.
func startOn(t testing.TB, b backing, set *manifest.Set, opts ...func(*executor.Config)) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := directory.Apply(ctx, b.dir, []byte(policy)); err != nil {
		t.Fatal(err)
	}
	cache := directory.NewCache(b.dir, directory.CacheOptions{TTL: time.Hour})
	writer := audit.NewWriter(b.auditStore, audit.WriterOptions{Attempts: 1})
	// Cleanups run last-in first-out: the stores close after the servers
	// (registered below) have stopped.
	t.Cleanup(func() {
		_ = writer.Close()
		cache.Close()
	})

	confirmSvc, err := confirm.New(confirm.Config{
		Store: b.confirm, Directory: cache, Commands: set,
		ApprovalBaseURL: "http://approve.test",
	})
	if err != nil {
		t.Fatal(err)
	}

	// The helpdesk backend, reachable only through a Mandate service.
	hstore := helpmem.New()
	if err := helpdesk.Seed(ctx, hstore); err != nil {
		t.Fatal(err)
	}
	gw := helpdesk.NewGateway()
	backend, err := helpdesk.New(helpdesk.Config{Store: hstore, Gateway: gw, TrustedServices: []string{executor.ServiceName}})
	if err != nil {
		t.Fatal(err)
	}
	// Like the helpdesk's own process, it admits the executor's token
	// alone: the reconciler asks receipts with no user behind the call.
	users, services := verifiers(t, ctx)
	backendAuth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services, AllowServiceOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	hsrv, err := server.New(server.Config{Name: "helpdesk", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: backendAuth})
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
	// Audit and confirm through their APIs, on the executor's identity.
	ports := servicetest.Executor(t, users, services, src, writer, cache, confirmSvc)
	trail := executor.NewAuditStream(ports.Audit, 0)
	t.Cleanup(trail.Close) // after the executor's (below)
	cfg := executor.Config{
		Manifest: set, Directory: cache, Audit: trail, Confirm: ports.Confirm,
		Dispatcher: executor.NewGRPCDispatcher(map[string]grpc.ClientConnInterface{"examples.helpdesk.v1.HelpdeskService": backendConn}),
		Store:      b.execStore,
	}
	for _, o := range opts {
		o(&cfg)
	}
	exec, err := executor.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(exec.Close) // runs before the stores close: outcome rows land first
	svc := api.New(exec, set)
	esrv, err := server.New(server.Config{Name: "mandate.v1.ExecutorService", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Auth: authenticator(t, ctx), GRPCOptions: svc.ServerOptions()})
	if err != nil {
		t.Fatal(err)
	}
	svc.Register(esrv)
	esrv.HandleGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return mandatev1.RegisterExecutorServiceHandler(ctx, mux, conn)
	})
	serve(t, ctx, esrv)
	conn, err := grpc.NewClient(esrv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		_ = backendConn.Close()
		cancel()
	})
	return &env{exec: esrv, conn: conn, gateway: gw, helpdesk: hstore, audit: b.auditStore, takeAuditAway: b.takeAuditAway,
		confirm: confirmSvc, backend: backendConn, writer: writer, pipeline: exec, dir: b.dir, execStore: b.execStore, backing: b}
}

func token(t testing.TB, tenant, user, agent string) string {
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

func as(tok string, kv ...string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), append([]string{"authorization", "Bearer " + tok}, kv...)...)
}

// execute calls ExecutorService/Execute with a JSON input.
func (e *env) execute(t *testing.T, ctx context.Context, code, input string, opts ...func(*mandatev1.ExecuteRequest)) (*mandatev1.ExecuteResponse, error) {
	t.Helper()
	req := &mandatev1.ExecuteRequest{Code: code}
	if input != "" {
		var m map[string]any
		if err := json.Unmarshal([]byte(input), &m); err != nil {
			t.Fatal(err)
		}
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		req.Input = s
	}
	for _, o := range opts {
		o(req)
	}
	return mandatev1.NewExecutorServiceClient(e.conn).Execute(ctx, req)
}

func withKey(k string) func(*mandatev1.ExecuteRequest) {
	return func(r *mandatev1.ExecuteRequest) { r.IdempotencyKey = k }
}

func withGrant(g string) func(*mandatev1.ExecuteRequest) {
	return func(r *mandatev1.ExecuteRequest) { r.ApprovalGrantId = g }
}

// refusal reads the Mandate error of a status.
func refusal(err error) *mandatev1.CommandError {
	for _, d := range status.Convert(err).Details() {
		if ce, ok := d.(*mandatev1.CommandError); ok {
			return ce
		}
	}
	return nil
}

func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// rows returns the audit rows of an invocation once there are want of
// them: a dispatched call's rows reach the trail from the executor's
// outbox, its intent right after it was made durable and its outcome just
// after the reply.
func (e *env) rows(t *testing.T, tenant, invocation string, want int) []audit.Stored {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		rows, err := e.audit.Get(context.Background(), tenant, invocation)
		if errors.Is(err, audit.ErrNotFound) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("audit rows of %s: %v", invocation, err)
		}
		if len(rows) >= want || time.Now().After(deadline) {
			return rows
		}
		time.Sleep(10 * time.Millisecond)
	}
}
