package tests

// A production identity provider in front of Mandate (issue 30): Ory Hydra
// v2.3.0, built from the Go module proxy through tools/hydra/go.mod, on a
// Postgres database of its own, with a login and consent app written here.
// The suite runs as separate processes that trust Hydra through
// --oidc-issuer, and an MCP host (the official TypeScript SDK's OAuth
// client) finds Hydra from the bridge, registers there, gets a JWT access
// token and calls a tool. docs/identity.md describes the same set-up for
// operators.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

// idpUser is the directory user (examples/policy/demo.yaml) the login app
// signs in: alice of acme, in the support org, whose agent is support-bot.
var idpUser = struct{ tenant, user, org string }{"acme", "alice", "support"}

// TestProductionIdP: Mandate behind Ory Hydra, end to end.
//   - The bridge's RFC 9728 metadata names Hydra's issuer (the default
//     for --authorization-server is --oidc-issuer).
//   - The TypeScript SDK's OAuth client discovers Hydra, registers with it
//     (RFC 7591), is sent through the login and consent app, and exchanges
//     the code at Hydra for a JWT access token whose `aud` is the MCP
//     endpoint it named as `resource` (RFC 8707).
//   - The bridge, the catalog and the executor verify that token against
//     Hydra's JWKS (from its discovery document): the host lists alice's
//     tools and its search executes, audited as alice's support-bot.
//   - A token naming an agent the directory does not know lists no tools,
//     and its call is refused with authorization.principal_inactive at the
//     authenticate stage (agent.not_registered); the refusal is in the
//     audit trail.
//
// It needs Postgres, node with tests/node's dependencies, and Hydra built
// from the Go module proxy (or the module cache). Without node, or when
// Hydra cannot be built for want of the network, it skips, unless
// MANDATE_REQUIRE_NODE=1 or MANDATE_REQUIRE_IDP=1 (CI sets both).
func TestProductionIdP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Hydra and the binary, runs the services, Hydra and node")
	}
	started := time.Now()
	node := nodeOrSkip(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	hydraBin := hydraBinary(t, root)

	// The login and consent app, then Hydra, whose configuration names
	// the app; the app learns Hydra's admin address once Hydra is up.
	app := &idpApp{agents: map[string]string{
		// The operator's table of which agent each MCP host is for
		// alice. "Ghost host" names an agent the directory has never had.
		"Support host": "support-bot",
		"Ghost host":   "ghost-bot",
	}}
	appSrv := httptest.NewServer(app)
	t.Cleanup(appSrv.Close)
	_, hydraDSN := pgtest.NewURL(t)
	front := &registrationFront{}
	frontSrv := httptest.NewServer(front)
	t.Cleanup(frontSrv.Close)
	hydra := startHydra(t, hydraBin, hydraDSN, frontSrv.URL, appSrv.URL)
	front.setBackend(t, hydra.public)
	app.setAdmin(hydra.admin)

	// Every service trusts Hydra next to the dev issuer (the harness's own
	// tokens, e.g. the auditor's, still use it); every service accepts the
	// MCP endpoint's URL as an audience, because the bridge relays the
	// host's token to the catalog and the executor, which check it again.
	bridgeAddr := freePort(t)
	resource := "http://" + bridgeAddr + "/mcp"
	tp := newTopology(t, topologyOptions{noServices: true, env: []string{
		"MANDATE_OIDC_ISSUER=" + hydra.issuer,
		"MANDATE_ISSUER=mandate-dev," + hydra.issuer,
		"MANDATE_AUDIENCE=mandate," + resource,
	}})
	tp.startAll(spec{name: "audit"}, spec{name: "helpdesk"}, spec{name: "catalog"})
	tp.startAll(spec{name: "confirm", args: []string{"--audit-addr", tp.addr["audit"].grpc}})
	tp.startAll(spec{name: "executor", args: tp.executorArgs()})
	bridgeLog, err := os.Create(filepath.Join(tp.logDir, "mcpbridge.log"))
	if err != nil {
		t.Fatal(err)
	}
	tp.spawn("mcpbridge", exec.Command(tp.bin, "mcpbridge", "--grpc-addr", freePort(t), "--http-addr", bridgeAddr,
		"--advertise-url", "http://"+bridgeAddr,
		"--executor-addr", tp.addr["executor"].grpc,
		"--catalog-addr", tp.addr["catalog"].grpc,
		"--confirm-addr", tp.addr["confirm"].grpc), bridgeLog)
	waitHealthy(t, "http://"+bridgeAddr+"/healthz", func() string { return tp.logOf("mcpbridge") })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- hydra log ---\n%s", tail(hydra.log(), 6000))
		}
	})

	// The tp helpers fail the test they were made with, so the steps below
	// are not subtests.

	// The protected-resource metadata names Hydra.
	md := protectedResourceMetadata(t, resource)
	if md.Resource != resource || !slices.Equal(md.AuthorizationServers, []string{hydra.issuer}) {
		t.Fatalf("metadata %+v, want resource %s and authorization server %s", md, resource, hydra.issuer)
	}

	// The host registers at Hydra, gets a JWT there, lists and calls.
	{
		out := runIdPHost(t, node, resource, "Support host")
		front.mu.Lock()
		dropped := slices.Sorted(slices.Values(front.dropped))
		front.mu.Unlock()
		t.Logf("the front dropped from Hydra's registration responses: %v", slices.Compact(dropped))
		// Discovery, registration and the token came from Hydra.
		hydraHost := strings.TrimPrefix(hydra.issuer, "http://")
		if out.AuthorizationServer != hydra.issuer && out.AuthorizationServer != hydra.issuer+"/" {
			t.Errorf("the SDK's authorization server %q, want %s", out.AuthorizationServer, hydra.issuer)
		}
		for _, want := range []struct{ method, path string }{
			{"POST", "/oauth2/register"}, {"POST", "/oauth2/token"},
		} {
			if !slices.ContainsFunc(out.Requests, func(r idpRequest) bool {
				return r.Host == hydraHost && r.Method == want.method && r.Path == want.path && r.Status/100 == 2
			}) {
				t.Errorf("no successful %s %s at Hydra among %+v", want.method, want.path, out.Requests)
			}
		}
		if out.ClientID == "" || !slices.Contains(app.clientsSeen(), out.ClientID) {
			t.Errorf("registered client %q never reached the consent app (%v)", out.ClientID, app.clientsSeen())
		}
		// Hydra's JWT: its issuer, the MCP endpoint as audience, and the
		// claims Mandate maps to the directory's user and agent.
		c := out.Claims
		if c.Iss != hydra.issuer || !slices.Equal(c.Aud, []string{resource}) || c.Sub != idpUser.user ||
			c.Tenant != idpUser.tenant || c.Org != idpUser.org || c.Act.Sub != "support-bot" || c.ClientID != out.ClientID {
			t.Fatalf("access token claims %+v", c)
		}
		if out.ConnectError != nil || out.ListError != nil || out.CallError != nil {
			t.Fatalf("connect %v, list %v, call %v", out.ConnectError, out.ListError, out.CallError)
		}
		if !slices.Equal(out.Tools, aliceTools) {
			t.Errorf("tools %v, want alice's %v", out.Tools, aliceTools)
		}
		if out.Call.IsError || !strings.Contains(string(out.Call.StructuredContent), `"T-1001"`) {
			t.Fatalf("ticket.search: %s", out.Raw)
		}
		// The executor read the same token: the trail has alice's
		// support-bot, which only the token says.
		var inv string
		_ = json.Unmarshal(out.Call.Meta["mandate.dev/invocation_id"], &inv)
		if inv == "" {
			t.Fatalf("no invocation id: %s", out.Raw)
		}
		rows := tp.invocationRows(inv, 2)
		if r := rows[1]; r.GetOutcome() != "executed" || r.GetTenant() != idpUser.tenant || r.GetUserId() != idpUser.user ||
			r.GetAgentId() != "support-bot" || r.GetChannel() != "mcp" {
			t.Fatalf("audit row %v", r)
		}
	}

	// A token naming an agent the directory does not know is refused, and
	// the refusal is audited.
	{
		out := runIdPHost(t, node, resource, "Ghost host")
		if out.Claims.Act.Sub != "ghost-bot" || out.Claims.Sub != idpUser.user {
			t.Fatalf("access token claims %+v", out.Claims)
		}
		if out.ConnectError != nil {
			t.Fatalf("connect: %v", out.ConnectError)
		}
		// The catalog shows an inactive principal no tools, by design (a
		// session must show nothing, not fail); a call is refused by the
		// executor, which audits it.
		if out.ListError != nil || len(out.Tools) != 0 {
			t.Errorf("tools/list for an unknown agent: %v, %v", out.Tools, out.ListError)
		}
		if out.CallError != nil {
			t.Fatalf("tools/call: %v", out.CallError)
		}
		ref := out.Call.refusal(t)
		if ref.Code != failure.CodeAuthorizationPrincipalInactive || ref.Stage != failure.StageAuthenticate || ref.InvocationID == "" {
			t.Fatalf("refusal %+v", ref)
		}
		rows := tp.invocationRows(ref.InvocationID, 1)
		if r := rows[0]; r.GetOutcome() != "refused" || r.GetCode() != failure.CodeAuthorizationPrincipalInactive ||
			r.GetStage() != failure.StageAuthenticate || r.GetAgentId() != "ghost-bot" || r.GetUserId() != idpUser.user ||
			!strings.Contains(r.GetMessage(), "agent.not_registered") {
			t.Fatalf("audit row %v", r)
		}
	}
	t.Logf("production IdP test: %s in all", time.Since(started).Round(time.Millisecond))
}

