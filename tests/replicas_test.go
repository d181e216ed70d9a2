package tests

// Two replicas of the MCP bridge behind nginx (issue 14 §1 and §2): the
// balancer users put in front, round robin, no sticky sessions. A session
// lives in the memory of the replica that initialised it; the other
// replica forwards that session's requests to it, the owner named (sealed
// with the shared state secret) in the session id.

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// nginxPath is the nginx binary; without one the test skips, unless
// MANDATE_REQUIRE_BROWSER=1 (CI installs it next to Chromium).
func nginxPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"nginx", "/usr/sbin/nginx"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("MANDATE_REQUIRE_BROWSER") == "1" {
		t.Fatal("MANDATE_REQUIRE_BROWSER=1 but no nginx found (apt-get install -y nginx)")
	}
	t.Skip("no nginx: apt-get install -y nginx")
	return ""
}

// startBridgeReplica starts one more `mandate mcpbridge` process on the
// topology's services, advertising its own address. It shares the state
// secret with the first bridge: both derive it from MANDATE_SERVICE_SECRET,
// which the topology gives every process. It stops with the topology.
func (tp *topology) startBridgeReplica(name string) string {
	tp.t.Helper()
	grpcAddr, httpAddr := freePort(tp.t), freePort(tp.t)
	log, err := os.Create(filepath.Join(tp.logDir, name+".log"))
	if err != nil {
		tp.t.Fatal(err)
	}
	cmd := exec.Command(tp.bin, "mcpbridge", "--grpc-addr", grpcAddr, "--http-addr", httpAddr,
		"--advertise-url", "http://"+httpAddr,
		"--executor-addr", tp.addr["executor"].grpc,
		"--catalog-addr", tp.addr["catalog"].grpc,
		"--confirm-addr", tp.addr["confirm"].grpc)
	tp.spawn(name, cmd, log)
	waitHealthy(tp.t, "http://"+httpAddr+"/healthz", func() string { return tp.logOf(name) })
	return httpAddr
}

// waitHealthy polls a /healthz URL until it answers 200.
func waitHealthy(t *testing.T, u string, log func() string) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get(u)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered 200:\n%s", u, log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nginxConf is a plain round-robin balancer over the bridges, configured
// as for any Streamable HTTP server: HTTP/1.1 to the upstreams, no
// buffering (SSE streams flow as they are written), long reads (a call may
// wait for its confirmation), and the client's Host passed on (the bridge
// checks it against its loopback listener). Each request's upstream goes
// to the access log.
const nginxConf = `
%s
worker_processes 1;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log info;
events { worker_connections 256; }
http {
	log_format upstream '$msec $request_time $request_method $status $upstream_addr $http_mcp_session_id';
	access_log %[2]s/access.log upstream;
	client_body_temp_path %[2]s/body;
	proxy_temp_path %[2]s/proxy;
	fastcgi_temp_path %[2]s/fastcgi;
	uwsgi_temp_path %[2]s/uwsgi;
	scgi_temp_path %[2]s/scgi;
	upstream mcpbridge {
%[3]s	}
	server {
		listen %[4]s;
		location / {
			proxy_pass http://mcpbridge;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_set_header Host $http_host;
			proxy_buffering off;
			proxy_request_buffering off;
			proxy_read_timeout 1h;
		}
	}
}
`

