package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"

	helpmem "github.com/mandate-dev/mandate/examples/helpdesk/memory"
	"github.com/mandate-dev/mandate/examples/policy"
	"github.com/mandate-dev/mandate/internal/app/auditcmd"
	"github.com/mandate-dev/mandate/internal/app/catalogcmd"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/app/confirmcmd"
	"github.com/mandate-dev/mandate/internal/app/executorcmd"
	"github.com/mandate-dev/mandate/internal/app/helpdeskcmd"
	"github.com/mandate-dev/mandate/internal/app/mcpbridgecmd"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/manifestcheck"
	"github.com/mandate-dev/mandate/internal/oauth"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/server/inprocess"
	auditmem "github.com/mandate-dev/mandate/services/audit/memory"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmmem "github.com/mandate-dev/mandate/services/confirm/memory"
	"github.com/mandate-dev/mandate/services/confirm/page"
	"github.com/mandate-dev/mandate/services/executor"
	execmem "github.com/mandate-dev/mandate/services/executor/memory"
)

// devPrincipal is a user or agent `mandate dev` writes a token for.
type devPrincipal struct{ name, tenant, org, user, agent, model string }

// devPrincipals are the active users and agents of the policy, in its
// order: a user is named by its id, an agent as agent@user, each prefixed
// with "tenant/" when the name is taken in an earlier tenant. Tokens carry
// the user's org, by which backends scope.
func devPrincipals(pol directory.Policy) []devPrincipal {
	var out []devPrincipal
	taken := map[string]bool{}
	add := func(p devPrincipal) {
		if taken[p.name] {
			p.name = p.tenant + "/" + p.name
		}
		taken[p.name] = true
		out = append(out, p)
	}
	for _, snap := range pol.Tenants {
		orgs := map[string]string{}
		for _, u := range snap.Users {
			if u.Disabled {
				continue
			}
			orgs[u.ID] = u.Org
			add(devPrincipal{name: u.ID, tenant: snap.Tenant.ID, org: u.Org, user: u.ID})
		}
		for _, a := range snap.Agents {
			org, ok := orgs[a.UserID]
			if a.Disabled || !ok {
				continue
			}
			add(devPrincipal{name: a.ID + "@" + a.UserID, tenant: snap.Tenant.ID, org: org, user: a.UserID, agent: a.ID, model: "dev-model"})
		}
	}
	return out
}

// devSettings are the flags of `mandate dev`.
type devSettings struct {
	httpAddr, grpcAddr, tokensFile string
	otlpEndpoint                   string
	devSecret, serviceSecret       config.Secret
	confirmSideEffects, metrics    bool
	auditRetain                    int
	// webhook is --webhook-url and --webhook-secret
	// (confirmcmd.DeclareWebhook); nil: none.
	webhook *confirm.WebhookConfig
	events  executorcmd.EventsFlags
	// edge limits each principal's REST and MCP requests.
	edge clicore.EdgeFlags
	// manifest is the deployment's own manifest; none given: the sample.
	manifest clicore.ManifestFlags
	// backends are the addresses of the adopter's backends by proto
	// service; policyFile replaces the demo directory.
	backends   []string
	policyFile string
}

