package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	dirpg "github.com/mandate-dev/mandate/internal/directory/postgres"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/api"
	auditpg "github.com/mandate-dev/mandate/services/audit/postgres"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

var (
	devSecret     = []byte("dev-secret-0123456789abcdef0123456789")
	serviceSecret = []byte("svc-secret-0123456789abcdef0123456789")
)

const policy = `
tenants:
  - id: acme
    features: [refunds]
    roles:
      support: [ticket.read]
      ops: [audit.read]
    users:
      - {id: alice, roles: [support]}
      - {id: olive, roles: [ops]}
    agents:
      - {id: audit-bot, user: olive}
  - id: globex
    roles:
      ops: [audit.read]
    users:
      - {id: gina, roles: [ops]}
`

type env struct {
	srv   *server.Server
	conn  *grpc.ClientConn // plain: callers bring their own token
	svc   *grpc.ClientConn // as the executor: service token + on-behalf-of
	dir   *dirpg.Store
	store *auditpg.Store
	api   *api.Service
}

func start(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pool := pgtest.New(t, dirpg.Migrations, auditpg.Migrations)
	dir := dirpg.New(pool, dirpg.Options{})
	if _, err := directory.Apply(ctx, dir, []byte(policy)); err != nil {
		t.Fatal(err)
	}
	cache := directory.NewCache(dir, directory.CacheOptions{TTL: time.Hour})
	store := auditpg.New(pool, auditpg.Options{})
	w := audit.NewWriter(store, audit.WriterOptions{})

	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{"mandate"}, Issuers: []string{"test"}, DevSecret: devSecret})
	if err != nil {
		t.Fatal(err)
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{Secret: serviceSecret, Audience: []string{"mandate"}, Issuers: []string{"test"}})
	if err != nil {
		t.Fatal(err)
	}
	// As `mandate audit` runs it: the executor may append on its own
	// authority (the rows it spooled).
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services, AllowServiceOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Name: "mandate.v1.AuditService", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	svcAPI := api.New(w, cache, nil)
	svcAPI.Register(srv)
	srv.HandleGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return mandatev1.RegisterAuditServiceHandler(ctx, mux, conn)
	})
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()

	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", "executor", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)), grpc.WithStreamInterceptor(identity.StreamClientInterceptor(src)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		_ = svc.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
		_ = w.Close()
		store.Close()
		cache.Close()
		dir.Close()
	})
	waitServing(t, conn)
	return &env{srv: srv, conn: conn, svc: svc, dir: dir, store: store, api: svcAPI}
}

