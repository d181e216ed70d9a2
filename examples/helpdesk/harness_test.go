package helpdesk_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	"github.com/mandate-dev/mandate/examples/helpdesk/memory"
	"github.com/mandate-dev/mandate/examples/helpdesk/postgres"
	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/pkg/backend"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

const (
	issuer   = "https://id.mandate.test"
	audience = "mandate"
)

var (
	devSecret     = []byte("helpdesk-dev-secret-0123456789abcdef")
	serviceSecret = []byte("helpdesk-svc-secret-0123456789abcdef")
	quiet         = slog.New(slog.DiscardHandler)
)

// storeKinds are the stores every backend test runs against. open prepares a store kind for
// one test and returns a constructor of empty stores; Postgres tests skip when no server
// answers (see internal/storage/pgtest).
var storeKinds = []struct {
	name string
	open func(t *testing.T) func(t *testing.T) helpdesk.Store
}{
	{"memory", func(*testing.T) func(*testing.T) helpdesk.Store {
		return func(*testing.T) helpdesk.Store { return memory.New() }
	}},
	{"postgres", func(t *testing.T) func(*testing.T) helpdesk.Store {
		// One database per test, emptied for each case: creating a database per case costs
		// far more than the cases themselves.
		pool := pgtest.New(t, postgres.Migrations)
		return func(t *testing.T) helpdesk.Store {
			if _, err := pool.Exec(testCtx(t), `DELETE FROM helpdesk.refunds; DELETE FROM helpdesk.tickets;
				DELETE FROM helpdesk.expense_reports; DELETE FROM helpdesk.sequences; DELETE FROM helpdesk.idempotency_keys;
				DELETE FROM helpdesk.erasures; DELETE FROM helpdesk.receipts`); err != nil {
				t.Fatal(err)
			}
			return postgres.New(pool)
		}
	}},
}

func memoryStore(t *testing.T) helpdesk.Store { return storeKinds[0].open(t)(t) }

// env is a seeded backend on a real loopback gRPC server with a real Authenticator.
type env struct {
	store helpdesk.Store
	gw    *helpdesk.Gateway
	// exec calls as the executor would: its own service token plus the end user's token in
	// x-mandate-on-behalf-of (set the user with as).
	exec     helpdeskv1.HelpdeskServiceClient
	execConn *grpc.ClientConn
	// direct calls with whatever bearer token the context carries (set it with bearer).
	direct helpdeskv1.HelpdeskServiceClient
	// service builds a client that relays as another Mandate service.
	service func(name string) helpdeskv1.HelpdeskServiceClient
	// receipts asks for receipts as the executor: its service token, and the user's token too
	// when the context carries one.
	receipts mandatev1.ReceiptServiceClient
	// directReceipts asks with whatever bearer token the context carries.
	directReceipts mandatev1.ReceiptServiceClient
	// serviceReceipts asks as another Mandate service.
	serviceReceipts func(name string) mandatev1.ReceiptServiceClient
}

type option func(*helpdesk.Config)

func trusting(services ...string) option {
	return func(c *helpdesk.Config) { c.TrustedServices = services }
}

// start runs a backend over a fresh, seeded store of the given kind.
func start(t *testing.T, newStore func(t *testing.T) helpdesk.Store, opts ...option) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	store := newStore(t)
	if err := helpdesk.Seed(ctx, store); err != nil {
		cancel()
		t.Fatal(err)
	}
	gw := helpdesk.NewGateway()
	cfg := helpdesk.Config{Store: store, Gateway: gw, Logger: quiet}
	for _, o := range opts {
		o(&cfg)
	}
	backend, err := helpdesk.New(cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{audience}, Issuers: []string{issuer}, DevSecret: devSecret})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{Secret: serviceSecret, Audience: []string{audience}, Issuers: []string{issuer}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	// AllowServiceOnly: the executor asks for receipts with its service token alone, since no
	// user is behind a reconciliation; commands still need the user it relays.
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services, AllowServiceOnly: true})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Name: "examples.helpdesk.v1.HelpdeskService", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth, Logger: quiet})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	backend.Register(srv)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()

	var conns []*grpc.ClientConn
	dial := func(opts ...grpc.DialOption) *grpc.ClientConn {
		conn, err := grpc.NewClient(srv.GRPCAddr(), append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
		return conn
	}
	relay := func(name string) *grpc.ClientConn {
		src, err := identity.NewServiceTokenSource(serviceSecret, issuer, audience, name, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return dial(grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)))
	}
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	e := &env{store: store, gw: gw}
	e.execConn = relay("executor")
	e.exec = helpdeskv1.NewHelpdeskServiceClient(e.execConn)
	plain := dial()
	e.direct = helpdeskv1.NewHelpdeskServiceClient(plain)
	e.service = func(name string) helpdeskv1.HelpdeskServiceClient {
		return helpdeskv1.NewHelpdeskServiceClient(relay(name))
	}
	e.receipts = mandatev1.NewReceiptServiceClient(e.execConn)
	e.directReceipts = mandatev1.NewReceiptServiceClient(plain)
	e.serviceReceipts = func(name string) mandatev1.ReceiptServiceClient {
		return mandatev1.NewReceiptServiceClient(relay(name))
	}
	waitServing(t, plain)
	return e
}