// runDev runs the whole suite in one process on in-memory stores: the
// helpdesk sample and the demo directory, or a deployment's own manifest,
// backends and policy (--manifest, --descriptors, --backend, --policy).
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
	s.SecretVar(&d.serviceSecret, "service-secret", "HS256 secret of the service tokens with which the executor relays calls to the backends, "+
		"for an external --backend to verify (default: random per run)")
	d.manifest.DeclareOptional(s)
	s.Strings(&d.backends, "backend", nil, "backend per proto service, for the commands of --manifest: pkg.v1.Service=host:port "+
		"(default: the helpdesk sample in process; the catalog's own commands are always served in process)")
	s.String(&d.policyFile, "policy", "", "policy YAML loaded into the in-memory directory; dev tokens are written for its users and agents (default: examples/policy/demo.yaml)")
	s.Check(func() error {
		if _, err := executorcmd.ParseBackends(d.backends); err != nil {
			return s.Errorf("backend", "%v", err)
		}
		return nil
	})
	s.Bool(&d.confirmSideEffects, "confirm-side-effects", false, "require confirmation for every command that declares side effects (the executor enforces it, the catalog's tools state it)")
	s.Int(&d.auditRetain, "audit-retain", auditmem.DefaultMaxRows, "audit rows kept per tenant; older ones are evicted (0 keeps every row)")
	d.webhook = confirmcmd.DeclareWebhook(s)
	s.Check(func() error { return auditcmd.CheckRetain(s, d.auditRetain) })
	clicore.OTLPFlag(s, &d.otlpEndpoint)
	clicore.MetricsFlag(s, &d.metrics)
	d.events.Declare(s)
	d.edge.Declare(s, "REST and MCP (each its own bucket)")
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
	serviceSecret := []byte(d.serviceSecret.Reveal())
	if !d.serviceSecret.Set() {
		serviceSecret = []byte(randomHex(32))
	}
	metrics, err := clicore.StartTracing(ctx, io, "dev", d.otlpEndpoint, d.metrics, log, cl)
	if err != nil {
		return nil, err
	}

	set, err := manifest.Embedded()
	if d.manifest.Given() {
		set, err = d.manifest.Load()
	}
	if err != nil {
		return nil, err
	}
	external, err := executorcmd.ParseBackends(d.backends)
	if err != nil {
		return nil, fmt.Errorf("--backend: %w", err)
	}
	if _, ok := external[catalogService]; ok {
		return nil, fmt.Errorf("--backend: %s (ops.review) is served in process", catalogService)
	}
	// The helpdesk sample runs in process for the sample's commands unless
	// --backend names an external one.
	_, helpdeskExternal := external[helpdeskService]
	inProcessHelpdesk := set.IsSample() && !helpdeskExternal
	known := map[string]string{catalogService: "in process"}
	for svc, addr := range external {
		known[svc] = addr
	}
	if inProcessHelpdesk {
		known[helpdeskService] = "in process"
	}
	if err := executorcmd.CheckBackends(set, known); err != nil {
		return nil, err
	}
	policyName, policySrc := "examples/policy/demo.yaml", policy.Demo
	if d.policyFile != "" {
		if policySrc, err = os.ReadFile(d.policyFile); err != nil {
			return nil, fmt.Errorf("--policy: %w", err)
		}
		policyName = d.policyFile
	}
	pol, err := directory.ParsePolicy(policyName, policySrc)
	if err != nil {
		return nil, err
	}
	principals := devPrincipals(pol)
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
	if _, err := directory.ApplyPolicy(ctx, dirStore, pol); err != nil {
		return nil, err
	}
	dir := directory.NewCache(dirStore, directory.CacheOptions{TTL: time.Minute})
	cl.Add(dir.Close)

	auditStore := auditmem.New(auditmem.Options{MaxRows: d.auditRetain})
	cl.Add(auditStore.Close)
	auditSvc := auditcmd.Build(auditcmd.Deps{Store: auditStore, Directory: dir, Logger: log}, cl)

	// The executor reaches audit and confirm through their APIs, in
	// process, on its own service identity, as it does over the network:
	// confirm for the caller it relays, audit on its own authority (its
	// append stream), which their server admits as the audit service's
	// own process does. The confirm service appends its decision rows
	// there too, on its own service identity.
	internalAuth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services, AllowServiceOnly: true})
	if err != nil {
		return nil, err
	}
	internalSrv, err := server.New(server.Config{Name: "mandate.internal", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: internalAuth, Logger: log})
	if err != nil {
		return nil, err
	}

	confirmStore := confirmmem.New(confirmmem.Options{})
	cl.Add(confirmStore.Close)
	base := "http://" + d.httpAddr
	confirmSrc, err := identity.NewServiceTokenSource(serviceSecret, DefaultIssuer, DefaultAudience, identity.ConfirmService, time.Hour)
	if err != nil {
		return nil, err
	}
	var webhook confirm.WebhookConfig
	if d.webhook != nil {
		webhook = *d.webhook
	}
	confirmSvc, err := confirmcmd.Build(confirmcmd.Deps{Store: confirmStore, Sessions: confirmStore, Directory: dir, Manifest: set,
		BaseURL: base, LoginSecret: []byte(devSecret.Reveal()), Issuers: []string{DefaultIssuer},
		Audit: manifestConn(internalSrv, confirmSrc, set.Digest()), TokenAudience: DefaultAudience, Webhook: webhook, Logger: log})
	if err != nil {
		return nil, err
	}

	// The in-process backends (the helpdesk sample, the catalog's
	// ops.review) have a server of their own: were they on the public gRPC
	// server, their RPCs would bypass the governed proxy. The executor
	// reaches them through that server's in-process channel.
	backendSrv, err := server.New(server.Config{Name: "mandate.backends", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth, Logger: log})
	if err != nil {
		return nil, err
	}
	if inProcessHelpdesk {
		helpdeskSvc, err := helpdeskcmd.Build(ctx, helpdeskcmd.Deps{Store: helpmem.New(), Seed: true, Logger: log})
		if err != nil {
			return nil, err
		}
		helpdeskSvc.Register(backendSrv)
	}
	catalogSvc, err := catalogcmd.Build(catalogcmd.Deps{Manifest: set, Directory: dirStore, ConfirmSideEffects: d.confirmSideEffects, Logger: log}, cl)
	if err != nil {
		return nil, err
	}
	// ops.review is a command: the executor dispatches it to the catalog on
	// the internal server, like any backend.
	catalogSvc.RegisterAPI(backendSrv)

	auditSvc.RegisterAPI(internalSrv)
	confirmSvc.RegisterAPI(internalSrv)
	src, err := identity.NewServiceTokenSource(serviceSecret, DefaultIssuer, DefaultAudience, executor.ServiceName, time.Hour)
	if err != nil {
		return nil, err
	}
	// Every connection states the manifest, as the separate services'
	// do (manifestcheck).
	internalConn := manifestConn(internalSrv, src, set.Digest())
	backendConn := manifestConn(backendSrv, src, set.Digest())
	backends := map[string]grpc.ClientConnInterface{catalogService: backendConn}
	if inProcessHelpdesk {
		backends[helpdeskService] = backendConn
	}
	// The deployment's own backends, run apart from the process.
	dial := clicore.NewDialer(src, set.Digest(), 0, cl)
	for svc, addr := range external {
		if backends[svc], err = dial.Backend(addr); err != nil {
			return nil, err
		}
	}
	// No embedded broker: events are relayed to --events-url when given.
	execSvc, err := executorcmd.Build(executorcmd.Deps{
		Manifest: set, Directory: dir, Store: execmem.New(execmem.Options{}),
		Audit: internalConn, Confirm: internalConn,
		Backends:           backends,
		ConfirmSideEffects: d.confirmSideEffects, Events: d.events, Edge: d.edge, Logger: log,
		// They share its server: its /openapi.json describes them too.
		RESTServices: []string{"mandate.v1.CatalogService", "mandate.v1.AuditService", "mandate.v1.ConfirmService"},
	}, cl)
	if err != nil {
		return nil, err
	}
	limit, refusals := execSvc.Edge()
	srv, err := server.New(server.Config{Name: "mandate", GRPCAddr: d.grpcAddr, HTTPAddr: d.httpAddr, Auth: auth, Logger: log, Metrics: metrics,
		GRPCOptions: execSvc.ServerOptions(), ProxiedMethod: executorcmd.ProxiedMethod(set), ManifestDigest: set.Digest(),
		EdgeLimit: limit, EdgeRecorder: refusals})
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
	authServer, err := oauth.New(oauth.Config{Issuer: base, Resource: base + "/mcp", Directory: dirStore, Users: devUsers(principals),
		TokenSecret: []byte(devSecret.Reveal()), TokenIssuer: DefaultIssuer, TokenAudience: DefaultAudience, Verifier: users,
		LoopbackDev: loopbackListen(d.httpAddr), Logger: log})
	if err != nil {
		return nil, err
	}
	for _, p := range authServer.Paths() {
		srv.Handle(p, authServer.Handler())
	}
	srv.Handle("GET "+DevSignInPath, devSignIn(base, []byte(devSecret.Reveal()), principals))
	// The bridge calls the catalog, the executor and the confirm service
	// through the server's in-process channel, as the separate bridge does
	// over gRPC: with its service token, relaying the caller's. The
	// requestState key of MCP 2026-07-28 confirmations lives as long as
	// the run, like the service secret.
	bridgeSrc, err := identity.NewServiceTokenSource(serviceSecret, DefaultIssuer, DefaultAudience, identity.MCPBridgeService, time.Hour)
	if err != nil {
		return nil, err
	}
	local := manifestConn(srv, bridgeSrc, set.Digest())
	bridgeSvc, err := mcpbridgecmd.Build(mcpbridgecmd.Deps{
		Catalog: local, Executor: local, Confirm: local,
		Manifest: set, Verifier: users,
		ResourceURL: base + "/mcp", AuthorizationServers: []string{authServer.Issuer()}, SessionTimeout: time.Hour, Logger: log,
		StateKey: []byte(randomHex(32)), Edge: d.edge, Audit: local}, cl)
	if err != nil {
		return nil, err
	}
	bridgeSvc.Register(srv)

	tokens := map[string]string{}
	for _, p := range principals {
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
	confirmSvc.Start(&p)
	bridgeSvc.Start(&p)
	p.Serve(backendSrv.Run)
	p.Serve(internalSrv.Run)
	p.Serve(srv.Run)

	fmt.Fprintf(io.Stdout, "Mandate dev: the whole suite in one process on in-memory stores (nothing is kept).\n")
	what := "the helpdesk sample"
	if !set.IsSample() {
		what = "manifest " + set.Digest()
	}
	fmt.Fprintf(io.Stdout, "Serving %s; policy %s.\n", what, policyName)
	for _, svc := range sortedKeys(known) {
		fmt.Fprintf(io.Stdout, "  backend %s: %s\n", svc, known[svc])
	}
	fmt.Fprintln(io.Stdout)
	fmt.Fprintf(io.Stdout, "  MCP       http://%s/mcp   (Streamable HTTP, bearer token)\n", srv.HTTPAddr())
	fmt.Fprintf(io.Stdout, "  REST      http://%s/v1/commands/{code}:execute   (also /v1/catalog/…, /v1/audit/…, /v1/challenges/…)\n", srv.HTTPAddr())
	fmt.Fprintf(io.Stdout, "  gRPC      %s   (ExecutorService, CatalogService, AuditService, ConfirmService, and the governed proxy of the backends)\n", srv.GRPCAddr())
	fmt.Fprintf(io.Stdout, "  approvals http://%s/approve/{challenge}\n", srv.HTTPAddr())
	fmt.Fprintf(io.Stdout, "  audit     http://%s%s   (the trail, for users holding %s; sign in with a link below)\n", srv.HTTPAddr(), page.TrailPath, page.ReadTrailPermission)
	fmt.Fprintf(io.Stdout, "  OAuth     %s   (MCP hosts: browser sign-in and consent; no token to copy)\n", authServer.Issuer()+"/.well-known/oauth-authorization-server")
	fmt.Fprintf(io.Stdout, "  OpenAPI   http://%s/openapi.json   health http://%s/healthz\n\n", srv.HTTPAddr(), srv.HTTPAddr())
	if d.tokensFile != "" {
		fmt.Fprintf(io.Stdout, "Dev tokens (24h) for %s written to %s\n\n", tokenNames(tokens), d.tokensFile)
	} else {
		fmt.Fprintf(io.Stdout, "Dev tokens: pass --tokens-file FILE to have them written out.\n\n")
	}
	fmt.Fprintf(io.Stdout, "One-time sign-in links to the approval pages (15 min):\n")
	for _, pr := range principals {
		if pr.agent != "" {
			continue
		}
		link, err := page.LoginURL(base, []byte(devSecret.Reveal()), DefaultIssuer, pr.user, pr.tenant, 15*time.Minute)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(io.Stdout, "  %-6s %s\n", pr.user, link)
	}
	fmt.Fprintf(io.Stdout, "Used or expired? Fresh ones at %s%s (this machine only).\n", base, DevSignInPath)
	if !set.IsSample() {
		fmt.Fprintf(io.Stdout, "\nCall a command: POST http://%s/v1/commands/{code}:execute {\"input\":{…}}\n\nCtrl-C stops it.\n", srv.HTTPAddr())
		return &p, nil
	}
	tf := d.tokensFile
	if tf == "" {
		tf = "TOKENS_FILE"
	}
	fmt.Fprintf(io.Stdout, "\nTry:\n  curl -s -X POST http://%s/v1/commands/ticket.search:execute \\\n    -H \"Authorization: Bearer $(jq -r .alice %s)\" -d '{\"input\":{\"query\":\"charged twice\"}}'\n\nCtrl-C stops it.\n", srv.HTTPAddr(), tf)
	return &p, nil
}

// The proto services `mandate dev` can serve in process.
const (
	catalogService  = "mandate.v1.CatalogService"
	helpdeskService = "examples.helpdesk.v1.HelpdeskService"
)

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// devUsers are the users the OAuth consent page offers to sign in as.
func devUsers(principals []devPrincipal) []oauth.User {
	var us []oauth.User
	for _, p := range principals {
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

// manifestConn is an in-process channel of `mandate dev` to srv, on src's
// credential, on which every call sends the manifest digest, as the
// services' dialers do: set with the credential, in one copy of the
// outgoing metadata.
func manifestConn(srv *server.Server, src identity.TokenSource, digest string) grpc.ClientConnInterface {
	return inprocess.Conn(srv, src, identity.Header{Key: manifestcheck.Header, Value: digest})
}

// loopbackListen reports whether addr (host:port) listens on this machine
// only. Then the OAuth server may fetch client ID metadata documents from
// loopback addresses, as a host under development serves them; listening
// on any other address, it fetches from public ones only, so that whoever
// reaches it cannot make it fetch from the machine or its network.
func loopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