func waitServing(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	for range 100 {
		resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("server never became SERVING")
}

func token(t *testing.T, tenant, user, agent string) string {
	t.Helper()
	tok, err := identity.MintDev(devSecret, identity.MintRequest{
		Issuer: "test", Audience: "mandate", User: user, Tenant: tenant, Agent: agent, Model: modelIf(agent), TTL: time.Hour, Now: time.Now(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func modelIf(agent string) string {
	if agent != "" {
		return "test-model"
	}
	return ""
}

func as(tok string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
}

func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

func record(inv, phase, outcome string) *mandatev1.AuditRecord {
	r := &mandatev1.AuditRecord{
		InvocationId: inv, Phase: phase, Channel: "grpc", Command: "ticket.refund", Risk: "L3",
		SideEffects: []string{"ledger", "payment-gateway"}, UserId: "alice", ActorKind: "user", Outcome: outcome,
	}
	if outcome == "refused" {
		r.Stage, r.Code = "permission_check", "authorization.permission_denied"
	}
	return r
}

func TestAppendIsForServicesOnly(t *testing.T) {
	e := start(t)
	client := mandatev1.NewAuditServiceClient(e.conn)
	_, err := client.Append(as(token(t, "acme", "alice", "")), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{record("inv-1", "outcome", "refused")}})
	if status.Code(err) != codes.PermissionDenied || reason(err) != "authorization.permission_denied" {
		t.Fatalf("user appending directly: %v", err)
	}
	_, err = client.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{record("inv-1", "outcome", "refused")}})
	if status.Code(err) != codes.Unauthenticated || reason(err) != failure.CodeAuthenticationMissingCredentials {
		t.Fatalf("anonymous append: %v", err)
	}

	svc := mandatev1.NewAuditServiceClient(e.svc)
	ctx := identity.WithRawToken(context.Background(), token(t, "acme", "alice", ""))
	other := record("inv-2", "outcome", "refused")
	other.Tenant = "globex"
	if _, err := svc.Append(ctx, &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{other}}); reason(err) != "scope.tenant_mismatch" {
		t.Fatalf("append into another tenant: %v", err)
	}
	if _, err := svc.Append(ctx, &mandatev1.AppendRequest{}); status.Code(err) != codes.InvalidArgument || reason(err) != "schema.invalid" {
		t.Fatalf("empty append: %v", err)
	}
	resp, err := svc.Append(ctx, &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{record("inv-3", "intent", "pending"), record("inv-3", "outcome", "executed")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetRecords()) != 2 || resp.GetRecords()[0].GetTenant() != "acme" || resp.GetRecords()[1].GetSeq() != 2 || resp.GetRecords()[1].GetPrevHash() != resp.GetRecords()[0].GetHash() {
		t.Fatalf("stored %v", resp.GetRecords())
	}
	// A retried append returns the stored rows and adds nothing.
	again, err := svc.Append(ctx, &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{record("inv-3", "outcome", "executed")}})
	if err != nil || again.GetRecords()[0].GetSeq() != 2 {
		t.Fatalf("retry: %v %v", again, err)
	}
}

func TestReadsNeedAuditReadAndStayInTenant(t *testing.T) {
	e := start(t)
	svc := mandatev1.NewAuditServiceClient(e.svc)
	for _, tenant := range []string{"acme", "globex"} {
		user := map[string]string{"acme": "alice", "globex": "gina"}[tenant]
		ctx := identity.WithRawToken(context.Background(), token(t, tenant, user, ""))
		if _, err := svc.Append(ctx, &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{record(tenant+"-inv", "outcome", "refused")}}); err != nil {
			t.Fatal(err)
		}
	}
	client := mandatev1.NewAuditServiceClient(e.conn)
	cases := []struct {
		name     string
		tok      string
		wantCode string
		wantInv  string
	}{
		{"alice lacks audit.read", token(t, "acme", "alice", ""), "authorization.permission_denied", ""},
		{"olive reads acme", token(t, "acme", "olive", ""), "", "acme-inv"},
		{"olive's agent reads as olive", token(t, "acme", "olive", "audit-bot"), "", "acme-inv"},
		{"unregistered agent", token(t, "acme", "olive", "rogue-bot"), "authorization.principal_inactive", ""},
		{"gina reads only globex", token(t, "globex", "gina", ""), "", "globex-inv"},
		{"unknown tenant", token(t, "initech", "olive", ""), "authorization.principal_inactive", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := client.Query(as(tc.tok), &mandatev1.QueryRequest{})
			if tc.wantCode != "" {
				if reason(err) != tc.wantCode {
					t.Fatalf("Query: %v, want %s", err, tc.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetRecords()) != 1 || resp.GetRecords()[0].GetInvocationId() != tc.wantInv {
				t.Fatalf("records %v, want only %s", resp.GetRecords(), tc.wantInv)
			}
			if _, err := client.Get(as(tc.tok), &mandatev1.GetRequest{InvocationId: map[string]string{"acme-inv": "globex-inv", "globex-inv": "acme-inv"}[tc.wantInv]}); reason(err) != "audit.not_found" {
				t.Fatalf("Get of the other tenant's invocation: %v", err)
			}
			v, err := client.Verify(as(tc.tok), &mandatev1.VerifyRequest{})
			if err != nil || !v.GetOk() || v.GetChecked() != 1 {
				t.Fatalf("Verify: %v %v", v, err)
			}
		})
	}
}

// TestDisabledUserIsRefusedAtOnce: disabling a user in the directory makes
// that user's next call, and its agents' next calls, fail without a restart
// (the cache hears the change through Postgres NOTIFY).
func TestDisabledUserIsRefusedAtOnce(t *testing.T) {
	e := start(t)
	client := mandatev1.NewAuditServiceClient(e.conn)
	olive, bot := token(t, "acme", "olive", ""), token(t, "acme", "olive", "audit-bot")
	for _, tok := range []string{olive, bot} {
		if _, err := client.Query(as(tok), &mandatev1.QueryRequest{}); err != nil {
			t.Fatalf("before disabling: %v", err)
		}
	}
	if err := directory.SetUserDisabled(context.Background(), e.dir, "acme", "olive", true); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{olive, bot} {
		if _, err := client.Query(as(tok), &mandatev1.QueryRequest{}); reason(err) != "authorization.principal_inactive" || status.Code(err) != codes.PermissionDenied {
			t.Fatalf("after disabling: %v", err)
		}
	}
}

func TestREST(t *testing.T) {
	e := start(t)
	base := "http://" + e.srv.HTTPAddr()
	get := func(method, path, tok string) (int, http.Header, map[string]any) {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), method, base+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		var body map[string]any
		_ = json.Unmarshal(b, &body)
		return resp.StatusCode, resp.Header, body
	}
	olive := token(t, "acme", "olive", "")
	cases := []struct {
		name, method, path, tok string
		status                  int
		code                    string
	}{
		{"health needs no token", http.MethodGet, "/healthz", "", 200, ""},
		{"query", http.MethodGet, "/v1/audit/records?risks=L3&page_size=10", olive, 200, ""},
		{"no token", http.MethodGet, "/v1/audit/records", "", 401, failure.CodeAuthenticationMissingCredentials},
		{"bad token", http.MethodGet, "/v1/audit/records", "not-a-jwt", 401, failure.CodeAuthenticationInvalidToken},
		{"no permission", http.MethodGet, "/v1/audit/records", token(t, "acme", "alice", ""), 403, "authorization.permission_denied"},
		{"page size out of range", http.MethodGet, "/v1/audit/records?page_size=5000", olive, 400, "schema.invalid"},
		{"malformed parameter", http.MethodGet, "/v1/audit/records?page_size=many", olive, 400, "schema.invalid"}, // refused by the RPC, like every bad input (internal/server)
		{"bad page token", http.MethodGet, "/v1/audit/records?page_token=zzz", olive, 400, "request.invalid_page_token"},
		{"unknown route", http.MethodGet, "/v1/nothing", olive, 404, "request.route_not_found"},
		{"wrong method", http.MethodDelete, "/v1/audit/records", olive, 405, "request.method_not_allowed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, header, body := get(tc.method, tc.path, tc.tok)
			if code != tc.status {
				t.Fatalf("status %d, want %d: %v", code, tc.status, body)
			}
			if tc.code == "" {
				return
			}
			if ct := header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q", ct)
			}
			if body["code"] != tc.code || body["status"] != float64(tc.status) {
				t.Errorf("problem %v, want code %s", body, tc.code)
			}
			if tc.status == 401 && !strings.HasPrefix(header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without WWW-Authenticate")
			}
		})
	}
}

