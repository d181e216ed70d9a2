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

	"google.golang.org/grpc"

	helpmem "github.com/mandate-dev/mandate/examples/helpdesk/memory"
	"github.com/mandate-dev/mandate/examples/policy"
	genopenapi "github.com/mandate-dev/mandate/gen/openapi"
	"github.com/mandate-dev/mandate/internal/cli/auditcmd"
	"github.com/mandate-dev/mandate/internal/cli/catalogcmd"
	"github.com/mandate-dev/mandate/internal/cli/clicore"
	"github.com/mandate-dev/mandate/internal/cli/confirmcmd"
	"github.com/mandate-dev/mandate/internal/cli/executorcmd"
	"github.com/mandate-dev/mandate/internal/cli/helpdeskcmd"
	"github.com/mandate-dev/mandate/internal/cli/mcpbridgecmd"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/oauth"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/server/inprocess"
	auditmem "github.com/mandate-dev/mandate/services/audit/memory"
	confirmmem "github.com/mandate-dev/mandate/services/confirm/memory"
	"github.com/mandate-dev/mandate/services/confirm/page"
	"github.com/mandate-dev/mandate/services/executor"
	execmem "github.com/mandate-dev/mandate/services/executor/memory"
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

// devSettings are the flags of `mandate dev`.
type devSettings struct {
	httpAddr, grpcAddr, tokensFile string
	otlpEndpoint                   string
	devSecret                      config.Secret
	confirmSideEffects, metrics    bool
	auditRetain                    int
	events                         executorcmd.EventsFlags
}

