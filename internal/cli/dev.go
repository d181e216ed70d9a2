package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpmem "github.com/mandate-dev/mandate/examples/helpdesk/memory"
	"github.com/mandate-dev/mandate/examples/policy"
	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	genopenapi "github.com/mandate-dev/mandate/gen/openapi"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/oauth"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/telemetry"
	"github.com/mandate-dev/mandate/services/audit"
	auditapi "github.com/mandate-dev/mandate/services/audit/api"
	auditmem "github.com/mandate-dev/mandate/services/audit/memory"
	"github.com/mandate-dev/mandate/services/catalog"
	catalogapi "github.com/mandate-dev/mandate/services/catalog/api"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmapi "github.com/mandate-dev/mandate/services/confirm/api"
	confirmmem "github.com/mandate-dev/mandate/services/confirm/memory"
	"github.com/mandate-dev/mandate/services/confirm/page"
	"github.com/mandate-dev/mandate/services/executor"
	execapi "github.com/mandate-dev/mandate/services/executor/api"
	execmem "github.com/mandate-dev/mandate/services/executor/memory"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// devPrincipals are the users and agents `mandate dev` writes tokens for.
// Orgs match examples/policy/demo.yaml; backends scope by the token's org.
var devPrincipals = []struct{ name, tenant, org, user, agent, model string }{
	{"alice", "acme", "support", "alice", "", ""},
	{"bob", "acme", "support", "bob", "", ""},
	{"carol", "acme", "finance", "carol", "", ""},
	{"olive", "acme", "ops", "olive", "", ""},
	{"dave", "globex", "support", "dave", "", ""},
	{"support-bot@alice", "acme", "support", "alice", "support-bot", "dev-model"},
	{"finance-bot@carol", "acme", "finance", "carol", "finance-bot", "dev-model"},
	{"payout-bot@carol", "acme", "finance", "carol", "payout-bot", "dev-model"},
}