// TestExecutorAppendsOnItsOwnAuthority: the rows the executor spooled while
// the trail was down reach it with no user behind the call. Then each row
// names its tenant and is filed there; a row naming none is refused; and
// no other service may append on its own authority.
func TestExecutorAppendsOnItsOwnAuthority(t *testing.T) {
	e := start(t)
	svc := mandatev1.NewAuditServiceClient(e.svc)
	spooled := record("inv-s1", "outcome", "refused")
	spooled.Tenant = "globex"
	resp, err := svc.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{spooled}})
	if err != nil || len(resp.GetRecords()) != 1 || resp.GetRecords()[0].GetTenant() != "globex" {
		t.Fatalf("executor appending a spooled row: %v %v", resp, err)
	}
	if _, err := svc.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{record("inv-s2", "outcome", "refused")}}); reason(err) != "schema.invalid" {
		t.Fatalf("a row naming no tenant: %v", err)
	}
	src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", identity.MCPBridgeService, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := grpc.NewClient(e.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close() }()
	if _, err := mandatev1.NewAuditServiceClient(other).Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{spooled}}); reason(err) != "authorization.permission_denied" {
		t.Fatalf("another service appending on its own authority: %v", err)
	}

	// Pending intents cross tenants: the executor alone lists them.
	intent := record("inv-p1", "intent", "pending")
	intent.Tenant = "globex"
	if _, err := svc.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{intent}}); err != nil {
		t.Fatal(err)
	}
	pending, err := svc.PendingIntents(context.Background(), &mandatev1.PendingIntentsRequest{OlderThan: durationpb.New(0)})
	if err != nil || len(pending.GetRecords()) != 1 || pending.GetRecords()[0].GetInvocationId() != "inv-p1" || pending.GetRecords()[0].GetTenant() != "globex" {
		t.Fatalf("pending intents: %v %v", pending, err)
	}
	// Unknown outcomes the receipts have not settled yet, until a
	// resolution row answers them.
	unknown := record("inv-u1", "outcome", "unknown")
	unknown.Tenant, unknown.Stage, unknown.Code = "globex", "dispatch", "handler.unavailable"
	if _, err := svc.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{unknown}}); err != nil {
		t.Fatal(err)
	}
	listUnknown := func() []*mandatev1.AuditRecord {
		t.Helper()
		resp, err := svc.PendingIntents(context.Background(), &mandatev1.PendingIntentsRequest{OlderThan: durationpb.New(0), UnknownOutcomes: true})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetRecords()
	}
	if got := listUnknown(); len(got) != 1 || got[0].GetInvocationId() != "inv-u1" {
		t.Fatalf("unresolved unknowns: %v", got)
	}
	resolution := record("inv-u1", "resolution", "executed")
	resolution.Tenant, resolution.Stage, resolution.Code, resolution.UserId, resolution.Message = "globex", "audit", "audit.resolved_executed", "executor", "the receipt says it ran"
	if _, err := svc.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{resolution}}); err != nil {
		t.Fatal(err)
	}
	if got := listUnknown(); len(got) != 0 {
		t.Fatalf("unknowns after their resolution: %v", got)
	}

	// One invocation's open row (a retry settling the invocation whose key
	// it found abandoned): its intent while it has no outcome, its unknown
	// outcome while no resolution answers it, nothing otherwise.
	one := func(tenant, inv string, unknown bool) ([]*mandatev1.AuditRecord, error) {
		resp, err := svc.PendingIntents(context.Background(), &mandatev1.PendingIntentsRequest{
			OlderThan: durationpb.New(0), Tenant: tenant, InvocationId: inv, UnknownOutcomes: unknown})
		return resp.GetRecords(), err
	}
	for _, c := range []struct {
		tenant, inv string
		unknown     bool
		want        string
	}{
		{"globex", "inv-p1", false, "intent"},
		{"globex", "inv-p1", true, ""},
		{"acme", "inv-p1", false, ""}, // another tenant's invocation
		{"globex", "inv-u1", false, ""},
		{"globex", "inv-u1", true, ""}, // resolved
		{"globex", "inv-none", false, ""},
	} {
		got, err := one(c.tenant, c.inv, c.unknown)
		if err != nil || len(got) > 1 || (c.want == "") != (len(got) == 0) || (len(got) == 1 && (got[0].GetPhase() != c.want || got[0].GetInvocationId() != c.inv)) {
			t.Fatalf("open row of %s/%s (unknown %v): %v %v, want %q", c.tenant, c.inv, c.unknown, got, err, c.want)
		}
	}
	outcome := record("inv-p1", "outcome", "executed")
	outcome.Tenant = "globex"
	if _, err := svc.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{outcome}}); err != nil {
		t.Fatal(err)
	}
	if got, err := one("globex", "inv-p1", false); err != nil || len(got) != 0 {
		t.Fatalf("open row of an intent with its outcome: %v %v", got, err)
	}
	if _, err := one("", "inv-p1", false); reason(err) != "schema.invalid" {
		t.Fatalf("an invocation without its tenant: %v", err)
	}

	for _, c := range []struct {
		name string
		call func() error
	}{
		{"another service", func() error {
			_, err := mandatev1.NewAuditServiceClient(other).PendingIntents(context.Background(), &mandatev1.PendingIntentsRequest{OlderThan: durationpb.New(0)})
			return err
		}},
		{"the executor relaying a user", func() error {
			_, err := svc.PendingIntents(identity.WithRawToken(context.Background(), token(t, "acme", "olive", "")), &mandatev1.PendingIntentsRequest{OlderThan: durationpb.New(0)})
			return err
		}},
		{"a user", func() error {
			_, err := mandatev1.NewAuditServiceClient(e.conn).PendingIntents(as(token(t, "acme", "olive", "")), &mandatev1.PendingIntentsRequest{OlderThan: durationpb.New(0)})
			return err
		}},
	} {
		if err := c.call(); reason(err) != "authorization.permission_denied" {
			t.Fatalf("%s listing pending intents: %v", c.name, err)
		}
	}
}