// hydraNetwork marks a go command that failed for want of the network (or
// of a module cache that could stand in for it).
var hydraNetwork = regexp.MustCompile(`dial tcp|no such host|connection refused|i/o timeout|GOPROXY=off|module lookup disabled|GOFLAGS=-mod=mod|TLS handshake`)

// hydraBinary builds Hydra with `go tool -n`, which keeps the linked
// executable in GOCACHE, so a warm cache gives it back in about two
// seconds. A build that fails for want of the network skips the test
// unless MANDATE_REQUIRE_IDP=1; any other failure is a broken
// tools/hydra/go.mod and fails it.
func hydraBinary(t *testing.T, root string) string {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("go", "tool", "-modfile="+filepath.Join(root, "tools", "hydra", "go.mod"), "-n", "hydra")
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	bin := strings.TrimSpace(string(out))
	if err == nil && bin != "" {
		t.Logf("hydra built (or found in GOCACHE) in %s", time.Since(start).Round(time.Millisecond))
		return bin
	}
	why := fmt.Sprintf("cannot build Hydra (go tool -modfile=tools/hydra/go.mod -n hydra): %v\n%s", err, stderr.String())
	switch {
	case os.Getenv("MANDATE_REQUIRE_IDP") == "1":
		t.Fatal("MANDATE_REQUIRE_IDP=1 but " + why)
	case hydraNetwork.MatchString(stderr.String()):
		t.Skip(why)
	default:
		t.Fatal(why)
	}
	return ""
}

