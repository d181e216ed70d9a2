package tests

// Two replicas of every service behind nginx (issue 14 §1 and §2): audit,
// confirm, catalog, the executor, the helpdesk backend and the MCP bridge,
// each twice as processes over one Postgres, nginx in front of each pair
// (round robin, no sticky sessions) for HTTP and for gRPC (HTTP/2
// cleartext, grpc_pass). The services reach each other only through
// nginx's gRPC listeners; the bridges advertise their own addresses.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// replicatedServices are the services of a replica topology.
var replicatedServices = []string{"audit", "confirm", "helpdesk", "catalog", "executor", "mcpbridge"}

// replicaTopology is a topology with two replicas of every service behind
// nginx. Its addr map names nginx's listeners, so the topology's helpers
// (rest, conn, tryRest, chaosLoad, query) go through the balancer; direct
// names each replica's own listeners. Replica i of a service runs as the
// process "<service>-<i+1>".
type replicaTopology struct {
	*topology
	portsMu  sync.Mutex // guards direct while replicas move
	lb       map[string]endpoint
	direct   map[string][]endpoint
	nginx    *exec.Cmd
	nginxDir string
}

// newReplicaTopology starts the replica topology; executorArgs are added
// to both executors' flags. It skips when nginx is missing (unless
// MANDATE_REQUIRE_BROWSER=1).
func newReplicaTopology(t *testing.T, executorArgs ...string) *replicaTopology {
	t.Helper()
	bin := nginxPath(t)
	tp := newTopology(t, topologyOptions{noServices: true})
	rt := &replicaTopology{topology: tp, lb: map[string]endpoint{}, direct: map[string][]endpoint{}, nginxDir: t.TempDir()}
	for _, s := range replicatedServices {
		rt.lb[s] = endpoint{grpc: freePort(t), http: freePort(t)}
		rt.direct[s] = []endpoint{{freePort(t), freePort(t)}, {freePort(t), freePort(t)}}
	}
	// nginx first, so that every client of it finds it listening; a
	// replica whose port was taken meanwhile moves and nginx reloads.
	rt.startNginx(bin)
	args := map[string]func(ep endpoint) []string{
		"executor": func(endpoint) []string {
			return append([]string{
				"--audit-addr", rt.lb["audit"].grpc,
				"--confirm-addr", rt.lb["confirm"].grpc,
				"--backend", "examples.helpdesk.v1.HelpdeskService=" + rt.lb["helpdesk"].grpc +
					",mandate.v1.CatalogService=" + rt.lb["catalog"].grpc,
			}, executorArgs...)
		},
		"confirm": func(endpoint) []string { return []string{"--audit-addr", rt.lb["audit"].grpc} },
		"mcpbridge": func(ep endpoint) []string {
			return []string{
				"--advertise-url", "http://" + ep.http,
				"--executor-addr", rt.lb["executor"].grpc,
				"--catalog-addr", rt.lb["catalog"].grpc,
				"--confirm-addr", rt.lb["confirm"].grpc,
			}
		},
	}
	// The helpdesk seeds an empty store: its second replica starts once
	// the first has.
	type replica struct {
		service string
		i       int
	}
	tiers := [][]replica{
		{{"audit", 0}, {"audit", 1}, {"confirm", 0}, {"confirm", 1}, {"catalog", 0}, {"catalog", 1}, {"helpdesk", 0}},
		{{"helpdesk", 1}, {"executor", 0}, {"executor", 1}},
		{{"mcpbridge", 0}, {"mcpbridge", 1}},
	}
	for _, tier := range tiers {
		var wg sync.WaitGroup
		errs := make(chan error, len(tier))
		for _, r := range tier {
			wg.Go(func() { errs <- rt.startReplica(r.service, r.i, args[r.service]) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	tp.mu.Lock()
	for s, ep := range rt.lb {
		tp.addr[s] = ep
	}
	tp.mu.Unlock()
	for s, ep := range rt.lb {
		waitHealthy(t, "http://"+ep.http+"/healthz", func() string { return s + " through nginx:\n" + rt.nginxLog() })
	}
	return rt
}

// startReplica starts replica i of a service on its ports and waits until
// it is healthy; a port taken by another process moves it to fresh ports
// (and nginx with it).
func (rt *replicaTopology) startReplica(service string, i int, args func(endpoint) []string) error {
	name := fmt.Sprintf("%s-%d", service, i+1)
	var err error
	for range 3 {
		rt.portsMu.Lock()
		ep := rt.direct[service][i]
		rt.portsMu.Unlock()
		var extra []string
		if args != nil {
			extra = args(ep)
		}
		if err = rt.launch(name, service, ep, extra); !errors.Is(err, errAddrInUse) {
			return err
		}
		rt.portsMu.Lock()
		rt.direct[service][i] = endpoint{freePort(rt.t), freePort(rt.t)}
		err = rt.writeNginxConf()
		rt.portsMu.Unlock()
		if err != nil {
			return err
		}
		if err := rt.nginx.Process.Signal(syscall.SIGHUP); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond) // the new workers take over
	}
	return err
}

// launch runs one process of a service and waits for its /healthz.
func (rt *replicaTopology) launch(name, service string, ep endpoint, args []string) error {
	tp := rt.topology
	log, err := os.Create(filepath.Join(tp.logDir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(tp.bin, append([]string{service, "--grpc-addr", ep.grpc, "--http-addr", ep.http}, args...)...)
	cmd.Env, cmd.Stdout, cmd.Stderr = tp.env, log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan error, 1), log: log}
	go func() { p.done <- cmd.Wait() }()
	tp.mu.Lock()
	tp.procs = append(tp.procs, p)
	tp.mu.Unlock()
	client := &http.Client{Timeout: 2 * time.Second}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-p.done:
			p.done <- err
			out := tp.logOf(name)
			if strings.Contains(out, "address already in use") {
				tp.forget(p)
				return fmt.Errorf("%s: %w", name, errAddrInUse)
			}
			return fmt.Errorf("%s exited before it became healthy (%w):\n%s", name, err, out)
		default:
		}
		if resp, err := client.Get("http://" + ep.http + "/healthz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s never became healthy:\n%s", name, tp.logOf(name))
		}
	}
}