func waitServing(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	for range 200 {
		resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("server never became SERVING")
}

// forEachStore runs fn once per store kind. The cases fn runs must not be parallel: with
// Postgres they share one database.
func forEachStore(t *testing.T, fn func(t *testing.T, newStore func(t *testing.T) helpdesk.Store)) {
	t.Helper()
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) { fn(t, k.open(t)) })
	}
}

// principal names a caller: a seed user, optionally through an agent.
type principal struct {
	user  string
	agent string
}

func user(id string) principal           { return principal{user: id} }
func agent(id, forUser string) principal { return principal{user: forUser, agent: id} }
func (p principal) String() string {
	if p.agent != "" {
		return p.agent + " for " + p.user
	}
	return p.user
}

// token mints the caller's token from the seed users' tenant and org.
func token(t *testing.T, p principal) string {
	t.Helper()
	for _, u := range helpdesk.SeedUsers {
		if u.ID != p.user {
			continue
		}
		req := identity.MintRequest{Issuer: issuer, Audience: audience, User: u.ID, Tenant: u.Tenant, Org: u.Org}
		if p.agent != "" {
			req.Agent, req.Model, req.ModelVersion = p.agent, "claude", "test"
		}
		tok, err := identity.MintDev(devSecret, req)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	t.Fatalf("no seed user %q", p.user)
	return ""
}

var invocations atomic.Int64

// call carries what the executor adds to a call.
type call struct {
	invocationID   string
	idempotencyKey string
}

// as returns a context for e.exec acting for p, with a fresh invocation id and, optionally,
// an idempotency key.
func as(t *testing.T, p principal, key ...string) context.Context {
	t.Helper()
	c := call{invocationID: fmt.Sprintf("inv-%d", invocations.Add(1))}
	if len(key) > 0 {
		c.idempotencyKey = key[0]
	}
	return withCall(t, identity.WithRawToken(testCtx(t), token(t, p)), c)
}

// redeliver returns a context for e.exec acting for p with the given invocation id, as the
// executor sends it again when it retries a delivery.
func redeliver(t *testing.T, p principal, invocationID string) context.Context {
	t.Helper()
	return withCall(t, identity.WithRawToken(testCtx(t), token(t, p)), call{invocationID: invocationID})
}

func withCall(_ *testing.T, ctx context.Context, c call) context.Context {
	kv := []string{receipt.InvocationIDHeader, c.invocationID}
	if c.idempotencyKey != "" {
		kv = append(kv, receipt.IdempotencyKeyHeader, c.idempotencyKey)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// bearer returns a context for e.direct carrying tok as the bearer token.
func bearer(t *testing.T, tok string) context.Context {
	t.Helper()
	return metadata.AppendToOutgoingContext(testCtx(t), "authorization", "Bearer "+tok)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// refusal is what a refused call is expected to carry.
type refusal struct {
	code  codes.Code
	stage string
	err   string
}

// checkRefusal asserts err is a gRPC status with the gRPC code, and a google.rpc.ErrorInfo and
// a mandate.v1.CommandError that both name the stage and code; it returns the CommandError.
func checkRefusal(t *testing.T, err error, want refusal) *mandatev1.CommandError {
	t.Helper()
	if err == nil {
		t.Fatalf("call succeeded, want %s/%s", want.stage, want.err)
	}
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("err = %v, not a gRPC status", err)
	}
	if st.Code() != want.code {
		t.Errorf("gRPC code = %v, want %v (%v)", st.Code(), want.code, err)
	}
	var info *errdetails.ErrorInfo
	var ce *mandatev1.CommandError
	for _, d := range st.Details() {
		switch x := d.(type) {
		case *errdetails.ErrorInfo:
			info = x
		case *mandatev1.CommandError:
			ce = x
		}
	}
	if info == nil || ce == nil {
		t.Fatalf("status %v lacks ErrorInfo or CommandError details: %v", st.Code(), st.Details())
	}
	if info.GetReason() != want.err || info.GetDomain() != backend.ErrorDomain {
		t.Errorf("ErrorInfo = %s/%s, want %s/%s", info.GetDomain(), info.GetReason(), backend.ErrorDomain, want.err)
	}
	if ce.GetCode() != want.err || ce.GetStage() != want.stage {
		t.Errorf("CommandError = %s/%s, want %s/%s (%s)", ce.GetStage(), ce.GetCode(), want.stage, want.err, ce.GetMessage())
	}
	if info.GetMetadata()["stage"] != want.stage {
		t.Errorf("ErrorInfo stage = %q, want %q", info.GetMetadata()["stage"], want.stage)
	}
	return ce
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		st, _ := status.FromError(err)
		for _, d := range st.Details() {
			if ce, ok := d.(*mandatev1.CommandError); ok {
				t.Fatalf("call refused: %s/%s: %s", ce.GetStage(), ce.GetCode(), ce.GetMessage())
			}
		}
		t.Fatalf("call failed: %v", err)
	}
}

func eur(minor int64) *helpdeskv1.Money {
	return &helpdeskv1.Money{CurrencyCode: "EUR", AmountMinor: minor}
}
func usd(minor int64) *helpdeskv1.Money {
	return &helpdeskv1.Money{CurrencyCode: "USD", AmountMinor: minor}
}