// startNginx runs nginx in front of the upstreams (host:port) and returns
// its address and the directory of its logs. It stops when the test ends.
func startNginx(t *testing.T, upstreams ...string) (addr, dir string) {
	t.Helper()
	bin := nginxPath(t)
	dir = t.TempDir()
	addr = freePort(t)
	var servers strings.Builder
	for _, u := range upstreams {
		fmt.Fprintf(&servers, "\t\tserver %s;\n", u)
	}
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;" // the workers use the test's temporary directory
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConf, user, dir, servers.String(), addr), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", conf, "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;")
	out, err := os.Create(filepath.Join(dir, "nginx.out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // fast shutdown: open SSE streams end
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
	waitHealthy(t, "http://"+addr+"/healthz", func() string {
		b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		o, _ := os.ReadFile(filepath.Join(dir, "nginx.out"))
		return string(o) + string(b)
	})
	return addr, dir
}

// TestReplicasBehindNginx: the real go-sdk client talks to two `mandate
// mcpbridge` processes through nginx, round robin. It initialises, lists
// and calls tools with its standalone SSE stream open, and finance-bot's
// refunds are confirmed by carol through form elicitation: the call waits
// on the session's owner, and its answer, a POST of its own, may land on
// the other replica. Requests alternate between the replicas, so of two
// confirmations separated by one more request, one has its answer land on
// the replica that does not hold the session. Both complete, and exactly
// those refunds move money.
func TestReplicasBehindNginx(t *testing.T) {
	nginxPath(t) // skip before starting anything
	tp := newTopology(t, topologyOptions{})
	first := tp.addr["mcpbridge"].http
	second := tp.startBridgeReplica("mcpbridge-2")
	lb, dir := startNginx(t, first, second)
	endpoint := "http://" + lb + "/mcp"

	connect := func(tok string, opts *mcp.ClientOptions, noStream bool) *mcp.ClientSession {
		t.Helper()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "replica-agent", Version: "1"}, opts).Connect(context.Background(),
			&mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: bearer{tok}}, DisableStandaloneSSE: noStream},
			// Sessions are a matter of the 2025 revisions; 2026-07-28 has none.
			&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
		if err != nil {
			t.Fatalf("MCP connect through nginx: %v\n%s\n%s", err, tp.logOf("mcpbridge"), tp.logOf("mcpbridge-2"))
		}
		t.Cleanup(func() { _ = cs.Close() })
		return cs
	}
	ownerOf := func(cs *mcp.ClientSession) string {
		t.Helper()
		parts := strings.Split(cs.ID(), ".")
		owner := []byte{}
		if len(parts) == 3 {
			owner, _ = base64.RawURLEncoding.DecodeString(parts[1])
		}
		if o := strings.TrimPrefix(string(owner), "http://"); o != first && o != second {
			t.Fatalf("session id %q names %q, neither replica", cs.ID(), owner)
		}
		return strings.TrimPrefix(string(owner), "http://")
	}

	// Reads, with the standalone GET stream open through nginx.
	alice := connect(tp.token("acme", "alice", "support-bot"), nil, false)
	ownerOf(alice)
	for i := range 4 {
		if tools, err := alice.ListTools(context.Background(), nil); err != nil || len(tools.Tools) == 0 {
			t.Fatalf("tools/list %d through nginx: %v", i, err)
		}
		wantSuccess(t, callTool(t, alice, "ticket.search", `{"query":"charged twice"}`, mcp.Meta{"mandate.dev/conversation": "conv-replicas"}))
	}

	// Confirmations by form; no GET stream, so that nothing but the calls
	// and their answers takes turns at the balancer.
	var form approveForm
	carol := connect(tp.token("acme", "carol", "finance-bot"), &mcp.ClientOptions{ElicitationHandler: form.handler}, true)
	carolOwner := ownerOf(carol)
	first25 := callTool(t, carol, "ticket.refund", refundInput, mcp.Meta{"mandate.dev/idempotency_key": "replicas-refund-1"})
	wantSuccess(t, first25)
	if _, err := carol.ListTools(context.Background(), nil); err != nil {
		t.Fatalf("tools/list through nginx: %v", err)
	}
	second10 := callTool(t, carol, "ticket.refund", strings.Replace(refundInput, `"2500"`, `"1000"`, 1),
		mcp.Meta{"mandate.dev/idempotency_key": "replicas-refund-2"})
	wantSuccess(t, second10)
	if len(form.shown) != 2 {
		t.Fatalf("carol was shown %d forms, want 2", len(form.shown))
	}
	tp.wantRefunds(2, 3500)

	// nginx spread the requests over both replicas, and the replica that
	// did not hold a session forwarded its share to the one that did.
	access, err := os.ReadFile(filepath.Join(dir, "access.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, up := range []string{first, second} {
		if !strings.Contains(string(access), " "+up+" ") {
			t.Fatalf("nginx sent nothing to %s:\n%s", up, access)
		}
	}
	// The elicitation answers are the 202 POSTs of carol's session after
	// the first (notifications/initialized), in the order they started.
	answers := acceptedPosts(t, string(access), carol.ID())
	if len(answers) != 3 {
		t.Fatalf("carol's session had %d accepted POSTs, want notifications/initialized and two answers:\n%s", len(answers), access)
	}
	if answers[1] == carolOwner && answers[2] == carolOwner {
		t.Fatalf("both answers went to the session's owner %s; none was forwarded:\n%s", carolOwner, access)
	}
	forwarded := strings.Count(tp.logOf("mcpbridge")+tp.logOf("mcpbridge-2"), "forwarding to the session's owner")
	if forwarded == 0 {
		t.Fatalf("no request was forwarded to its session's owner:\n%s", access)
	}
	t.Logf("nginx: %d requests; %d forwarded between the replicas:\n%s", strings.Count(string(access), "\n"), forwarded, access)
}

// acceptedPosts reads nginx's access log and returns the upstream of each
// POST of a session answered 202, in the order they started.
func acceptedPosts(t *testing.T, access, session string) []string {
	t.Helper()
	type post struct {
		start    float64
		upstream string
	}
	var posts []post
	for _, line := range strings.Split(strings.TrimSpace(access), "\n") {
		f := strings.Fields(line) // msec request_time method status upstream session
		if len(f) != 6 || f[2] != http.MethodPost || f[3] != "202" || f[5] != session {
			continue
		}
		end, err1 := strconv.ParseFloat(f[0], 64)
		took, err2 := strconv.ParseFloat(f[1], 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("access log line %q", line)
		}
		posts = append(posts, post{end - took, f[4]})
	}
	sort.SliceStable(posts, func(i, j int) bool { return posts[i].start < posts[j].start })
	out := make([]string, len(posts))
	for i, p := range posts {
		out[i] = p.upstream
	}
	return out
}

// wantSuccess fails the test on a refused call.
func wantSuccess(t *testing.T, res *mcp.CallToolResult) {
	t.Helper()
	if res.IsError {
		t.Fatalf("call refused: %v", toolRefusal(t, res))
	}
}