// hydraProcess is a running `hydra serve all`.
type hydraProcess struct {
	// issuer is the public URL hosts use (the front); public is where
	// Hydra's own public listener is, admin its admin API.
	issuer, public, admin string
	log                   func() string
}

// startHydra migrates dsn and runs Hydra on two loopback ports, reached
// by hosts through issuer (the front), with JWT
// access tokens, dynamic client registration, the login and consent app at
// appURL, and the claims Mandate reads (tenant, org, act) lifted to the top
// level of the access token. It returns once Hydra is ready and has its
// signing keys, and stops it (SIGTERM, which it must answer with a clean
// exit) when the test ends.
//
// --dev lets the issuer be plain http on loopback; a deployment runs Hydra
// behind TLS without it.
func startHydra(t *testing.T, bin, dsn, issuer, appURL string) *hydraProcess {
	t.Helper()
	dir := t.TempDir()
	public, admin := freePort(t), freePort(t)
	split := func(addr string) (string, string) {
		h, p, _ := strings.Cut(addr, ":")
		return h, p
	}
	pubHost, pubPort := split(public)
	admHost, admPort := split(admin)
	config := fmt.Sprintf(`serve:
  public: {host: %s, port: %s}
  admin: {host: %s, port: %s}
urls:
  self: {issuer: %q}
  login: %q
  consent: %q
  error: %q
strategies:
  access_token: jwt
oidc:
  dynamic_client_registration:
    enabled: true
webfinger:
  oidc_discovery:
    client_registration_url: %q
oauth2:
  allowed_top_level_claims: [tenant, org, act]
  mirror_top_level_claims: false
secrets:
  system: [%q]
log:
  level: info
  leak_sensitive_values: false
`, pubHost, pubPort, admHost, admPort, issuer, appURL+"/login", appURL+"/consent", appURL+"/error",
		issuer+"/oauth2/register", rand.Text())
	cfgPath := filepath.Join(dir, "hydra.yml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "DSN="+dsn)
	migrate := exec.Command(bin, "migrate", "sql", "up", "--read-from-env", "--yes")
	migrate.Env = env
	if out, err := migrate.CombinedOutput(); err != nil {
		t.Fatalf("hydra migrate sql up: %v\n%s", err, tail(string(out), 4000))
	}

	logPath := filepath.Join(dir, "hydra.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "all", "--dev", "--sqa-opt-out", "--config", cfgPath)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	h := &hydraProcess{issuer: issuer, public: "http://" + public, admin: "http://" + admin, log: func() string {
		b, _ := os.ReadFile(logPath)
		return string(b)
	}}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("hydra did not stop cleanly: %v", err)
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("hydra did not stop within 20s (killed: %v)", <-done)
		}
		_ = logFile.Close()
	})

	deadline := time.Now().Add(60 * time.Second)
	client := &http.Client{Timeout: 5 * time.Second}
	for {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("hydra exited before it became ready (%v):\n%s", err, tail(h.log(), 4000))
		default:
		}
		resp, err := client.Get(h.admin + "/health/ready")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("hydra never became ready:\n%s", tail(h.log(), 4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Hydra creates its signing keys on the first JWKS request; asking now
	// means the services find the access-token key at start-up. Two RSA
	// key pairs take seconds to make on a busy machine.
	slow := &http.Client{Timeout: 90 * time.Second}
	resp, err := slow.Get(h.public + "/.well-known/jwks.json")
	if err != nil {
		t.Fatal(err)
	}
	var jwks struct{ Keys []json.RawMessage }
	err = json.NewDecoder(resp.Body).Decode(&jwks)
	_ = resp.Body.Close()
	if err != nil || len(jwks.Keys) < 2 {
		t.Fatalf("hydra's JWKS: %v, %d keys (want the ID token's and the access token's)", err, len(jwks.Keys))
	}
	var discovery struct {
		Issuer               string `json:"issuer"`
		RegistrationEndpoint string `json:"registration_endpoint"`
	}
	resp, err = client.Get(h.public + "/.well-known/openid-configuration")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&discovery)
	_ = resp.Body.Close()
	if err != nil || discovery.Issuer != issuer || discovery.RegistrationEndpoint != issuer+"/oauth2/register" {
		t.Fatalf("hydra's discovery document: %v, %+v", err, discovery)
	}
	return h
}