// replicasNginxConf: per service an HTTP server (proxy_pass, the client's
// Host passed on, no buffering for SSE, long reads) and an HTTP/2
// cleartext one for gRPC (grpc_pass, long reads for streams). The access
// log names the listener's port and the upstream of each request.
const replicasNginxConf = `
%s
worker_processes 1;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log info;
events { worker_connections 1024; }
http {
	log_format upstream '$server_port $status $request_uri $upstream_addr';
	access_log %[2]s/access.log upstream;
	client_body_temp_path %[2]s/body;
	proxy_temp_path %[2]s/proxy;
	fastcgi_temp_path %[2]s/fastcgi;
	uwsgi_temp_path %[2]s/uwsgi;
	scgi_temp_path %[2]s/scgi;
	keepalive_requests 100000;
%[3]s}
`

const replicasNginxService = `
	upstream %[1]s_http {
		server %[2]s;
		server %[3]s;
		keepalive 16;
		keepalive_requests 100000;
	}
	upstream %[1]s_grpc {
		server %[4]s;
		server %[5]s;
		keepalive 16;
		keepalive_requests 100000;
	}
	server {
		listen %[6]s;
		location / {
			proxy_pass http://%[1]s_http;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_set_header Host $http_host;
			proxy_buffering off;
			proxy_request_buffering off;
			proxy_read_timeout 1h;
		}
	}
	server {
		listen %[7]s http2;
		location / {
			grpc_pass grpc://%[1]s_grpc;
			grpc_read_timeout 1h;
			grpc_send_timeout 1h;
		}
	}
`

// writeNginxConf writes nginx.conf from the current addresses (portsMu held
// or not yet shared).
func (rt *replicaTopology) writeNginxConf() error {
	var services strings.Builder
	for _, s := range replicatedServices {
		d := rt.direct[s]
		fmt.Fprintf(&services, replicasNginxService, s, d[0].http, d[1].http, d[0].grpc, d[1].grpc, rt.lb[s].http, rt.lb[s].grpc)
	}
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;" // the workers use the test's temporary directory
	}
	return os.WriteFile(filepath.Join(rt.nginxDir, "nginx.conf"), fmt.Appendf(nil, replicasNginxConf, user, rt.nginxDir, services.String()), 0o600)
}

