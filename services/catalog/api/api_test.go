package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	dirpg "github.com/mandate-dev/mandate/internal/directory/postgres"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/internal/tooldesc"
	"github.com/mandate-dev/mandate/services/catalog"
	"github.com/mandate-dev/mandate/services/catalog/api"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

var (
	devSecret     = []byte("dev-secret-0123456789abcdef0123456789")
	serviceSecret = []byte("svc-secret-0123456789abcdef0123456789")
)

var (
	aliceTools = []string{"expense.report.create", "expense.report.recall", "expense.report.submit", "ticket.get", "ticket.search"}
	carolTools = []string{"customer.erase", "ticket.get", "ticket.refund", "ticket.search"}
	daveTools  = []string{"ticket.get", "ticket.refund", "ticket.search"}
)

// directories returns the store the catalog reads and the store a test
// changes the directory through: the same store in memory, two instances
// on one database for Postgres, so that changes travel through NOTIFY.
type directories func(t *testing.T) (served, writer directory.Store)

func memoryDirectory(*testing.T) (directory.Store, directory.Store) {
	s := dirmem.New()
	return s, s
}

func postgresDirectory(t *testing.T) (directory.Store, directory.Store) {
	pool := pgtest.New(t, dirpg.Migrations)
	served, writer := dirpg.New(pool, dirpg.Options{}), dirpg.New(pool, dirpg.Options{})
	t.Cleanup(func() { served.Close(); writer.Close() })
	return served, writer
}

var backends = map[string]directories{"memory": memoryDirectory, "postgres": postgresDirectory}

type env struct {
	srv  *server.Server
	conn *grpc.ClientConn // plain: callers bring their own token
	svc  *grpc.ClientConn // as the executor: service token + on-behalf-of
	dir  directory.Store  // the writer
	set  *manifest.Set
}

func start(t *testing.T, dirs directories) *env {
	t.Helper()
	return startWith(t, dirs, catalog.Config{})
}

// startWith serves a catalog configured with cfg (its manifest, directory
// and trusted services are the test's).
func startWith(t *testing.T, dirs directories, cfg catalog.Config) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	served, writer := dirs(t)
	policy, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "policy", "demo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := directory.Apply(ctx, writer, policy); err != nil {
		t.Fatal(err)
	}
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Manifest, cfg.Directory, cfg.TrustedServices = set, served, []string{"executor"}
	cat, err := catalog.New(cfg)
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
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Name: "mandate.v1.CatalogService", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	api.New(cat, nil).Register(srv)
	srv.HandleGateway(api.Gateway)
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
		cat.Close()
	})
	waitServing(t, conn)
	return &env{srv: srv, conn: conn, svc: svc, dir: writer, set: set}
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
	r := identity.MintRequest{Issuer: "test", Audience: "mandate", User: user, Tenant: tenant, Agent: agent, TTL: time.Hour, Now: time.Now()}
	if agent != "" {
		r.Model = "test-model"
	}
	tok, err := identity.MintDev(devSecret, r)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func as(tok string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
}

// relaying is the context of a call the executor makes for the holder of
// tok: the service interceptor sends its own token and forwards tok.
func relaying(tok string) context.Context { return identity.WithRawToken(context.Background(), tok) }

func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

func stage(err error) string {
	for _, d := range status.Convert(err).Details() {
		if ce, ok := d.(*mandatev1.CommandError); ok {
			return ce.GetStage()
		}
	}
	return ""
}

func wantRefusal(t *testing.T, what string, err error, code codes.Code, reasonCode, stageName string) {
	t.Helper()
	if status.Code(err) != code || reason(err) != reasonCode || stage(err) != stageName {
		t.Fatalf("%s: got %v %q (stage %q), want %v %s at %s", what, status.Code(err), err, stage(err), code, reasonCode, stageName)
	}
}

func names(tools []*mandatev1.Tool) []string {
	out := []string{}
	for _, tool := range tools {
		out = append(out, tool.GetName())
	}
	return out
}

func forEachBackend(t *testing.T, test func(t *testing.T, e *env)) {
	for name, dirs := range backends {
		t.Run(name, func(t *testing.T) { test(t, start(t, dirs)) })
	}
}