// registrationFront is the reverse proxy hosts reach Hydra's public API
// through, as a deployment's ingress would be. It exists for one gap of
// Hydra v2.3.0: its registration responses carry every unset optional
// field, as "client_uri": "" and "contacts": null, and the TypeScript SDK
// (1.32) validates the response strictly and refuses both, so no SDK host
// could register (ory/hydra#4044, #4116; modelcontextprotocol/
// typescript-sdk#543). The front drops null and empty-string members from
// the JSON answers of /oauth2/register and passes everything else through
// untouched. docs/identity.md tells operators the same.
type registrationFront struct {
	mu      sync.Mutex
	proxy   *httputil.ReverseProxy
	dropped []string // the members it removed, for the test's log
}

func (f *registrationFront) setBackend(t *testing.T, public string) {
	t.Helper()
	u, err := url.Parse(public)
	if err != nil {
		t.Fatal(err)
	}
	p := httputil.NewSingleHostReverseProxy(u)
	p.ModifyResponse = f.clean
	f.mu.Lock()
	defer f.mu.Unlock()
	f.proxy = p
}

func (f *registrationFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	p := f.proxy
	f.mu.Unlock()
	if p == nil {
		http.Error(w, "hydra is not up yet", http.StatusServiceUnavailable)
		return
	}
	p.ServeHTTP(w, r)
}

func (f *registrationFront) clean(resp *http.Response) error {
	if !strings.HasPrefix(resp.Request.URL.Path, "/oauth2/register") || resp.StatusCode/100 != 2 ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err == nil {
		for k, v := range doc {
			if string(v) == "null" || string(v) == `""` {
				delete(doc, k)
				f.mu.Lock()
				f.dropped = append(f.dropped, k)
				f.mu.Unlock()
			}
		}
		if nb, err := json.Marshal(doc); err == nil {
			b = nb
		}
	}
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	return nil
}