// startNginx runs nginx on the configuration; it stops when the test ends.
func (rt *replicaTopology) startNginx(bin string) {
	t := rt.t
	t.Helper()
	if err := rt.writeNginxConf(); err != nil {
		t.Fatal(err)
	}
	dir := rt.nginxDir
	cmd := exec.Command(bin, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;")
	out, err := os.Create(filepath.Join(dir, "nginx.out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rt.nginx = cmd
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // fast shutdown: open streams end
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("nginx did not stop cleanly: %v", err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("nginx did not stop within 10s (killed: %v)", <-done)
		}
		_ = out.Close()
	})
	// Listening. (Not a request: one that no replica answers yet would
	// mark the replicas failed for nginx's fail_timeout.)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("nginx exited (%v):\n%s", err, rt.nginxLog())
		default:
		}
		if c, err := net.DialTimeout("tcp", rt.lb["mcpbridge"].grpc, time.Second); err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx never listened:\n%s", rt.nginxLog())
		}
	}
}

func (rt *replicaTopology) nginxLog() string {
	o, _ := os.ReadFile(filepath.Join(rt.nginxDir, "nginx.out"))
	e, _ := os.ReadFile(filepath.Join(rt.nginxDir, "error.log"))
	return tail(string(o)+string(e), 6000)
}

// hits counts the requests nginx sent to each replica of a service through
// its gRPC (grpc true) or HTTP listener, by replica index, of the paths
// that start with prefix. nginx logs a request when it ends.
func (rt *replicaTopology) hits(service string, grpc bool, prefix string) [2]int {
	rt.t.Helper()
	b, err := os.ReadFile(filepath.Join(rt.nginxDir, "access.log"))
	if err != nil {
		rt.t.Fatal(err)
	}
	lb, d := rt.lb[service].http, []string{rt.direct[service][0].http, rt.direct[service][1].http}
	if grpc {
		lb, d = rt.lb[service].grpc, []string{rt.direct[service][0].grpc, rt.direct[service][1].grpc}
	}
	_, port, _ := strings.Cut(lb, ":")
	var n [2]int
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, " ", 4)
		if len(f) != 4 || f[0] != port || !strings.HasPrefix(f[2], prefix) {
			continue
		}
		for i := range d {
			if strings.Contains(f[3], d[i]) {
				n[i]++
			}
		}
	}
	return n
}

// replicaSession connects the go-sdk client (protocol 2025-11-25, so a
// session) to an MCP endpoint; changed receives tools/list_changed.
func replicaSession(t *testing.T, endpoint, tok string) (*mcp.ClientSession, chan struct{}) {
	t.Helper()
	changed := make(chan struct{}, 8)
	c := mcp.NewClient(&mcp.Implementation{Name: "replica-agent", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case changed <- struct{}{}:
			default:
			}
		},
	})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: bearer{tok}}},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("MCP connect to %s: %v", endpoint, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs, changed
}

// sessionOwner is the bridge address a session id names (sealed).
func sessionOwner(t *testing.T, id string) string {
	t.Helper()
	parts := strings.Split(id, ".")
	if len(parts) != 3 {
		t.Fatalf("session id %q names no owner", id)
	}
	owner, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatalf("session id %q: %v", id, err)
	}
	return strings.TrimPrefix(string(owner), "http://")
}

