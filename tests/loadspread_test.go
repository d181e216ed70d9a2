package tests

// Client-side balancing as the Helm chart sets it up (issue 30,
// "Kubernetes: load must spread"): the services dial dns:///<name>:<port>
// of a headless Service, whose name resolves to one address per ready pod,
// and spread their calls round robin. Here the names resolve through a DNS
// server of the test's own (internal/dnstest) to loopback addresses —
// 127.0.0.2 and 127.0.0.3 are the executor's two replicas, 127.0.0.4/5 the
// audit service's, 127.0.0.6/7 confirm's, each pair on one port as a
// headless Service's pods are — and gRPC's DNS resolver is pointed at it
// with the target's authority (dns://127.0.0.1:<port>/<name>:<port>), so
// neither /etc/hosts nor the machine's resolver is touched.

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	grpcdns "google.golang.org/grpc/resolver/dns"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/dnstest"
	"github.com/mandate-dev/mandate/internal/identity"
)

// sharedPort returns a TCP port free on each of ips: the replicas behind
// one name listen on one port, as pods behind a headless Service do.
func sharedPort(t *testing.T, ips ...string) string {
	t.Helper()
	for range 50 {
		first, err := net.Listen("tcp", ips[0]+":0")
		if err != nil {
			t.Fatalf("%s is not usable (Linux routes all of 127.0.0.0/8 to lo): %v", ips[0], err)
		}
		_, port, _ := net.SplitHostPort(first.Addr().String())
		ok := true
		var held []net.Listener
		for _, ip := range ips[1:] {
			l, err := net.Listen("tcp", ip+":"+port)
			if err != nil {
				ok = false
				break
			}
			held = append(held, l)
		}
		_ = first.Close()
		for _, l := range held {
			_ = l.Close()
		}
		if ok {
			return port
		}
	}
	t.Fatalf("no port free on all of %v", ips)
	return ""
}