func TestListToolsPerPrincipal(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		client := mandatev1.NewCatalogServiceClient(e.conn)
		cases := []struct {
			name   string
			ctx    context.Context
			client mandatev1.CatalogServiceClient
			want   []string
			reason string
		}{
			{"alice", as(token(t, "acme", "alice", "")), client, aliceTools, ""},
			{"support-bot acting for alice", as(token(t, "acme", "alice", "support-bot")), client, aliceTools, ""},
			{"carol", as(token(t, "acme", "carol", "")), client, carolTools, ""},
			{"finance-bot acting for carol", as(token(t, "acme", "carol", "finance-bot")), client, carolTools, ""},
			{"olive", as(token(t, "acme", "olive", "")), client, []string{"ops.review"}, ""},
			{"dave of globex: no expenses feature", as(token(t, "globex", "dave", "")), client, daveTools, ""},
			{"alice relayed by the MCP bridge", relaying(token(t, "acme", "alice", "support-bot")), mandatev1.NewCatalogServiceClient(e.svc), aliceTools, ""},
			{"support-bot claiming to act for carol", as(token(t, "acme", "carol", "support-bot")), client, nil, directory.ReasonAgentWrongUser},
			{"unregistered agent", as(token(t, "acme", "alice", "rogue-bot")), client, nil, directory.ReasonAgentNotRegistered},
			{"alice's id in globex", as(token(t, "globex", "alice", "")), client, nil, directory.ReasonUserUnknown},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				resp, err := tc.client.ListTools(tc.ctx, &mandatev1.ListToolsRequest{})
				if err != nil {
					t.Fatal(err)
				}
				want := tc.want
				if want == nil {
					want = []string{}
				}
				if got := names(resp.GetTools()); !slices.Equal(got, want) {
					t.Fatalf("tools %v, want %v", got, want)
				}
				if resp.GetPrincipalActive() != (tc.reason == "") || resp.GetInactiveReason() != tc.reason || resp.GetManifestDigest() != e.set.Digest() {
					t.Fatalf("active=%v reason=%q digest=%q", resp.GetPrincipalActive(), resp.GetInactiveReason(), resp.GetManifestDigest())
				}
				for _, tool := range resp.GetTools() {
					var desc struct {
						Name        string          `json:"name"`
						InputSchema json.RawMessage `json:"inputSchema"`
						Meta        map[string]any  `json:"_meta"`
					}
					if err := json.Unmarshal([]byte(tool.GetDescriptorJson()), &desc); err != nil {
						t.Fatal(err)
					}
					cmd, _ := e.set.ByCode(tool.GetName())
					if desc.Name != tool.GetName() || !bytes.Equal(desc.InputSchema, mustCompact(t, cmd.InputSchema)) || desc.Meta[tooldesc.MetaRisk] != cmd.Risk {
						t.Fatalf("descriptor of %s does not describe the command", tool.GetName())
					}
				}
			})
		}
		_, err := client.ListTools(context.Background(), &mandatev1.ListToolsRequest{})
		wantRefusal(t, "no token", err, codes.Unauthenticated, failure.CodeAuthenticationMissingCredentials, identity.Stage)
		// A service has no tools of its own: without an end user's token its
		// call is not even authenticated.
		_, err = mandatev1.NewCatalogServiceClient(e.svc).ListTools(context.Background(), &mandatev1.ListToolsRequest{})
		wantRefusal(t, "a service on its own", err, codes.Unauthenticated, failure.CodeAuthenticationInvalidToken, identity.Stage)
	})
}