// TestReplicasConfirmAcrossReplicas: carol's payout-bot asks for a refund
// through nginx (a challenge opened by some confirm replica); two Await
// streams, held through nginx as the requesting agent, land one on each
// confirm replica; carol signs in and approves on the approval page
// through nginx. Both streams are woken with the decision — whichever
// replica served the page, one stream waits on the other — and the grant
// redeems once.
func TestReplicasConfirmAcrossReplicas(t *testing.T) {
	rt := newReplicaTopology(t)
	bot := rt.token("acme", "carol", "payout-bot")
	r := rt.rest("executor", http.MethodPost, "/v1/commands/ticket.refund:execute", bot, `{"input":`+refundInput+`}`)
	wantProblem(t, r, http.StatusUnprocessableEntity, "confirmation_check", "confirmation.required")
	challenge, _ := r.body["challenge_id"].(string)

	client := mandatev1.NewConfirmServiceClient(rt.conn("confirm"))
	ctx, cancel := context.WithTimeout(rt.as(bot), 20*time.Second)
	defer cancel()
	var streams []mandatev1.ConfirmService_AwaitClient
	for range 2 {
		s, err := client.Await(ctx, &mandatev1.AwaitRequest{ChallengeId: challenge})
		if err != nil {
			t.Fatal(err)
		}
		if first, err := s.Recv(); err != nil || first.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_PENDING {
			t.Fatalf("Await through nginx: %v %v", first, err)
		}
		streams = append(streams, s)
	}

	link := strings.TrimSpace(rt.run("token", "--login-url", "http://"+rt.lb["confirm"].http, "--user", "carol", "--tenant", "acme"))
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	page := &approvalPage{base: "http://" + rt.lb["confirm"].http, client: &http.Client{Jar: jar}}
	if code, html := page.get(t, link); code != http.StatusOK || !strings.Contains(html, "signed in as carol") {
		t.Fatalf("carol signing in through nginx: %d\n%s", code, html)
	}
	decided := time.Now()
	page.approve(t, challenge)
	for i, s := range streams {
		got, err := s.Recv()
		if err != nil || got.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_APPROVED || got.GetDecidedBy() != "carol" {
			t.Fatalf("Await %d after the page's approval: %v %v", i, got, err)
		}
		if _, err := s.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("Await %d after the decision: %v, want EOF", i, err)
		}
	}
	if waited := time.Since(decided); waited > 5*time.Second {
		t.Fatalf("woken %v after the decision", waited)
	}
	if h := rt.hits("confirm", false, "/approve/"); h[0] == 0 || h[1] == 0 {
		t.Fatalf("nginx sent the page's requests to one confirm replica only: %v", h)
	}
	// nginx logs a stream when it ends.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		h := rt.hits("confirm", true, "/mandate.v1.ConfirmService/Await")
		if h == [2]int{1, 1} {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Await streams per confirm replica: %v, want one on each", h)
		}
	}

	r = rt.rest("executor", http.MethodPost, "/v1/commands/ticket.refund:execute", bot, `{"input":`+refundInput+`,"approval_grant_id":"`+challenge+`"}`)
	if r.status != http.StatusOK {
		t.Fatalf("refund after the approval: %d %s", r.status, r.raw)
	}
	r = rt.rest("executor", http.MethodPost, "/v1/commands/ticket.refund:execute", bot, `{"input":`+refundInput+`,"approval_grant_id":"`+challenge+`"}`)
	if r.status == http.StatusOK {
		t.Fatalf("the grant redeemed twice: %s", r.raw)
	}
	if n := rt.count(`SELECT count(*) FROM helpdesk.refunds`); n != 1 {
		t.Fatalf("%d refunds booked, want 1", n)
	}
}

// TestReplicasIdempotencyRaceOverTwoExecutors: 64 concurrent REST calls
// with one idempotency key, half sent to each executor replica directly:
// one report is created, every other caller is told the call is in flight
// or gets its replay, and the trail holds 64 attempts of one invocation.
func TestReplicasIdempotencyRaceOverTwoExecutors(t *testing.T) {
	rt := newReplicaTopology(t)
	const n, key = 64, "replicas-race-1"
	const input = `{"title":"Customer visit Lyon","lines":[{"description":"Train Paris-Lyon","amount":{"currency_code":"EUR","amount_minor":8900},"category":"EXPENSE_CATEGORY_TRAVEL"}],"payroll_id":"P-0042"}`
	alice := rt.token("acme", "alice", "")
	reportsBefore := rt.count(`SELECT count(*) FROM helpdesk.expense_reports`)
	type answer struct {
		status            int
		code, invocation  string
		report, transport string
		replayed          bool
	}
	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			u := "http://" + rt.direct["executor"][i%2].http + "/v1/commands/expense.report.create:execute"
			r, err := send(context.Background(), nil, http.MethodPost, u, `{"input":`+input+`}`,
				"Authorization", "Bearer "+alice, "Content-Type", "application/json", "Idempotency-Key", key)
			a := &answers[i]
			if err != nil {
				a.transport = err.Error()
				return
			}
			var body map[string]any
			_ = json.Unmarshal([]byte(r.body), &body)
			a.status = r.status
			a.code, _ = body["code"].(string)
			a.invocation, _ = body["invocation_id"].(string)
			a.replayed, _ = body["replayed"].(bool)
			if res, ok := body["result"].(map[string]any); ok {
				a.report, _ = res["report_id"].(string)
			}
		})
	}
	close(start)
	wg.Wait()
	var ran, report string
	var firsts, replays, inFlight int
	for i, a := range answers {
		switch {
		case a.transport != "":
			t.Fatalf("call %d: %s", i, a.transport)
		case a.status == http.StatusConflict && a.code == "idempotency.in_flight":
			inFlight++
		case a.status == http.StatusOK && a.report != "":
			if a.replayed {
				replays++
			} else {
				firsts++
			}
			if ran == "" {
				ran, report = a.invocation, a.report
			}
			if a.invocation != ran || a.report != report {
				t.Fatalf("call %d: %+v; another success ran %s creating %s", i, a, ran, report)
			}
		default:
			t.Fatalf("call %d (executor-%d): %+v", i, i%2+1, a)
		}
	}
	if firsts != 1 || firsts+replays+inFlight != n {
		t.Fatalf("%d first answers, %d replays, %d in flight; want 1 first of %d", firsts, replays, inFlight, n)
	}
	if created := rt.count(`SELECT count(*) FROM helpdesk.expense_reports`) - reportsBefore; created != 1 {
		t.Fatalf("%d reports for one key, want 1", created)
	}
	// 64 attempts: one intent, 64 outcomes (written after the replies).
	var outcomes int
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		outcomes = rt.count(`SELECT count(*) FROM audit.records WHERE command = 'expense.report.create' AND phase = 'outcome'`)
		if outcomes >= n || time.Now().After(deadline) {
			break
		}
	}
	intents := rt.count(`SELECT count(*) FROM audit.records WHERE command = 'expense.report.create' AND phase = 'intent'`)
	if outcomes != n || intents != 1 {
		t.Fatalf("%d outcome rows and %d intents; want %d and 1", outcomes, intents, n)
	}
	if n := rt.count(`SELECT count(*) FROM audit.records WHERE command = 'expense.report.create' AND phase = 'outcome' AND outcome = 'executed'`); n != 1 {
		t.Fatalf("%d executed outcomes, want 1", n)
	}
	t.Logf("1 executed, %d replayed, %d refused in flight over two executors", replays, inFlight)
}