// TestConfirmAppendsDecisionRowsOnly: the confirm service appends the rows
// of decision attempts on its own authority, each naming its tenant, and
// nothing else; nobody else appends a decision row, the executor on its
// stream included.
func TestConfirmAppendsDecisionRowsOnly(t *testing.T) {
	e := start(t)
	src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", identity.ConfirmService, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(e.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	confirmSvc := mandatev1.NewAuditServiceClient(conn)
	decision := func(inv, tenant string) *mandatev1.AuditRecord {
		r := record(inv, "decision", "refused")
		r.Tenant, r.Stage, r.Code, r.Subject = tenant, "confirmation_check", "confirmation.approver_not_allowed", "chal-1"
		return r
	}
	resp, err := confirmSvc.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{decision("dec-1", "acme"), decision("dec-2", "globex")}})
	if err != nil || len(resp.GetRecords()) != 2 || resp.GetRecords()[0].GetTenant() != "acme" || resp.GetRecords()[1].GetTenant() != "globex" ||
		resp.GetRecords()[0].GetPhase() != "decision" {
		t.Fatalf("confirm appending decision rows: %v %v", resp, err)
	}
	// Relaying a user changes nothing: still decision rows only.
	relayed := identity.WithRawToken(context.Background(), token(t, "acme", "alice", ""))
	if _, err := confirmSvc.Append(relayed, &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{decision("dec-3", "")}}); err != nil {
		t.Fatalf("confirm relaying its decider: %v", err)
	}
	for name, r := range map[string]*mandatev1.AuditRecord{
		"an outcome row": func() *mandatev1.AuditRecord {
			r := record("inv-c1", "outcome", "executed")
			r.Tenant = "acme"
			return r
		}(),
		"an intent row": func() *mandatev1.AuditRecord { r := record("inv-c2", "intent", "pending"); r.Tenant = "acme"; return r }(),
	} {
		if _, err := confirmSvc.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{decision("dec-4", "acme"), r}}); reason(err) != "authorization.permission_denied" {
			t.Fatalf("confirm appending %s: %v", name, err)
		}
	}
	if _, err := confirmSvc.Append(relayed, &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{record("inv-c3", "outcome", "executed")}}); reason(err) != "authorization.permission_denied" {
		t.Fatalf("confirm relaying a user, appending an outcome row: %v", err)
	}
	exec := mandatev1.NewAuditServiceClient(e.svc)
	if _, err := exec.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{decision("dec-5", "acme")}}); reason(err) != "authorization.permission_denied" {
		t.Fatalf("the executor appending a decision row: %v", err)
	}
	if _, err := exec.Append(relayed, &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{decision("dec-6", "")}}); reason(err) != "authorization.permission_denied" {
		t.Fatalf("the executor relaying a user, appending a decision row: %v", err)
	}
	stream, err := exec.AppendStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&mandatev1.AppendStreamRequest{Id: 1, Records: []*mandatev1.AuditRecord{decision("dec-7", "acme")}}); err != nil {
		t.Fatal(err)
	}
	got, err := stream.Recv()
	if err != nil || got.GetError().GetCode() != "authorization.permission_denied" {
		t.Fatalf("a decision row on the executor's stream: %v %v", got, err)
	}
	_ = stream.CloseSend()
	// Exactly the three decision rows are stored.
	for tenant, want := range map[string]int64{"acme": 2, "globex": 1} {
		rep, err := e.store.Verify(context.Background(), tenant)
		if err != nil || !rep.OK || rep.Rows != want {
			t.Fatalf("verify %s: %+v %v, want %d rows intact", tenant, rep, err, want)
		}
	}
}