func mustCompact(t *testing.T, raw json.RawMessage) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestGetToolHidesWhatTheCallerMayNotRun(t *testing.T) {
	e := start(t, memoryDirectory)
	client := mandatev1.NewCatalogServiceClient(e.conn)
	resp, err := client.GetTool(as(token(t, "acme", "carol", "")), &mandatev1.GetToolRequest{Code: "ticket.refund"})
	if err != nil || resp.GetTool().GetName() != "ticket.refund" || !strings.Contains(resp.GetTool().GetDescriptorJson(), `"/cardholder_reference"`) {
		t.Fatalf("carol's refund tool: %v %v", resp, err)
	}
	for _, tc := range []struct{ name, tok, code string }{
		{"alice asks for refunds", token(t, "acme", "alice", ""), "ticket.refund"},
		{"her agent asks for refunds", token(t, "acme", "alice", "support-bot"), "ticket.refund"},
		{"dave asks for expenses", token(t, "globex", "dave", ""), "expense.report.create"},
		{"alice asks for the review", token(t, "acme", "alice", ""), "ops.review"},
		{"no such command", token(t, "acme", "carol", ""), "ticket.delete"},
	} {
		_, err := client.GetTool(as(tc.tok), &mandatev1.GetToolRequest{Code: tc.code})
		wantRefusal(t, tc.name, err, codes.NotFound, failure.CodeCommandNotFound, catalog.StageLoad)
	}
	_, err = client.GetTool(as(token(t, "acme", "carol", "")), &mandatev1.GetToolRequest{})
	wantRefusal(t, "empty code", err, codes.InvalidArgument, "schema.invalid", "schema_validate")
}