// TestReplicasAuditChainOverTwoReplicas: calls through nginx use both
// executors, which append through nginx to both audit replicas for one
// tenant: the chain verifies and each tenant's seqs run gap-free. Each
// executor appends on one stream at a time, renewed every 100ms here
// (--audit-stream-max-age), so that nginx spreads the streams (and logs
// each once it closed).
func TestReplicasAuditChainOverTwoReplicas(t *testing.T) {
	rt := newReplicaTopology(t, "--audit-stream-max-age", "100ms")
	l := startChaosLoad(rt.topology, 8, 6)
	time.Sleep(time.Second)
	keys, _ := l.finish(t) // audit verify --tenant acme: intact
	if h := rt.hits("audit", true, ""); h[0] == 0 || h[1] == 0 {
		t.Fatalf("the executors appended through one audit replica only: %v", h)
	}
	if h := rt.hits("executor", false, ""); h[0] == 0 || h[1] == 0 {
		t.Fatalf("nginx sent the calls to one executor only: %v", h)
	}
	rows, err := rt.db.Query(t.Context(), `SELECT tenant, max(seq), count(*) FROM audit.records GROUP BY tenant`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var tenant string
		var maxSeq, count int64
		if err := rows.Scan(&tenant, &maxSeq, &count); err != nil {
			t.Fatal(err)
		}
		if maxSeq != count {
			t.Errorf("tenant %s: max(seq) %d over %d rows", tenant, maxSeq, count)
		}
		t.Logf("tenant %s: %d rows, seqs 1..%d", tenant, count, maxSeq)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d keys; audit appends per replica %v", keys, rt.hits("audit", true, ""))
}

// TestReplicasListChangedOnEveryBridge: alice's agent holds a session on
// each bridge replica (directly); `mandate policy apply` gives alice
// another role, and both sessions get tools/list_changed.
func TestReplicasListChangedOnEveryBridge(t *testing.T) {
	rt := newReplicaTopology(t)
	tok := rt.token("acme", "alice", "support-bot")
	var changed []chan struct{}
	for _, ep := range rt.direct["mcpbridge"] {
		cs, ch := replicaSession(t, "http://"+ep.http+"/mcp", tok)
		if _, err := cs.ListTools(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		changed = append(changed, ch)
	}
	time.Sleep(300 * time.Millisecond) // the standalone streams are open
	demo, err := os.ReadFile(filepath.Join(rt.root, "examples", "policy", "demo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const from = "{id: alice, org: support, roles: [support]}"
	if !strings.Contains(string(demo), from) {
		t.Fatalf("demo.yaml has no %q", from)
	}
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(strings.Replace(string(demo), from, "{id: alice, org: support, roles: [support, finance]}", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	rt.run("policy", "apply", "-f", policy)
	for i, ch := range changed {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("the session on mcpbridge-%d got no tools/list_changed within 10s:\n%s", i+1, rt.logOf(fmt.Sprintf("mcpbridge-%d", i+1)))
		}
	}
	t.Logf("both bridges notified within %v", time.Since(applied).Round(time.Millisecond))
}

// TestReplicasLoseOneUnderLoad: under REST load through nginx (keys
// retried while retriable), one executor and the bridge that holds an MCP
// session are killed with SIGKILL. Clients' retries succeed on the other
// replicas; nothing reaches the backend without an intent row; the chain
// verifies; the session held by the lost bridge fails cleanly within
// seconds, and a new session works.
func TestReplicasLoseOneUnderLoad(t *testing.T) {
	rt := newReplicaTopology(t, "--default-deadline", "2s", "--lease", "1500ms", "--reconcile-after", "4s", "--reconcile-interval", "300ms")
	endpoint := "http://" + rt.lb["mcpbridge"].http + "/mcp"
	tok := rt.token("acme", "alice", "support-bot")
	held, _ := replicaSession(t, endpoint, tok)
	owner := sessionOwner(t, held.ID())
	lost := -1
	for i, ep := range rt.direct["mcpbridge"] {
		if ep.http == owner {
			lost = i
		}
	}
	if lost < 0 {
		t.Fatalf("session owner %s is neither bridge", owner)
	}
	wantSuccess(t, callTool(t, held, "ticket.search", `{"query":"charged twice"}`, nil))

	l := startBalancedLoad(rt.topology, 6, 5)
	time.Sleep(500 * time.Millisecond)
	rt.kill9("executor-1")
	rt.kill9(fmt.Sprintf("mcpbridge-%d", lost+1))

	// The session the lost bridge held: a clean failure, soon.
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	_, err := held.ListTools(ctx, nil)
	cancel()
	took := time.Since(began)
	if err == nil {
		t.Fatalf("the session of the lost bridge still answers")
	}
	if took > 5*time.Second || !errors.Is(err, mcp.ErrSessionMissing) && !strings.Contains(err.Error(), "404") {
		t.Fatalf("the session of the lost bridge failed after %v with %v; want session missing (404) within seconds", took, err)
	}
	t.Logf("the lost bridge's session failed after %v: %v", took.Round(time.Millisecond), err)
	fresh, _ := replicaSession(t, endpoint, tok)
	wantSuccess(t, callTool(t, fresh, "ticket.search", `{"query":"charged twice"}`, nil))

	time.Sleep(time.Second)
	_, outcomes := l.finish(t) // one report per key, the chain verifies
	if outcomes["intent without outcome"] != 0 {
		t.Errorf("%d intents without outcome", outcomes["intent without outcome"])
	}
	reports := rt.count(`SELECT count(*) FROM helpdesk.expense_reports WHERE title LIKE 'chaos-%'`)
	receipts := rt.count(`SELECT count(*) FROM helpdesk.receipts WHERE state = 'executed' AND method LIKE '%/CreateExpenseReport'`)
	// Every executed call's intent was durable in its executor's outbox
	// before dispatch; the killed executor's last rows reach the trail with
	// the survivor's relay, at its next tick (every second).
	withIntent := 0
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		withIntent = rt.count(`SELECT count(*) FROM helpdesk.receipts r WHERE r.state = 'executed' AND r.method LIKE '%/CreateExpenseReport'
		AND EXISTS (SELECT FROM audit.records i WHERE i.invocation_id = r.invocation_id AND i.phase = 'intent')`)
		if withIntent == receipts || time.Now().After(deadline) {
			break
		}
	}
	if reports != receipts || withIntent != receipts {
		t.Errorf("%d reports, %d executed receipts, %d of them with an intent row", reports, receipts, withIntent)
	}
	t.Logf("%d reports, each with its intent", reports)
}

// startBalancedLoad is startChaosLoad's clients behind a balancer: an
// answer of the balancer itself (502 or 504 without a Mandate problem: the
// replica went away mid-call) is retried with the same key like a
// retriable refusal, and counted as "<status> error" (no trail row to
// expect, as for a connection error).
func startBalancedLoad(tp *topology, workers, perWorker int) *chaosLoad {
	l := &chaosLoad{tp: tp, stop: make(chan struct{}), results: make(chan chaosResult, 10000), start: time.Now()}
	alice := tp.token("acme", "alice", "")
	for w := range workers {
		l.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					if i >= perWorker {
						return
					}
				default:
				}
				key := fmt.Sprintf("chaos-%d-%d", w, i)
				body := `{"input":{"title":"` + key + `","payroll_id":"P-0042","lines":[{"description":"Train","amount":{"currency_code":"EUR","amount_minor":"1000"},"category":"EXPENSE_CATEGORY_TRAVEL"}]}}`
				l.results <- balancedCall(tp, alice, key, body)
			}
		})
	}
	return l
}