// idpApp is Hydra's login and consent app: it signs in idpUser without
// asking, and on consent names the agent its table holds for the client,
// grants the scopes asked for, and binds the access token's audience to the
// `resource` the host asked for (RFC 8707; Hydra itself only knows its own
// `audience` parameter, which MCP hosts do not send). The claims it puts in
// the access-token session are the ones Mandate maps (docs/identity.md):
// `tenant`, `org` and `act.sub`; `sub` is the login's subject.
type idpApp struct {
	agents map[string]string // client_name → agent id

	mu      sync.Mutex
	admin   string
	clients []string // client ids consented to
}

func (a *idpApp) setAdmin(u string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.admin = u
}

func (a *idpApp) clientsSeen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.clients)
}

func (a *idpApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	admin := a.admin
	a.mu.Unlock()
	var (
		redirect string
		err      error
	)
	switch r.URL.Path {
	case "/login":
		redirect, err = a.login(r.Context(), admin, r.URL.Query().Get("login_challenge"))
	case "/consent":
		redirect, err = a.consent(r.Context(), admin, r.URL.Query().Get("consent_challenge"))
	case "/error":
		err = fmt.Errorf("hydra reported %s: %s", r.URL.Query().Get("error"), r.URL.Query().Get("error_description"))
	default:
		http.NotFound(w, r)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	http.Redirect(w, r, redirect, http.StatusFound)
}

// login accepts the login challenge as idpUser.
func (a *idpApp) login(ctx context.Context, admin, challenge string) (string, error) {
	if challenge == "" {
		return "", errors.New("no login_challenge")
	}
	q := "?login_challenge=" + url.QueryEscape(challenge)
	var req struct {
		Subject string `json:"subject"`
		Skip    bool   `json:"skip"`
	}
	if err := hydraAdmin(ctx, http.MethodGet, admin+"/admin/oauth2/auth/requests/login"+q, nil, &req); err != nil {
		return "", err
	}
	return acceptHydra(ctx, admin+"/admin/oauth2/auth/requests/login/accept"+q, map[string]any{"subject": idpUser.user, "remember": false})
}

// consent accepts the consent challenge with Mandate's claims, or rejects
// it when the request names no resource or a client the table lacks.
func (a *idpApp) consent(ctx context.Context, admin, challenge string) (string, error) {
	if challenge == "" {
		return "", errors.New("no consent_challenge")
	}
	q := "?consent_challenge=" + url.QueryEscape(challenge)
	var req struct {
		Subject        string   `json:"subject"`
		RequestURL     string   `json:"request_url"`
		RequestedScope []string `json:"requested_scope"`
		Client         struct {
			ClientID   string `json:"client_id"`
			ClientName string `json:"client_name"`
		} `json:"client"`
	}
	if err := hydraAdmin(ctx, http.MethodGet, admin+"/admin/oauth2/auth/requests/consent"+q, nil, &req); err != nil {
		return "", err
	}
	ru, err := url.Parse(req.RequestURL)
	if err != nil {
		return "", fmt.Errorf("consent request URL %q: %w", req.RequestURL, err)
	}
	resource := ru.Query().Get("resource")
	agent, known := a.agents[req.Client.ClientName]
	if resource == "" || !known || req.Subject != idpUser.user {
		return acceptHydra(ctx, admin+"/admin/oauth2/auth/requests/consent/reject"+q, map[string]any{
			"error": "access_denied", "error_description": "no resource, or a client this test does not map to an agent",
		})
	}
	a.mu.Lock()
	a.clients = append(a.clients, req.Client.ClientID)
	a.mu.Unlock()
	return acceptHydra(ctx, admin+"/admin/oauth2/auth/requests/consent/accept"+q, map[string]any{
		"grant_scope":                 req.RequestedScope,
		"grant_access_token_audience": []string{resource},
		"remember":                    false,
		"session": map[string]any{"access_token": map[string]any{
			"tenant": idpUser.tenant, "org": idpUser.org, "act": map[string]any{"sub": agent},
		}},
	})
}

// acceptHydra PUTs an accept or reject body and returns the redirect_to
// Hydra answers with.
func acceptHydra(ctx context.Context, u string, body any) (string, error) {
	var out struct {
		RedirectTo string `json:"redirect_to"`
	}
	if err := hydraAdmin(ctx, http.MethodPut, u, body, &out); err != nil {
		return "", err
	}
	if out.RedirectTo == "" {
		return "", fmt.Errorf("PUT %s: no redirect_to", u)
	}
	return out.RedirectTo, nil
}

// hydraAdmin calls Hydra's admin API with a JSON body and decodes the JSON
// answer into out.
func hydraAdmin(ctx context.Context, method, u string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, u, resp.StatusCode, b)
	}
	return json.Unmarshal(b, out)
}