func TestManifestIsVerbatim(t *testing.T) {
	e := start(t, memoryDirectory)
	client := mandatev1.NewCatalogServiceClient(e.conn)
	embedded, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	olive := as(token(t, "acme", "olive", ""))
	resp, err := client.GetManifest(olive, &mandatev1.GetManifestRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(resp.GetManifest(), embedded.Bytes()) || resp.GetDigest() != embedded.Digest() || resp.GetContentType() != "application/json" {
		t.Fatalf("manifest differs from manifest.Embedded().Bytes() (digest %q)", resp.GetDigest())
	}
	_, err = client.GetManifest(as(token(t, "acme", "alice", "support-bot")), &mandatev1.GetManifestRequest{})
	wantRefusal(t, "support-bot reading the manifest", err, codes.PermissionDenied, failure.CodeAuthorizationPermissionDenied, catalog.StagePermission)
	_, err = client.GetManifest(as(token(t, "acme", "olive", "rogue-bot")), &mandatev1.GetManifestRequest{})
	wantRefusal(t, "unregistered agent reading the manifest", err, codes.PermissionDenied, failure.CodeAuthorizationPrincipalInactive, catalog.StageAuthenticate)

	slice, err := client.GetCommandSlice(as(token(t, "acme", "alice", "support-bot")), &mandatev1.GetCommandSliceRequest{Code: "expense.report.submit"})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(embedded.Bytes(), slice.GetCommand()) != 1 || !bytes.HasPrefix(slice.GetCommand(), []byte("{")) || !json.Valid(slice.GetCommand()) ||
		slice.GetCode() != "expense.report.submit" || slice.GetManifestDigest() != embedded.Digest() {
		t.Fatalf("slice %q is not a verbatim command of the manifest", slice.GetCommand())
	}
	var head struct {
		Code string `json:"code"`
	}
	if err := json.Unmarshal(slice.GetCommand(), &head); err != nil || head.Code != "expense.report.submit" {
		t.Fatalf("slice is of %q", head.Code)
	}
	_, err = client.GetCommandSlice(as(token(t, "acme", "alice", "support-bot")), &mandatev1.GetCommandSliceRequest{Code: "ticket.refund"})
	wantRefusal(t, "slice of a command the agent may not run", err, codes.NotFound, failure.CodeCommandNotFound, catalog.StageLoad)
	if _, err := client.GetCommandSlice(olive, &mandatev1.GetCommandSliceRequest{Code: "ticket.refund"}); err != nil {
		t.Fatalf("olive (ops.read) reading any slice: %v", err)
	}
}

func TestReviewRunsOnlyThroughTheExecutor(t *testing.T) {
	e := start(t, memoryDirectory)
	olive := token(t, "acme", "olive", "")
	_, err := mandatev1.NewCatalogServiceClient(e.conn).Review(as(olive), &mandatev1.ReviewRequest{})
	wantRefusal(t, "olive calling the catalog directly", err, codes.PermissionDenied, failure.CodeScopeNotViaExecutor, catalog.StageScope)

	viaExecutor := mandatev1.NewCatalogServiceClient(e.svc)
	_, err = viaExecutor.Review(relaying(token(t, "acme", "alice", "")), &mandatev1.ReviewRequest{})
	wantRefusal(t, "alice through the executor", err, codes.PermissionDenied, failure.CodeAuthorizationPermissionDenied, catalog.StagePermission)

	resp, err := viaExecutor.Review(relaying(olive), &mandatev1.ReviewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	type finding struct {
		rule     string
		severity mandatev1.FindingSeverity
		command  string
	}
	var got []finding
	for _, f := range resp.GetFindings() {
		got = append(got, finding{f.GetRule(), f.GetSeverity(), f.GetCommand()})
		if !strings.HasPrefix(f.GetExplanation(), f.GetCommand()+" ") {
			t.Errorf("explanation %q", f.GetExplanation())
		}
	}
	want := []finding{
		{"REVIEW001", mandatev1.FindingSeverity_FINDING_SEVERITY_WARNING, "ticket.refund"},
		{"REVIEW004", mandatev1.FindingSeverity_FINDING_SEVERITY_WARNING, "expense.report.approve"},
		{"REVIEW009", mandatev1.FindingSeverity_FINDING_SEVERITY_INFO, "customer.erase"},
	}
	if !slices.Equal(got, want) || resp.GetManifestDigest() != e.set.Digest() || resp.GetPrompt() != "" {
		t.Fatalf("review %v (prompt %d bytes), want %v", got, len(resp.GetPrompt()), want)
	}
	narrated, err := viaExecutor.Review(relaying(token(t, "acme", "olive", "")), &mandatev1.ReviewRequest{Narrate: true})
	if err != nil || narrated.GetPrompt() != catalog.ToPrompt(e.set.Manifest(), tooldesc.Options{}) {
		t.Fatalf("narrated review: %v", err)
	}
}

// TestWatchOnPostgres: disabling alice through another store instance
// reaches the catalog through NOTIFY, and both her stream and her agent's
// get the new, empty set.
func TestWatchOnPostgres(t *testing.T) {
	e := start(t, postgresDirectory)
	client := mandatev1.NewCatalogServiceClient(e.conn)
	// Bounded, so that a missed event fails the test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var streams []grpc.ServerStreamingClient[mandatev1.CatalogEvent]
	for _, agentID := range []string{"", "support-bot"} {
		md := metadata.Pairs("authorization", "Bearer "+token(t, "acme", "alice", agentID))
		stream, err := client.Watch(metadata.NewOutgoingContext(ctx, md), &mandatev1.CatalogServiceWatchRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetKind() != mandatev1.CatalogEventKind_CATALOG_EVENT_KIND_SNAPSHOT || !slices.Equal(names(ev.GetTools()), aliceTools) || !ev.GetPrincipalActive() {
			t.Fatalf("snapshot %v", ev)
		}
		streams = append(streams, stream)
	}

	// A change elsewhere in the tenant leaves alice's set alone: the next
	// event her streams see is the one about her.
	if err := directory.SetUserDisabled(context.Background(), e.dir, "acme", "carol", true); err != nil {
		t.Fatal(err)
	}
	if err := directory.SetUserDisabled(context.Background(), e.dir, "acme", "alice", true); err != nil {
		t.Fatal(err)
	}
	for _, stream := range streams {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetKind() != mandatev1.CatalogEventKind_CATALOG_EVENT_KIND_CHANGED || len(ev.GetTools()) != 0 || ev.GetPrincipalActive() ||
			ev.GetInactiveReason() != directory.ReasonUserDisabled || !slices.Equal(ev.GetRemoved(), aliceTools) || len(ev.GetAdded()) != 0 {
			t.Fatalf("after disabling alice: %v", ev)
		}
	}
	resp, err := client.ListTools(as(token(t, "acme", "alice", "support-bot")), &mandatev1.ListToolsRequest{})
	if err != nil || len(resp.GetTools()) != 0 || resp.GetPrincipalActive() {
		t.Fatalf("ListTools after disabling alice: %v %v", resp, err)
	}

	if err := directory.SetUserDisabled(context.Background(), e.dir, "acme", "alice", false); err != nil {
		t.Fatal(err)
	}
	// Enabling alice again does not revive her old tokens: a stream opened
	// with a token issued since sees her tools.
	res, err := directory.Direct(e.dir).Resolve(context.Background(), "acme", "alice", "")
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := identity.MintDev(devSecret, identity.MintRequest{Issuer: "test", Audience: "mandate", User: "alice", Tenant: "acme", TTL: time.Hour, Now: res.NotBefore()})
	if err != nil {
		t.Fatal(err)
	}
	// The catalog's directory cache hears of the re-enabling through
	// Postgres's NOTIFY: a snapshot taken before that still says disabled.
	var ev *mandatev1.CatalogEvent
	for {
		sctx, stop := context.WithCancel(ctx)
		stream, err := client.Watch(metadata.NewOutgoingContext(sctx, metadata.Pairs("authorization", "Bearer "+fresh)), &mandatev1.CatalogServiceWatchRequest{})
		if err != nil {
			stop()
			t.Fatal(err)
		}
		ev, err = stream.Recv()
		stop()
		if err != nil {
			t.Fatalf("after enabling alice, a fresh token: %v", err)
		}
		if ev.GetPrincipalActive() || ev.GetInactiveReason() != directory.ReasonUserDisabled {
			break
		}
		time.Sleep(20 * time.Millisecond) // ctx bounds the wait
	}
	if !slices.Equal(names(ev.GetTools()), aliceTools) || !ev.GetPrincipalActive() {
		t.Fatalf("after enabling alice, a fresh token: %v", ev)
	}
}

func TestREST(t *testing.T) {
	e := start(t, memoryDirectory)
	base := "http://" + e.srv.HTTPAddr()
	// get returns the status, the content type and the decoded JSON body.
	get := func(path, tok string) (int, string, map[string]any) {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, base+path, nil)
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
		return resp.StatusCode, resp.Header.Get("Content-Type"), body
	}
	alice, olive := token(t, "acme", "alice", ""), token(t, "acme", "olive", "")
	cases := []struct {
		name, path, tok string
		status          int
		code            string
	}{
		{"tools", "/v1/catalog/tools", alice, 200, ""},
		{"one tool", "/v1/catalog/tools/ticket.search", alice, 200, ""},
		{"someone else's tool", "/v1/catalog/tools/ticket.refund", alice, 404, failure.CodeCommandNotFound},
		{"manifest", "/v1/catalog/manifest", olive, 200, ""},
		{"manifest without ops.read", "/v1/catalog/manifest", alice, 403, failure.CodeAuthorizationPermissionDenied},
		{"a slice", "/v1/catalog/commands/ticket.search", alice, 200, ""},
		{"review straight to the catalog", "/v1/catalog/review?narrate=true", olive, 403, failure.CodeScopeNotViaExecutor},
		{"no token", "/v1/catalog/tools", "", 401, failure.CodeAuthenticationMissingCredentials},
		{"bad token", "/v1/catalog/tools", "not-a-jwt", 401, failure.CodeAuthenticationInvalidToken},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, contentType, body := get(tc.path, tc.tok)
			if code != tc.status {
				t.Fatalf("status %d, want %d: %v", code, tc.status, body)
			}
			if tc.code != "" && (body["code"] != tc.code || contentType != "application/problem+json") {
				t.Fatalf("problem %v, want code %s", body, tc.code)
			}
		})
	}

	_, _, body := get("/v1/catalog/tools", alice)
	tools, _ := body["tools"].([]any)
	if len(tools) != len(aliceTools) || body["manifest_digest"] != e.set.Digest() || body["principal_active"] != true {
		t.Fatalf("REST tools %v", body)
	}
	_, _, body = get("/v1/catalog/manifest", olive)
	raw, err := base64.StdEncoding.DecodeString(body["manifest"].(string))
	if err != nil || !bytes.Equal(raw, e.set.Bytes()) {
		t.Fatalf("REST manifest is not the base64 of the verbatim bytes: %v", err)
	}

	// The watch stream over REST: newline-delimited {"result": event}.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/catalog/tools:watch", nil)
	req.Header.Set("Authorization", "Bearer "+token(t, "acme", "alice", "support-bot"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	line, err := bufio.NewReader(resp.Body).ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	var ev struct {
		Result struct {
			Kind  string `json:"kind"`
			Tools []struct {
				Name string `json:"name"`
			} `json:"tools"`
		} `json:"result"`
	}
	if err := json.Unmarshal(line, &ev); err != nil || ev.Result.Kind != "CATALOG_EVENT_KIND_SNAPSHOT" || len(ev.Result.Tools) != len(aliceTools) {
		t.Fatalf("REST watch snapshot %s: %v", line, err)
	}
}