// balancedCall makes one call of startBalancedLoad, retrying with its key.
func balancedCall(tp *topology, tok, key, body string) chaosResult {
	r := chaosResult{key: key}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		r.attempts++
		resp, err := tp.tryRest("executor", http.MethodPost, "/v1/commands/expense.report.create:execute", tok, body, "Idempotency-Key", key)
		code, _ := resp.body["code"].(string)
		switch {
		case err != nil:
			r.codes = append(r.codes, "connection error")
		case resp.status == http.StatusOK:
			res, _ := resp.body["result"].(map[string]any)
			r.report, _ = res["report_id"].(string)
			return r
		case code == "" && (resp.status == http.StatusBadGateway || resp.status == http.StatusGatewayTimeout):
			r.codes = append(r.codes, fmt.Sprint(resp.status, " error"))
		default:
			r.codes = append(r.codes, fmt.Sprint(resp.status, " ", code))
			if retriable, _ := resp.body["retriable"].(bool); !retriable && resp.status != http.StatusServiceUnavailable {
				return r
			}
		}
	}
	return r
}

// TestReplicasTypeScriptClient: the official TypeScript SDK client (what
// hosts embed; protocol 2025-11-25, with a session) talks to two bridge
// replicas through nginx, round robin: it lists its tools, searches, and
// has a refund confirmed through a form it accepts — every request of the
// session, the form's answer included, reaches the replica that holds it.
func TestReplicasTypeScriptClient(t *testing.T) {
	node := nodeOrSkip(t)
	rt := newReplicaTopology(t)
	via := &devProcess{base: "http://" + rt.lb["mcpbridge"].http, tokens: map[string]string{"finance-bot@carol": rt.token("acme", "carol", "finance-bot")}}
	out := via.client(t, node, "finance-bot@carol", "accept", `{"op":"list"}`,
		`{"op":"call","name":"ticket.search","arguments":{"query":"charged twice"}}`,
		`{"op":"call","name":"ticket.refund","arguments":`+nodeRefund+`}`)
	if out.Server.SessionID == "" {
		t.Fatalf("no session: %+v", out.Server)
	}
	if search := out.step(t, 1, "call", true); search.Result.IsError || !strings.Contains(string(search.Result.StructuredContent), "T-1001") {
		t.Fatalf("ticket.search through nginx: %s", search.Raw)
	}
	refund := out.step(t, 2, "call", true)
	if len(out.Elicitations) != 1 || refund.Result.IsError || !strings.Contains(string(refund.Result.StructuredContent), "REFUND_STATUS_ACCEPTED") {
		t.Fatalf("refund through nginx: %d forms, %s", len(out.Elicitations), refund.Raw)
	}
	if n := rt.count(`SELECT count(*) FROM helpdesk.refunds`); n != 1 {
		t.Fatalf("%d refunds booked, want 1", n)
	}
	if h := rt.hits("mcpbridge", false, "/mcp"); h[0] == 0 || h[1] == 0 {
		t.Fatalf("nginx sent the session's POSTs to one replica only: %v", h)
	}
}