// runDev runs the whole suite in one process on in-memory stores with the
// helpdesk sample and the demo directory.
func runDev(ctx context.Context, args []string, io IO) error {
	var (
		d        devSettings
		logLevel string
	)
	s := config.New("dev", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	s.String(&d.httpAddr, "http-addr", "127.0.0.1:8080", "HTTP: REST, approval pages, /openapi.json, /healthz")
	s.String(&d.grpcAddr, "grpc-addr", "127.0.0.1:9090", "gRPC: every service and the governed proxy")
	s.String(&d.tokensFile, "tokens-file", "", "write the dev tokens (JSON object: name → token) to this file")
	s.String(&logLevel, "log-level", "warn", "debug, info, warn or error")
	s.SecretVar(&d.devSecret, "dev-secret", "HS256 secret for dev tokens (default: random per run)")
	s.Bool(&d.confirmSideEffects, "confirm-side-effects", false, "require confirmation for every command that declares side effects (the executor enforces it, the catalog's tools state it)")
	s.Int(&d.auditRetain, "audit-retain", auditmem.DefaultMaxRows, "audit rows kept per tenant; older ones are evicted (0 keeps every row)")
	s.Check(func() error { return auditcmd.CheckRetain(s, d.auditRetain) })
	clicore.OTLPFlag(s, &d.otlpEndpoint)
	clicore.MetricsFlag(s, &d.metrics)
	d.events.Declare(s)
	if err := s.Parse(args); err != nil {
		return err
	}
	lvl, err := clicore.ParseLevel(logLevel)
	if err != nil {
		return s.Errorf("log-level", "%v", err)
	}
	log := slog.New(slog.NewTextHandler(io.Stderr, &slog.HandlerOptions{Level: lvl}))
	var cl clicore.Closers
	defer cl.Close()
	p, err := startDev(ctx, d, log, io, &cl)
	if err != nil {
		return err
	}
	return p.Run(ctx)
}

// startDev builds the suite, each service with the builder its own command
// uses, connected through the in-process channels of the servers, and
// prints how to reach it. The returned group runs it; what it opened is
// released by cl.
func startDev(ctx context.Context, d devSettings, log *slog.Logger, io IO, cl *clicore.Closers) (*clicore.Group, error) {
	devSecret := d.devSecret
	if !devSecret.Set() {
		devSecret = config.NewSecret(randomHex(32))
	}
	serviceSecret := []byte(randomHex(32))
	metrics, err := clicore.StartTracing(ctx, io, "dev", d.otlpEndpoint, d.metrics, log, cl)
	if err != nil {
		return nil, err
	}

	set, err := manifest.Embedded()
	if err != nil {
		return nil, err
	}
	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{DefaultAudience}, Issuers: []string{DefaultIssuer}, DevSecret: []byte(devSecret.Reveal())})
	if err != nil {
		return nil, err
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{Secret: serviceSecret, Audience: []string{DefaultAudience}, Issuers: []string{DefaultIssuer}})
	if err != nil {
		return nil, err
	}
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services})
	if err != nil {
		return nil, err
	}

	dirStore := dirmem.New()
	if _, err := directory.Apply(ctx, dirStore, policy.Demo, directory.FileName("examples/policy/demo.yaml")); err != nil {
		return nil, err
	}
	dir := directory.NewCache(dirStore, directory.CacheOptions{TTL: time.Minute})
	cl.Add(dir.Close)

	auditStore := auditmem.New(auditmem.Options{MaxRows: d.auditRetain})
	cl.Add(auditStore.Close)
	auditSvc := auditcmd.Build(auditcmd.Deps{Store: auditStore, Directory: dir, Logger: log}, cl)

	confirmStore := confirmmem.New(confirmmem.Options{})
	cl.Add(confirmStore.Close)
	base := "http://" + d.httpAddr
	confirmSvc, err := confirmcmd.Build(confirmcmd.Deps{Store: confirmStore, Sessions: confirmStore, Directory: dir, Manifest: set,
		BaseURL: base, LoginSecret: []byte(devSecret.Reveal()), Issuers: []string{DefaultIssuer}, Logger: log})
	if err != nil {
		return nil, err
	}

	// The helpdesk backend has a server of its own: were it on the public
	// gRPC server, its RPCs would bypass the governed proxy. The executor
	// reaches it through that server's in-process channel.
	helpdeskSvc, err := helpdeskcmd.Build(ctx, helpdeskcmd.Deps{Store: helpmem.New(), Seed: true, Logger: log})
	if err != nil {
		return nil, err
	}
	backendSrv, err := server.New(server.Config{Name: "examples.helpdesk.v1.HelpdeskService", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth, Logger: log})
	if err != nil {
		return nil, err
	}
	helpdeskSvc.Register(backendSrv)
	catalogSvc, err := catalogcmd.Build(catalogcmd.Deps{Manifest: set, Directory: dirStore, ConfirmSideEffects: d.confirmSideEffects, Logger: log}, cl)
	if err != nil {
		return nil, err
	}
	// ops.review is a command: the executor dispatches it to the catalog on
	// the internal server, like any backend.
	catalogSvc.RegisterAPI(backendSrv)

	// The executor reaches audit and confirm through their APIs, in
	// process, on its own service identity, as it does over the network:
	// confirm for the caller it relays, audit on its own authority (its
	// append stream), which their server admits as the audit service's
	// own process does.
	internalAuth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services, AllowServiceOnly: true})
	if err != nil {
		return nil, err
	}
	internalSrv, err := server.New(server.Config{Name: "mandate.internal", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: internalAuth, Logger: log})
	if err != nil {
		return nil, err
	}
	auditSvc.RegisterAPI(internalSrv)
	confirmSvc.RegisterAPI(internalSrv)
	src, err := identity.NewServiceTokenSource(serviceSecret, DefaultIssuer, DefaultAudience, executor.ServiceName, time.Hour)
	if err != nil {
		return nil, err
	}
	internalConn, backendConn := inprocess.Conn(internalSrv, src), inprocess.Conn(backendSrv, src)
	// No embedded broker: events are relayed to --events-url when given.
	execSvc, err := executorcmd.Build(executorcmd.Deps{
		Manifest: set, Directory: dir, Store: execmem.New(execmem.Options{}),
		Audit: internalConn, Confirm: internalConn,
		Backends: map[string]grpc.ClientConnInterface{
			"examples.helpdesk.v1.HelpdeskService": backendConn,
			"mandate.v1.CatalogService":            backendConn,
		},
		ConfirmSideEffects: d.confirmSideEffects, Events: d.events, Logger: log,
	}, cl)
	if err != nil {
		return nil, err
	}
	srv, err := server.New(server.Config{Name: "mandate", GRPCAddr: d.grpcAddr, HTTPAddr: d.httpAddr, Auth: auth, Logger: log, Metrics: metrics, GRPCOptions: execSvc.ServerOptions()})
	if err != nil {
		return nil, err
	}
	execSvc.Register(srv)
	auditSvc.Register(srv)
	confirmSvc.Register(srv)
	catalogSvc.Register(srv) // tool lists and manifest reads; Review refuses calls not relayed by the executor
	// MCP hosts connect by OAuth: discovery, registration, the dev sign-in
	// and consent in the browser; an approved client becomes an
	// interactive agent of its user, with the dev tokens' kind of JWT.
	authServer, err := oauth.New(oauth.Config{Issuer: base, Resource: base + "/mcp", Directory: dirStore, Users: devUsers(),
		TokenSecret: []byte(devSecret.Reveal()), TokenIssuer: DefaultIssuer, TokenAudience: DefaultAudience, Verifier: users,
		LoopbackClientIDs: true, Logger: log})
	if err != nil {
		return nil, err
	}
	for _, p := range authServer.Paths() {
		srv.Handle(p, authServer.Handler())
	}
	// The bridge calls the catalog, the executor and the confirm service
	// through the server's in-process channel, as the separate bridge does
	// over gRPC: with its service token, relaying the caller's. The
	// requestState key of MCP 2026-07-28 confirmations lives as long as
	// the run, like the service secret.
	bridgeSrc, err := identity.NewServiceTokenSource(serviceSecret, DefaultIssuer, DefaultAudience, identity.MCPBridgeService, time.Hour)
	if err != nil {
		return nil, err
	}
	local := inprocess.Conn(srv, bridgeSrc)
	bridgeSvc, err := mcpbridgecmd.Build(mcpbridgecmd.Deps{
		Catalog: local, Executor: local, Confirm: local,
		Manifest: set, Verifier: users,
		ResourceURL: base + "/mcp", AuthorizationServers: []string{authServer.Issuer()}, SessionTimeout: time.Hour, Logger: log,
		StateKey: []byte(randomHex(32))}, cl)
	if err != nil {
		return nil, err
	}
	bridgeSvc.Register(srv)
	srv.Handle("GET /openapi.json", openAPIHandler())

	tokens := map[string]string{}
	for _, p := range devPrincipals {
		tok, err := identity.MintDev([]byte(devSecret.Reveal()), identity.MintRequest{Issuer: DefaultIssuer, Audience: DefaultAudience,
			User: p.user, Tenant: p.tenant, Org: p.org, Agent: p.agent, Model: p.model, TTL: 24 * time.Hour, Now: time.Now()})
		if err != nil {
			return nil, err
		}
		tokens[p.name] = tok
	}
	if d.tokensFile != "" {
		b, _ := json.MarshalIndent(tokens, "", "  ")
		if err := os.WriteFile(d.tokensFile, append(b, '\n'), 0o600); err != nil {
			return nil, fmt.Errorf("--tokens-file: %w", err)
		}
	}

	var p clicore.Group
	auditSvc.Start(&p)
	execSvc.Start(&p)
	bridgeSvc.Start(&p)
	p.Serve(backendSrv.Run)
	p.Serve(internalSrv.Run)
	p.Serve(srv.Run)

	fmt.Fprintf(io.Stdout, "Mandate dev: the whole suite in one process on in-memory stores (nothing is kept).\n\n")
	fmt.Fprintf(io.Stdout, "  MCP       http://%s/mcp   (Streamable HTTP, bearer token)\n", srv.HTTPAddr())
	fmt.Fprintf(io.Stdout, "  REST      http://%s/v1/commands/{code}:execute   (also /v1/catalog/…, /v1/audit/…, /v1/challenges/…)\n", srv.HTTPAddr())
	fmt.Fprintf(io.Stdout, "  gRPC      %s   (ExecutorService, CatalogService, AuditService, ConfirmService, and the governed HelpdeskService proxy)\n", srv.GRPCAddr())
	fmt.Fprintf(io.Stdout, "  approvals http://%s/approve/{challenge}\n", srv.HTTPAddr())
	fmt.Fprintf(io.Stdout, "  OAuth     %s   (MCP hosts: browser sign-in and consent; no token to copy)\n", authServer.Issuer()+"/.well-known/oauth-authorization-server")
	fmt.Fprintf(io.Stdout, "  OpenAPI   http://%s/openapi.json   health http://%s/healthz\n\n", srv.HTTPAddr(), srv.HTTPAddr())
	if d.tokensFile != "" {
		fmt.Fprintf(io.Stdout, "Dev tokens (24h) for %s written to %s\n\n", tokenNames(tokens), d.tokensFile)
	} else {
		fmt.Fprintf(io.Stdout, "Dev tokens: pass --tokens-file FILE to have them written out.\n\n")
	}
	fmt.Fprintf(io.Stdout, "One-time sign-in links to the approval pages (15 min):\n")
	for _, pr := range devPrincipals {
		if pr.agent != "" {
			continue
		}
		link, err := page.LoginURL(base, []byte(devSecret.Reveal()), DefaultIssuer, pr.user, pr.tenant, 15*time.Minute)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(io.Stdout, "  %-6s %s\n", pr.user, link)
	}
	tf := d.tokensFile
	if tf == "" {
		tf = "TOKENS_FILE"
	}
	fmt.Fprintf(io.Stdout, "\nTry:\n  curl -s -X POST http://%s/v1/commands/ticket.search:execute \\\n    -H \"Authorization: Bearer $(jq -r .alice %s)\" -d '{\"input\":{\"query\":\"charged twice\"}}'\n\nCtrl-C stops it.\n", srv.HTTPAddr(), tf)
	return &p, nil
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