// prmDocument is the part of RFC 9728 metadata the test reads.
type prmDocument struct {
	Resource             string   `json:"resource"`
	AuthorizationServers []string `json:"authorization_servers"`
}

// protectedResourceMetadata follows the bridge's 401 to its
// protected-resource metadata, as a host does.
func protectedResourceMetadata(t *testing.T, resource string) prmDocument {
	t.Helper()
	resp, err := http.Post(resource, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	challenge := resp.Header.Get("WWW-Authenticate")
	m := regexp.MustCompile(`resource_metadata="([^"]+)"`).FindStringSubmatch(challenge)
	if resp.StatusCode != http.StatusUnauthorized || m == nil {
		t.Fatalf("no token: %d, WWW-Authenticate %q", resp.StatusCode, challenge)
	}
	resp, err = http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var md prmDocument
	if err := json.NewDecoder(resp.Body).Decode(&md); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", m[1], resp.StatusCode, err)
	}
	return md
}

// idpRequest is one HTTP request the SDK made.
type idpRequest struct {
	Method string `json:"method"`
	Host   string `json:"host"`
	Path   string `json:"path"`
	Status int    `json:"status"`
}

// idpRPCError is a JSON-RPC error as the SDK threw it.
type idpRPCError struct {
	Code    int64           `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

// idpRun is what tests/node/idp.mjs reports.
type idpRun struct {
	Event               string `json:"event"`
	URL                 string `json:"url"`
	ClientID            string `json:"clientId"`
	AuthorizationServer string `json:"authorizationServer"`
	Claims              struct {
		Iss      string   `json:"iss"`
		Sub      string   `json:"sub"`
		Aud      []string `json:"aud"`
		ClientID string   `json:"client_id"`
		Tenant   string   `json:"tenant"`
		Org      string   `json:"org"`
		Act      struct {
			Sub string `json:"sub"`
		} `json:"act"`
	} `json:"claims"`
	Requests     []idpRequest `json:"requests"`
	ConnectError *idpRPCError `json:"connectError"`
	Tools        []string     `json:"tools"`
	ListError    *idpRPCError `json:"listError"`
	Call         nodeResult   `json:"call"`
	CallError    *idpRPCError `json:"callError"`
	Raw          string       `json:"-"`
}

// runIdPHost runs tests/node/idp.mjs as the host clientName and plays the
// browser: it opens the authorization URL the SDK hands out and follows
// Hydra's redirects through the login and consent app back to the
// script's loopback redirect URI, keeping Hydra's cookies as a browser
// would.
func runIdPHost(t *testing.T, node, resource, clientName string) idpRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "idp.mjs")
	cmd.Dir = "node"
	cmd.Env = append(os.Environ(), "MCP_URL="+resource, "CLIENT_NAME="+clientName, "MCP_TIMEOUT_MS=80000")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("idp.mjs stderr:\n%s", tail(stderr.String(), 4000))
		}
	}()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	next := func(want string) idpRun {
		t.Helper()
		if !sc.Scan() {
			t.Fatalf("idp.mjs ended before %q: %s", want, tail(stderr.String(), 2000))
		}
		var e idpRun
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Event != want {
			t.Fatalf("idp.mjs: want event %q, got %s", want, sc.Text())
		}
		e.Raw = sc.Text()
		return e
	}

	authz := next("authorize")
	u, err := url.Parse(authz.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if u.Path != "/oauth2/auth" || q.Get("resource") != resource || q.Get("code_challenge_method") != "S256" ||
		q.Get("response_type") != "code" || !strings.HasPrefix(q.Get("redirect_uri"), "http://127.0.0.1:") {
		t.Fatalf("authorization URL %s", authz.URL)
	}
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	browser := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	resp, err := browser.Get(authz.URL)
	if err != nil {
		t.Fatalf("following the authorization URL: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Request.URL.String(), q.Get("redirect_uri")) {
		t.Fatalf("the browser ended at %s with %d: %s", resp.Request.URL, resp.StatusCode, tail(string(body), 1000))
	}
	return next("done")
}