// runDev runs the whole suite in one process on in-memory stores with the
// helpdesk sample and the demo directory.
func runDev(ctx context.Context, args []string, io IO) error {
	var (
		httpAddr, grpcAddr, tokensFile, logLevel string
		otlpEndpoint                             string
		devSecret                                config.Secret
		confirmSideEffects, metricsOn            bool
		auditRetain                              int
		ef                                       eventsFlags
	)
	s := config.New("dev", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	s.String(&httpAddr, "http-addr", "127.0.0.1:8080", "HTTP: REST, approval pages, /openapi.json, /healthz")
	s.String(&grpcAddr, "grpc-addr", "127.0.0.1:9090", "gRPC: every service and the governed proxy")
	s.String(&tokensFile, "tokens-file", "", "write the dev tokens (JSON object: name → token) to this file")
	s.String(&logLevel, "log-level", "warn", "debug, info, warn or error")
	s.SecretVar(&devSecret, "dev-secret", "HS256 secret for dev tokens (default: random per run)")
	s.Bool(&confirmSideEffects, "confirm-side-effects", false, "require confirmation for every command that declares side effects (the executor enforces it, the catalog's tools state it)")
	s.Int(&auditRetain, "audit-retain", auditmem.DefaultMaxRows, "audit rows kept per tenant; older ones are evicted (0 keeps every row)")
	s.Check(func() error { return checkRetain(s, auditRetain) })
	otlpFlag(s, &otlpEndpoint)
	metricsFlag(s, &metricsOn)
	ef.declare(s)
	if err := s.Parse(args); err != nil {
		return err
	}
	lvl, err := parseLevel(logLevel)
	if err != nil {
		return s.Errorf("log-level", "%v", err)
	}
	log := slog.New(slog.NewTextHandler(io.Stderr, &slog.HandlerOptions{Level: lvl}))
	if !devSecret.Set() {
		devSecret = config.NewSecret(randomHex(32))
	}
	serviceSecret := []byte(randomHex(32))
	var cl closers
	defer cl.close()
	metrics, err := startTracing(ctx, io, "dev", otlpEndpoint, metricsOn, log, &cl)
	if err != nil {
		return err
	}

	set, err := manifest.Embedded()
	if err != nil {
		return err
	}
	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{DefaultAudience}, Issuers: []string{DefaultIssuer}, DevSecret: []byte(devSecret.Reveal())})
	if err != nil {
		return err
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{Secret: serviceSecret, Audience: []string{DefaultAudience}, Issuers: []string{DefaultIssuer}})
	if err != nil {
		return err
	}
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services})
	if err != nil {
		return err
	}

	dirStore := dirmem.New()
	if _, err := directory.Apply(ctx, dirStore, policy.Demo, directory.FileName("examples/policy/demo.yaml")); err != nil {
		return err
	}
	dir := directory.NewCache(dirStore, directory.CacheOptions{TTL: time.Minute})
	cl.add(dir.Close)

	auditStore := auditmem.New(auditmem.Options{MaxRows: auditRetain})
	cl.add(auditStore.Close)
	writer := audit.NewWriter(auditStore, audit.WriterOptions{Logger: log})
	cl.add(func() { _ = writer.Close() })

	confirmStore := confirmmem.New(confirmmem.Options{})
	cl.add(confirmStore.Close)
	base := "http://" + httpAddr
	confirmSvc, err := confirm.New(confirm.Config{Store: confirmStore, Directory: dir, Commands: set, ApprovalBaseURL: base, Logger: log})
	if err != nil {
		return err
	}
	approvals, err := page.New(page.Config{Confirm: confirmSvc, Sessions: confirmStore, Directory: dir,
		LoginSecret: []byte(devSecret.Reveal()), Issuers: []string{DefaultIssuer}, BaseURL: base, Logger: log})
	if err != nil {
		return err
	}

	// The helpdesk backend listens on its own loopback port: were it on
	// the public gRPC server, its RPCs would bypass the governed proxy.
	hstore := helpmem.New()
	if err := helpdesk.Seed(ctx, hstore); err != nil {
		return err
	}
	backend, err := helpdesk.New(helpdesk.Config{Store: hstore, Gateway: helpdesk.NewGateway(), TrustedServices: []string{executor.ServiceName}, Logger: log})
	if err != nil {
		return err
	}
	backendSrv, err := server.New(server.Config{Name: "examples.helpdesk.v1.HelpdeskService", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth, Logger: log})
	if err != nil {
		return err
	}
	backend.Register(backendSrv)
	cat, err := catalog.New(catalog.Config{Manifest: set, Directory: dirStore, ConfirmSideEffects: confirmSideEffects,
		TrustedServices: []string{executor.ServiceName}, Logger: log})
	if err != nil {
		return err
	}
	cl.add(cat.Close)
	catAPI := catalogapi.New(cat, log)
	// ops.review is a command: the executor dispatches it to the catalog on
	// the internal port, like any backend.
	catAPI.Register(backendSrv)
	src, err := identity.NewServiceTokenSource(serviceSecret, DefaultIssuer, DefaultAudience, executor.ServiceName, time.Hour)
	if err != nil {
		return err
	}
	backendConn, err := grpc.NewClient(backendSrv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), telemetry.GRPCClientOption(),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)))
	if err != nil {
		return err
	}
	cl.add(func() { _ = backendConn.Close() })

	// No embedded broker: events are relayed to --events-url when given.
	execStore := execmem.New(execmem.Options{})
	if err := ef.start(ctx, execStore, log, &cl); err != nil {
		return err
	}
	// The executor reaches audit and confirm through their APIs, in
	// process, on its own service identity, as it does over the network:
	// confirm for the caller it relays, audit on its own authority (its
	// append stream), which their server admits as the audit service's
	// own process does.
	internalAuth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services, AllowServiceOnly: true})
	if err != nil {
		return err
	}
	internalSrv, err := server.New(server.Config{Name: "mandate.internal", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: internalAuth, Logger: log})
	if err != nil {
		return err
	}
	auditAPI, confirmAPI := auditapi.New(writer, dir, log), confirmapi.New(confirmSvc, log)
	auditAPI.Register(internalSrv)
	confirmAPI.Register(internalSrv)
	internalConn := internalSrv.InProcess(src)
	trail := executor.NewAuditStream(mandatev1.NewAuditServiceClient(internalConn))
	cl.add(trail.Close)
	exec, err := executor.New(executor.Config{
		Manifest: set, Directory: dir, Audit: trail, Confirm: mandatev1.NewConfirmServiceClient(internalConn),
		Dispatcher: executor.NewGRPCDispatcher(map[string]grpc.ClientConnInterface{
			"examples.helpdesk.v1.HelpdeskService": backendConn,
			"mandate.v1.CatalogService":            backendConn,
		}),
		Store: execStore, ConfirmSideEffects: confirmSideEffects, Logger: log,
	})
	if err != nil {
		return err
	}
	cl.add(exec.Close)
	execSvc := execapi.New(exec, set)
	srv, err := server.New(server.Config{Name: "mandate", GRPCAddr: grpcAddr, HTTPAddr: httpAddr, Auth: auth, Logger: log, Metrics: metrics, GRPCOptions: execSvc.ServerOptions()})
	if err != nil {
		return err
	}
	execSvc.Register(srv)
	auditAPI.Register(srv)
	confirmAPI.Register(srv)
	catAPI.Register(srv) // tool lists and manifest reads; Review refuses calls not relayed by the executor
	srv.HandleGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		if err := mandatev1.RegisterExecutorServiceHandler(ctx, mux, conn); err != nil {
			return err
		}
		if err := mandatev1.RegisterAuditServiceHandler(ctx, mux, conn); err != nil {
			return err
		}
		if err := mandatev1.RegisterConfirmServiceHandler(ctx, mux, conn); err != nil {
			return err
		}
		if err := catalogapi.Gateway(ctx, mux, conn); err != nil {
			return err
		}
		// The sample's own REST routes (google.api.http) go through the
		// governed proxy like every other call.
		return helpdeskv1.RegisterHelpdeskServiceHandler(ctx, mux, conn)
	})
	srv.Handle(page.Pattern, approvals)
	// MCP hosts connect by OAuth: discovery, registration, the dev sign-in
	// and consent in the browser; an approved client becomes an
	// interactive agent of its user, with the dev tokens' kind of JWT.
	authServer, err := oauth.New(oauth.Config{Issuer: base, Resource: base + "/mcp", Directory: dirStore, Users: devUsers(),
		TokenSecret: []byte(devSecret.Reveal()), TokenIssuer: DefaultIssuer, TokenAudience: DefaultAudience, Verifier: users,
		LoopbackClientIDs: true, Logger: log})
	if err != nil {
		return err
	}
	for _, p := range authServer.Paths() {
		srv.Handle(p, authServer.Handler())
	}
	// The requestState key of MCP 2026-07-28 confirmations lives as long as
	// the run, like the service secret.
	// The bridge calls the catalog, the executor and the confirm service
	// through the server's in-process channel, as the separate bridge does
	// over gRPC: with its service token, relaying the caller's.
	bridgeSrc, err := identity.NewServiceTokenSource(serviceSecret, DefaultIssuer, DefaultAudience, identity.MCPBridgeService, time.Hour)
	if err != nil {
		return err
	}
	local := srv.InProcess(bridgeSrc)
	bridge, err := mcpbridge.New(mcpbridge.Config{
		Catalog:  mandatev1.NewCatalogServiceClient(local),
		Executor: mandatev1.NewExecutorServiceClient(local),
		Confirm:  mandatev1.NewConfirmServiceClient(local),
		Manifest: set, Verifier: users,
		ResourceURL: base + "/mcp", AuthorizationServers: []string{authServer.Issuer()}, SessionTimeout: time.Hour, Logger: log,
		StateKey: []byte(randomHex(32))})
	if err != nil {
		return err
	}
	cl.add(bridge.Close)
	// Open sessions' SSE streams would hold the HTTP shutdown until its
	// timeout: end them as soon as stopping begins.
	stopBridge := context.AfterFunc(ctx, bridge.Close)
	defer stopBridge()
	srv.Handle("/mcp", bridge.Handler())
	srv.Handle(bridge.MetadataPath(), bridge.MetadataHandler())
	srv.Handle("GET /openapi.json", openAPIHandler())

	tokens := map[string]string{}
	for _, p := range devPrincipals {
		tok, err := identity.MintDev([]byte(devSecret.Reveal()), identity.MintRequest{Issuer: DefaultIssuer, Audience: DefaultAudience,
			User: p.user, Tenant: p.tenant, Org: p.org, Agent: p.agent, Model: p.model, TTL: 24 * time.Hour, Now: time.Now()})
		if err != nil {
			return err
		}
		tokens[p.name] = tok
	}
	if tokensFile != "" {
		b, _ := json.MarshalIndent(tokens, "", "  ")
		if err := os.WriteFile(tokensFile, append(b, '\n'), 0o600); err != nil {
			return fmt.Errorf("--tokens-file: %w", err)
		}
	}

	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = backendSrv.Run(rctx) }()
	go func() { _ = internalSrv.Run(rctx) }()
	go func() { _ = audit.NewReconciler(writer, audit.ReconcilerOptions{Logger: log}).Run(rctx) }()

	fmt.Fprintf(io.Stdout, "Mandate dev: the whole suite in one process on in-memory stores (nothing is kept).\n\n")
	fmt.Fprintf(io.Stdout, "  MCP       http://%s/mcp   (Streamable HTTP, bearer token)\n", srv.HTTPAddr())
	fmt.Fprintf(io.Stdout, "  REST      http://%s/v1/commands/{code}:execute   (also /v1/catalog/…, /v1/audit/…, /v1/challenges/…)\n", srv.HTTPAddr())
	fmt.Fprintf(io.Stdout, "  gRPC      %s   (ExecutorService, CatalogService, AuditService, ConfirmService, and the governed HelpdeskService proxy)\n", srv.GRPCAddr())
	fmt.Fprintf(io.Stdout, "  approvals http://%s/approve/{challenge}\n", srv.HTTPAddr())
	fmt.Fprintf(io.Stdout, "  OAuth     %s   (MCP hosts: browser sign-in and consent; no token to copy)\n", authServer.Issuer()+"/.well-known/oauth-authorization-server")
	fmt.Fprintf(io.Stdout, "  OpenAPI   http://%s/openapi.json   health http://%s/healthz\n\n", srv.HTTPAddr(), srv.HTTPAddr())
	if tokensFile != "" {
		fmt.Fprintf(io.Stdout, "Dev tokens (24h) for %s written to %s\n\n", tokenNames(tokens), tokensFile)
	} else {
		fmt.Fprintf(io.Stdout, "Dev tokens: pass --tokens-file FILE to have them written out.\n\n")
	}
	fmt.Fprintf(io.Stdout, "One-time sign-in links to the approval pages (15 min):\n")
	for _, p := range devPrincipals {
		if p.agent != "" {
			continue
		}
		link, err := page.LoginURL(base, []byte(devSecret.Reveal()), DefaultIssuer, p.user, p.tenant, 15*time.Minute)
		if err != nil {
			return err
		}
		fmt.Fprintf(io.Stdout, "  %-6s %s\n", p.user, link)
	}
	tf := tokensFile
	if tf == "" {
		tf = "TOKENS_FILE"
	}
	fmt.Fprintf(io.Stdout, "\nTry:\n  curl -s -X POST http://%s/v1/commands/ticket.search:execute \\\n    -H \"Authorization: Bearer $(jq -r .alice %s)\" -d '{\"input\":{\"query\":\"charged twice\"}}'\n\nCtrl-C stops it.\n", srv.HTTPAddr(), tf)
	return srv.Run(ctx)
}

// devUsers are the demo users the OAuth consent page offers to sign in as.
func devUsers() []oauth.User {
	var us []oauth.User
	for _, p := range devPrincipals {
		if p.agent == "" {
			us = append(us, oauth.User{Tenant: p.tenant, ID: p.user})
		}
	}
	return us
}

func tokenNames(m map[string]string) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// openAPIHandler serves the generated OpenAPI document of the REST routes.
func openAPIHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(genopenapi.Document)
	})
}