// TestReplicasBudgetRaceOverTwoExecutors: the sample's refund declares a
// budget — an agent refunds at most 50.00 per currency a day, and past it
// every refund it makes needs a human (issue 29 §2). finance-bot sends 64
// concurrent refunds of 0.99 EUR, each under its own key, half to each
// executor directly: small refunds run without a human, so only the
// budget stands between the loop and the money. Exactly 50 run (49.50;
// a 51st would pass 50.00), the 14 others each open an approval instead
// of being refused, and the shared store holds exactly 4950 — never more.
// Retrying every key that ran replays it and spends nothing more. One
// approved escalation then runs past the ceiling and counts.
func TestReplicasBudgetRaceOverTwoExecutors(t *testing.T) {
	rt := newReplicaTopology(t)
	// T-1001 was paid 49.90: make it 1,000.00, so the ticket's own
	// refundable amount never decides, the budget does.
	if _, err := rt.db.Exec(context.Background(), `UPDATE helpdesk.tickets SET paid_minor = 100000 WHERE tenant = 'acme' AND ticket_id = 'T-1001'`); err != nil {
		t.Fatal(err)
	}
	const n, amount = 64, 99
	bot := rt.token("acme", "carol", "finance-bot")
	body := fmt.Sprintf(`{"amount":{"currency_code":"EUR","amount_minor":"%d"},"reason":"Goodwill gesture","cardholder_reference":"CH4242424242"}`, amount)
	type answer struct {
		status          int
		code, challenge string
		message         string
	}
	call := func(i int, key string, headers ...string) answer {
		u := "http://" + rt.direct["executor"][i%2].http + "/v1/tickets/T-1001:refund"
		r, err := send(context.Background(), nil, http.MethodPost, u, body,
			append([]string{"Authorization", "Bearer " + bot, "Content-Type", "application/json", "Idempotency-Key", key}, headers...)...)
		if err != nil {
			t.Errorf("call %d: %v", i, err)
			return answer{}
		}
		var b map[string]any
		_ = json.Unmarshal([]byte(r.body), &b)
		a := answer{status: r.status}
		a.code, _ = b["code"].(string)
		a.challenge, _ = b["challenge_id"].(string)
		a.message, _ = b["detail"].(string)
		return a
	}
	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i] = call(i, fmt.Sprintf("budget-race-%02d", i))
		})
	}
	close(start)
	wg.Wait()
	var ran []int
	var escalated []answer
	for i, a := range answers {
		switch {
		case a.status == http.StatusOK:
			ran = append(ran, i)
		case a.status == http.StatusUnprocessableEntity && a.code == "confirmation.required" && a.challenge != "":
			if !strings.Contains(a.message, "agent-daily-refunds") {
				t.Errorf("call %d was escalated without naming the limit: %q", i, a.message)
			}
			escalated = append(escalated, a)
		default:
			t.Fatalf("call %d (executor-%d): %+v", i, i%2+1, a)
		}
	}
	// Each helpdesk replica has a payment gateway of its own: the booked
	// refunds are counted in the shared database.
	booked := func(n, minor int) {
		t.Helper()
		if got := rt.count(`SELECT count(*) FROM helpdesk.refunds WHERE tenant = 'acme'`); got != n {
			t.Fatalf("%d refunds booked, want %d", got, n)
		}
		if got := rt.count(`SELECT coalesce(sum(amount_minor), 0)::int FROM helpdesk.refunds WHERE tenant = 'acme'`); got != minor {
			t.Fatalf("refunds of %d booked, want %d", got, minor)
		}
	}
	spent := func() int {
		return rt.count(`SELECT coalesce(sum(a), 0)::int FROM executor.limit_bucket b, unnest(b.amounts) AS a WHERE b.tenant = 'acme' AND b.bucket LIKE 'ticket.refund/agent-daily-refunds/agent:finance-bot/%'`)
	}
	if len(ran) != 50 || len(escalated) != n-50 {
		t.Fatalf("%d refunds ran and %d were escalated; want 50 and %d", len(ran), len(escalated), n-50)
	}
	if got := spent(); got != 50*amount {
		t.Fatalf("the budget holds %d spent, want exactly %d", got, 50*amount)
	}
	booked(50, 50*amount)

	// Every key that ran, again, concurrently: replays, nothing spent.
	for j, i := range ran {
		wg.Go(func() {
			if a := call(j, fmt.Sprintf("budget-race-%02d", i)); a.status != http.StatusOK {
				t.Errorf("the retry of key %d: %+v", i, a)
			}
		})
	}
	wg.Wait()
	if got := spent(); got != 50*amount {
		t.Fatalf("after the retries the budget holds %d spent, want %d", got, 50*amount)
	}
	booked(50, 50*amount)

	// carol approves one escalation; the approved refund runs past the
	// ceiling and counts.
	first := escalated[0]
	carol := rt.token("acme", "carol", "")
	if _, err := rt.decide(carol, first.challenge, mandatev1.Decision_DECISION_APPROVE); err != nil {
		t.Fatal(err)
	}
	var key string
	for i, a := range answers {
		if a.challenge == first.challenge {
			key = fmt.Sprintf("budget-race-%02d", i)
		}
	}
	if a := call(0, key, "X-Mandate-Approval-Grant", first.challenge); a.status != http.StatusOK {
		t.Fatalf("the approved escalation: %+v", a)
	}
	if got := spent(); got != 51*amount {
		t.Fatalf("after the approved refund the budget holds %d spent, want %d", got, 51*amount)
	}
	booked(51, 51*amount)
	t.Logf("64 refunds over two executors: 50 ran (%d spent of 5000), %d escalated to a human; 50 retries replayed; one approved past the ceiling", 50*amount, len(escalated))
}