// TestAppendStream: the executor appends on one stream, on its own
// authority. Each request is answered with its id, its rows filed under
// the tenant each names; a refused request is answered with its error and
// the stream goes on. No other caller may open the stream. Drain ends it
// as unavailable once the appends under way are answered.
func TestAppendStream(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := mandatev1.NewAuditServiceClient(e.svc).AppendStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(id uint64, rec *mandatev1.AuditRecord) {
		t.Helper()
		if err := stream.Send(&mandatev1.AppendStreamRequest{Id: id, Records: []*mandatev1.AuditRecord{rec}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, tenant := range []string{"acme", "globex", ""} {
		rec := record(fmt.Sprintf("inv-st%d", i), "intent", "pending")
		rec.Tenant = tenant
		send(uint64(i+1), rec) //nolint:gosec // small
	}
	got := map[uint64]*mandatev1.AppendStreamResponse{}
	for range 3 {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got[resp.GetId()] = resp
	}
	for id, tenant := range map[uint64]string{1: "acme", 2: "globex"} {
		if r := got[id]; r.GetStatusCode() != 0 || len(r.GetRecords()) != 1 || r.GetRecords()[0].GetTenant() != tenant || r.GetRecords()[0].GetSeq() == 0 {
			t.Fatalf("request %d: %v", id, r)
		}
	}
	if r := got[3]; r.GetStatusCode() != int32(codes.InvalidArgument) || r.GetError().GetCode() != "schema.invalid" || len(r.GetRecords()) != 0 {
		t.Fatalf("a record naming no tenant: %v", r)
	}
	rec := record("inv-st4", "intent", "pending")
	rec.Tenant = "acme"
	send(4, rec)
	full, err := stream.Recv()
	if err != nil || full.GetId() != 4 || full.GetStatusCode() != 0 {
		t.Fatalf("after a refusal: %v %v", full, err)
	}
	if r := full.GetRecords()[0]; r.GetCommand() == "" || r.GetPrevHash() == "" || r.GetTime() == nil {
		t.Fatalf("a request without brief is answered with the whole record: %v", r)
	}

	// brief: where the record went, nothing else.
	rec = record("inv-st5", "intent", "pending")
	rec.Tenant = "acme"
	if err := stream.Send(&mandatev1.AppendStreamRequest{Id: 5, Records: []*mandatev1.AuditRecord{rec}, Brief: true}); err != nil {
		t.Fatal(err)
	}
	brief, err := stream.Recv()
	if err != nil || brief.GetId() != 5 || brief.GetStatusCode() != 0 || len(brief.GetRecords()) != 1 {
		t.Fatalf("brief: %v %v", brief, err)
	}
	want := &mandatev1.AuditRecord{Tenant: "acme", InvocationId: "inv-st5", Phase: "intent",
		Seq: full.GetRecords()[0].GetSeq() + 1, Hash: brief.GetRecords()[0].GetHash()}
	if got := brief.GetRecords()[0]; !proto.Equal(got, want) || len(got.GetHash()) != 64 {
		t.Fatalf("brief answer %v, want %v with a hash", got, want)
	}

	// Another service, or the executor relaying a user, may not.
	src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", identity.MCPBridgeService, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := grpc.NewClient(e.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStreamInterceptor(identity.StreamClientInterceptor(src)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close() }()
	for name, open := range map[string]func() (grpc.BidiStreamingClient[mandatev1.AppendStreamRequest, mandatev1.AppendStreamResponse], error){
		"another service": func() (grpc.BidiStreamingClient[mandatev1.AppendStreamRequest, mandatev1.AppendStreamResponse], error) {
			return mandatev1.NewAuditServiceClient(other).AppendStream(ctx)
		},
		"the executor relaying a user": func() (grpc.BidiStreamingClient[mandatev1.AppendStreamRequest, mandatev1.AppendStreamResponse], error) {
			return mandatev1.NewAuditServiceClient(e.svc).AppendStream(identity.WithRawToken(ctx, token(t, "acme", "alice", "")))
		},
	} {
		s, err := open()
		if err == nil {
			_, err = s.Recv()
		}
		if reason(err) != "authorization.permission_denied" {
			t.Fatalf("%s opening the stream: %v", name, err)
		}
	}

	e.api.Drain()
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable || reason(err) != "audit.unavailable" {
		t.Fatalf("a drained stream: %v", err)
	}
}

// TestBridgeAppendsEdgeRefusalsOnly: on its own authority the MCP bridge
// appends the rows of requests it refused at the edge (rate.limited,
// session.too_many at request_check, no command), each under the tenant it
// names, and nothing else.
func TestBridgeAppendsEdgeRefusalsOnly(t *testing.T) {
	e := start(t)
	src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", identity.MCPBridgeService, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(e.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	bridge := mandatev1.NewAuditServiceClient(conn)
	edge := func(inv, tenant, code string) *mandatev1.AuditRecord {
		return &mandatev1.AuditRecord{InvocationId: inv, Phase: "outcome", Tenant: tenant, Channel: "mcp", UserId: "alice", ActorKind: "user",
			Outcome: "refused", Stage: "request_check", Code: code, Message: "too many"}
	}
	resp, err := bridge.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{
		edge("inv-e1", "acme", failure.CodeRateLimited), edge("inv-e2", "globex", failure.CodeSessionTooMany)}})
	if err != nil || len(resp.GetRecords()) != 2 || resp.GetRecords()[1].GetTenant() != "globex" || resp.GetRecords()[0].GetCommand() != "" {
		t.Fatalf("the bridge appending edge refusals: %v %v", resp, err)
	}
	for name, r := range map[string]*mandatev1.AuditRecord{
		"an executed row": func() *mandatev1.AuditRecord {
			r := record("inv-e3", "outcome", "executed")
			r.Tenant = "acme"
			return r
		}(),
		"another code": edge("inv-e4", "acme", failure.CodeSchemaInvalid),
		"a command's row": func() *mandatev1.AuditRecord {
			r := edge("inv-e5", "acme", failure.CodeRateLimited)
			r.Command = "ticket.refund"
			return r
		}(),
		"a decision row": func() *mandatev1.AuditRecord {
			r := edge("inv-e6", "acme", failure.CodeRateLimited)
			r.Phase = "decision"
			return r
		}(),
	} {
		if _, err := bridge.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{r}}); reason(err) != failure.CodeAuthorizationPermissionDenied {
			t.Errorf("the bridge appending %s: %v, want %s", name, err, failure.CodeAuthorizationPermissionDenied)
		}
	}
	// Any other row needs a command, as before.
	exec := mandatev1.NewAuditServiceClient(e.svc)
	noCommand := record("inv-e7", "outcome", "refused")
	noCommand.Tenant, noCommand.Command = "acme", ""
	if _, err := exec.Append(context.Background(), &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{noCommand}}); reason(err) != failure.CodeSchemaInvalid {
		t.Fatalf("a permission_check refusal without a command: %v", err)
	}
	for tenant, want := range map[string]int64{"acme": 1, "globex": 1} {
		rep, err := e.store.Verify(context.Background(), tenant)
		if err != nil || !rep.OK || rep.Rows != want {
			t.Fatalf("verify %s: %+v %v, want %d rows intact", tenant, rep, err, want)
		}
	}
}