// freePortOn is a free port of ip, as host:port.
func freePortOn(t *testing.T, ip string) string {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// spreadTopology is a topology whose replicated services run on loopback
// addresses behind names of the test's DNS server.
type spreadTopology struct {
	*replicaTopology
	dns      *dnstest.Server
	port     map[string]string   // service → the port its replicas share
	hosts    map[string][]string // service → its replicas' addresses
	launched map[string]endpoint // replica process → its addresses
}

// run launches a replica process and remembers where it listens.
func (st *spreadTopology) run(name, service string, ep endpoint, args []string) error {
	if err := st.launch(name, service, ep, args); err != nil {
		return err
	}
	st.launched[name] = ep
	return nil
}

// startReplicas starts one process of service per address in ips, all on
// one port, named <service>-1, <service>-2…, and makes <service>.mandate.test
// resolve to the addresses. A port taken meanwhile is retried on another.
func (st *spreadTopology) startReplicas(service string, ips []string, args []string) {
	st.t.Helper()
	var err error
	for range 3 {
		port := sharedPort(st.t, ips...)
		var started []string
		err = nil
		for i, ip := range ips {
			name := fmt.Sprintf("%s-%d", service, i+1)
			if err = st.run(name, service, endpoint{grpc: ip + ":" + port, http: freePortOn(st.t, ip)}, args); err != nil {
				break
			}
			started = append(started, name)
		}
		if err == nil {
			st.port[service], st.hosts[service] = port, ips
			st.dns.Set(service+".mandate.test", ips...)
			return
		}
		for _, name := range started {
			st.kill9(name)
		}
		if !strings.Contains(err.Error(), errAddrInUse.Error()) {
			break
		}
	}
	st.t.Fatal(err)
}

// target is the dns:// target of a replicated service.
func (st *spreadTopology) target(service string) string {
	return st.dns.Target(service+".mandate.test", st.port[service])
}

// counter sums the samples of a Prometheus metric on one process's
// /metrics whose line contains every one of match.
func counter(t *testing.T, httpAddr, metric string, match ...string) int {
	t.Helper()
	code, body := scrapeMetrics(t, "http://"+httpAddr)
	if code != 200 {
		t.Fatalf("GET %s/metrics: %d", httpAddr, code)
	}
	total := 0.0
lines:
	for l := range strings.SplitSeq(body, "\n") {
		if !strings.HasPrefix(l, metric+"{") && !strings.HasPrefix(l, metric+" ") {
			continue
		}
		for _, m := range match {
			if !strings.Contains(l, m) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q", l)
		}
		total += v
	}
	return int(total)
}

// spreadCall is one call through the balanced connection: which replica
// answered it, and the errors of the attempts before the one that did.
type spreadCall struct {
	served  string
	retried []error
	err     error
}

// TestLoadSpreadsOverReplicasByDNS: the executor's gRPC clients — the
// bridge's dialer, which this test uses, and the executor's own to audit
// and confirm — spread over every address a name resolves to.
//
//   - Scale-out: with one executor behind the name, a second one is
//     started and added to the DNS records; the executors renew
//     connections after --grpc-max-connection-age=1s, the client
//     re-resolves, and the new replica gets calls.
//   - Spread: 2,000 ticket.search calls over the one client connection,
//     each executor serving more than 20 %; meanwhile each executor's audit
//     append streams (renewed every 200 ms) spread over the two audit
//     replicas, and 200 refunds that need approval spread their
//     ConfirmService.Open calls over the two confirm replicas.
//   - Failure: one executor is killed (SIGKILL) under 8 concurrent
//     callers; the calls it was serving fail Unavailable and are retried
//     once, the others never fail, and everything after the kill is served
//     by the survivor.
func TestLoadSpreadsOverReplicasByDNS(t *testing.T) {
	tp := newTopology(t, topologyOptions{noServices: true})
	st := &spreadTopology{replicaTopology: &replicaTopology{topology: tp}, dns: dnstest.Start(t),
		port: map[string]string{}, hosts: map[string][]string{}, launched: map[string]endpoint{}}
	// The test is the only client whose re-resolution it waits for: let
	// its resolver ask again at once when a connection ends rather than
	// after gRPC's 30 s minimum (the services' own clients keep it).
	grpcdns.SetMinResolutionInterval(100 * time.Millisecond)
	t.Cleanup(func() { grpcdns.SetMinResolutionInterval(30 * time.Second) })

	tp.startAll(spec{name: "helpdesk"})
	st.startReplicas("audit", []string{"127.0.0.4", "127.0.0.5"}, nil)
	st.startReplicas("confirm", []string{"127.0.0.6", "127.0.0.7"}, nil)
	st.startReplicas("catalog", []string{"127.0.0.8", "127.0.0.9"}, nil)
	executorArgs := []string{
		"--audit-addr", st.target("audit"), "--confirm-addr", st.target("confirm"),
		"--backend", "examples.helpdesk.v1.HelpdeskService=" + tp.addr["helpdesk"].grpc + ",mandate.v1.CatalogService=" + st.target("catalog"),
		"--audit-stream-max-age", "200ms",
		"--grpc-max-connection-age", "1s", "--grpc-max-connection-age-grace", "30s",
	}
	// One executor first; the second joins later, on the same port.
	executors := []string{"127.0.0.2", "127.0.0.3"}
	port := sharedPort(t, executors...)
	st.port["executor"] = port
	if err := st.run("executor-1", "executor", endpoint{grpc: executors[0] + ":" + port, http: freePortOn(t, executors[0])}, executorArgs); err != nil {
		t.Fatal(err)
	}
	st.dns.Set("executor.mandate.test", executors[0])

	// The client: the dialer the bridge dials the executor with, as the
	// bridge's service identity, relaying alice's token.
	src, err := identity.NewServiceTokenSource([]byte(serviceSecret), "mandate-dev", "mandate", identity.MCPBridgeService, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var cl clicore.Closers
	t.Cleanup(cl.Close)
	conn, err := clicore.NewDialer(src, "", clicore.DefaultKeepaliveTime, &cl).Service(st.target("executor"))
	if err != nil {
		t.Fatal(err)
	}
	exec := mandatev1.NewExecutorServiceClient(conn)
	ctx, cancel := context.WithTimeout(identity.WithRawToken(t.Context(), tp.token("acme", "alice", "")), 5*time.Minute)
	defer cancel()
	search, err := structpb.NewStruct(map[string]any{"query": "charged twice"})
	if err != nil {
		t.Fatal(err)
	}
	// call makes one search; a call that fails Unavailable (its replica
	// went away under it) is retried once, as the bridge's caller would.
	call := func() spreadCall {
		var c spreadCall
		for attempt := 0; attempt < 2; attempt++ {
			var p peer.Peer
			_, err := exec.Execute(ctx, &mandatev1.ExecuteRequest{Code: "ticket.search", Input: search}, grpc.Peer(&p))
			if err == nil {
				c.served, _, _ = net.SplitHostPort(p.Addr.String())
				return c
			}
			if status.Code(err) != codes.Unavailable || attempt == 1 {
				c.err = err
				return c
			}
			c.retried = append(c.retried, err)
		}
		return c
	}
	// load makes n calls from workers goroutines; after first calls, once,
	// it runs during (and waits for it).
	load := func(n, workers, first int, during func()) (served map[string]int, retried []error, failed []error) {
		var mu sync.Mutex
		served = map[string]int{}
		var done int
		var once sync.Once
		jobs := make(chan struct{})
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range jobs {
					c := call()
					mu.Lock()
					done++
					if c.served != "" {
						served[c.served]++
					}
					retried = append(retried, c.retried...)
					if c.err != nil {
						failed = append(failed, c.err)
					}
					reached := during != nil && done == first
					mu.Unlock()
					if reached {
						once.Do(during)
					}
				}
			})
		}
		for range n {
			jobs <- struct{}{}
		}
		close(jobs)
		wg.Wait()
		return served, retried, failed
	}

	// Scale-out.
	if served, _, failed := load(50, 1, 0, nil); served[executors[0]] != 50 || len(failed) != 0 {
		t.Fatalf("one executor: served %v, failed %v", served, failed)
	}
	if err := st.run("executor-2", "executor", endpoint{grpc: executors[1] + ":" + port, http: freePortOn(t, executors[1])}, executorArgs); err != nil {
		t.Fatal(err)
	}
	st.dns.Set("executor.mandate.test", executors...)
	var before int
	for served := map[string]int{}; served[executors[1]] == 0; before++ {
		if before == 3000 {
			t.Fatalf("after %d calls the new executor has served none: %v", before, served)
		}
		c := call()
		if c.err != nil || len(c.retried) != 0 {
			t.Fatalf("call %d during the scale-out: %v (retried after %v)", before, c.err, c.retried)
		}
		served[c.served]++
	}
	t.Logf("scale-out: the executor added to the name served a call after %d calls, none failed", before)

	// Spread, and the executor's own calls to audit and confirm.
	audit := func() (rows [2]int) {
		for i := range rows {
			rows[i] = counter(t, st.direct("audit-"+strconv.Itoa(i+1)).http, "mandate_audit_records_total")
		}
		return rows
	}
	opens := func() (n [2]int) {
		for i := range n {
			n[i] = counter(t, st.direct("confirm-"+strconv.Itoa(i+1)).http, "rpc_server_call_duration_seconds_count", `rpc_method="mandate.v1.ConfirmService/Open"`)
		}
		return n
	}
	rows0, opens0 := audit(), opens()
	served, retried, failed := load(2000, 8, 0, nil)
	if len(failed) != 0 || len(retried) != 0 {
		t.Fatalf("2,000 calls with both executors up: %d failed (%v), %d retried (%v)", len(failed), failed, len(retried), retried)
	}
	for _, ip := range executors {
		if share := served[ip] * 100 / 2000; share <= 20 {
			t.Errorf("executor %s served %d of 2,000 calls (%d%%): %v", ip, served[ip], share, served)
		}
	}
	t.Logf("2,000 calls: %s %d (%d%%), %s %d (%d%%); failed 0, retried 0", executors[0], served[executors[0]], served[executors[0]]*100/2000,
		executors[1], served[executors[1]], served[executors[1]]*100/2000)
	bot := identity.WithRawToken(t.Context(), tp.token("acme", "carol", "finance-bot"))
	refund := &structpb.Struct{}
	if err := protojson.Unmarshal([]byte(refundInput), refund); err != nil {
		t.Fatal(err)
	}
	// Each asks ConfirmService.Open once: the first 20 open a challenge,
	// the others are refused there, since a caller may have at most 20
	// waiting.
	for i := range 200 {
		_, err := exec.Execute(bot, &mandatev1.ExecuteRequest{Code: "ticket.refund", Input: refund})
		if _, reason, _ := refusalOf(t, err); reason != "confirmation.required" && reason != "confirmation.too_many_open" {
			t.Fatalf("refund %d: %v, want confirmation.required or, past 20, confirmation.too_many_open (both answered by confirm)", i, err)
		}
	}
	// The audit writers commit in the background: wait (bounded) for the
	// rows of 2,000 searches and 200 refusals, one row each at least.
	var rows [2]int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r := audit()
		rows = [2]int{r[0] - rows0[0], r[1] - rows0[1]}
		if rows[0]+rows[1] >= 2200 || time.Now().After(deadline) {
			break
		}
	}
	o := opens()
	open := [2]int{o[0] - opens0[0], o[1] - opens0[1]}
	for i := range 2 {
		if rows[i]*100/(rows[0]+rows[1]) <= 20 {
			t.Errorf("audit replica %s committed %d of %d rows", st.hosts["audit"][i], rows[i], rows[0]+rows[1])
		}
		if open[i]*100/200 <= 20 {
			t.Errorf("confirm replica %s served %d of 200 Open calls (%v)", st.hosts["confirm"][i], open[i], open)
		}
	}
	t.Logf("the executors' audit rows: %s %d, %s %d; their ConfirmService.Open calls: %s %d, %s %d",
		st.hosts["audit"][0], rows[0], st.hosts["audit"][1], rows[1], st.hosts["confirm"][0], open[0], st.hosts["confirm"][1], open[1])

	// The bridge's own connections to the executor and the catalog.
	tp.startAll(spec{name: "mcpbridge", args: []string{
		"--executor-addr", st.target("executor"), "--catalog-addr", st.target("catalog"), "--confirm-addr", st.target("confirm"),
	}})
	rpcs := func(service, method string) (n [2]int) {
		for i := range n {
			n[i] = counter(t, st.direct(service+"-"+strconv.Itoa(i+1)).http, "rpc_server_call_duration_seconds_count", `rpc_method="`+method+`"`)
		}
		return n
	}
	executes0 := rpcs("executor", "mandate.v1.ExecutorService/Execute")
	// Every principal's session has the bridge list its tools once and
	// watch them (a stream) while it lasts: eight principals, sixteen
	// catalog calls to spread.
	principals := [][3]string{{"acme", "alice", ""}, {"acme", "bob", ""}, {"acme", "carol", ""}, {"acme", "olive", ""},
		{"acme", "alice", "support-bot"}, {"acme", "carol", "finance-bot"}, {"acme", "carol", "payout-bot"}, {"globex", "dave", ""}}
	var sessions []*mcp.ClientSession
	for _, p := range principals {
		cs := tp.mcpSession(tp.token(p[0], p[1], p[2]), nil)
		if _, err := cs.ListTools(ctx, nil); err != nil {
			t.Fatalf("tools/list as %v: %v", p, err)
		}
		sessions = append(sessions, cs)
	}
	for range 100 {
		wantSuccess(t, callTool(t, sessions[0], "ticket.search", `{"query":"charged twice"}`, nil))
	}
	executes := rpcs("executor", "mandate.v1.ExecutorService/Execute")
	// A stream is counted once it ends: the bridge stops, and its watches
	// with it.
	for _, cs := range sessions {
		_ = cs.Close()
	}
	bridge := tp.process("mcpbridge")
	bridge.stopped = true
	_ = bridge.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-bridge.done:
		if err != nil {
			t.Fatalf("the bridge did not stop cleanly: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the bridge did not stop within 20 s")
	}
	lists, watches := rpcs("catalog", "mandate.v1.CatalogService/ListTools"), rpcs("catalog", "mandate.v1.CatalogService/Watch")
	catalogCalls := [2]int{lists[0] + watches[0], lists[1] + watches[1]}
	for i := range 2 {
		if d := executes[i] - executes0[i]; d <= 20 {
			t.Errorf("executor-%d served %d of the bridge's 100 calls (%v → %v)", i+1, d, executes0, executes)
		}
		if catalogCalls[i]*100/(catalogCalls[0]+catalogCalls[1]) <= 20 {
			t.Errorf("catalog-%d served %d of the bridge's catalog calls (ListTools %v, Watch %v)", i+1, catalogCalls[i], lists, watches)
		}
	}
	t.Logf("the bridge's 100 tools/call: executor-1 %d, executor-2 %d; its catalog calls (ListTools + Watch) for 8 principals: catalog-1 %d + %d, catalog-2 %d + %d",
		executes[0]-executes0[0], executes[1]-executes0[1], lists[0], watches[0], lists[1], watches[1])

	// Failure: executor-2 is killed after 200 of 1,000 calls.
	killed := make(chan struct{})
	served, retried, failed = load(1000, 8, 200, func() { st.kill9("executor-2"); close(killed) })
	<-killed
	if len(failed) != 0 {
		t.Fatalf("%d calls failed after their retry: %v", len(failed), failed)
	}
	for _, err := range retried {
		if status.Code(err) != codes.Unavailable {
			t.Errorf("a retried call failed with %v", err)
		}
	}
	if len(retried) > 8 {
		t.Errorf("%d calls retried; at most the 8 in flight on the killed replica should be", len(retried))
	}
	after, _, failedAfter := load(300, 8, 0, nil)
	if after[executors[0]] != 300 || len(failedAfter) != 0 {
		t.Errorf("after the kill: served %v, failed %v", after, failedAfter)
	}
	t.Logf("kill -9 of %s after 200 of 1,000 calls: served %v; %d failed and were retried (all Unavailable), 0 failed after the retry; the next 300 calls all on %s",
		executors[1], served, len(retried), executors[0])
}

// direct is the endpoint a replica process was launched on.
func (st *spreadTopology) direct(name string) endpoint {
	st.t.Helper()
	ep, ok := st.launched[name]
	if !ok {
		st.t.Fatalf("no replica %s", name)
	}
	return ep
}
