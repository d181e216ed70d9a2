package tests

// The harness of the sample scenarios (issue #7 item 5): a topology of
// Postgres-backed services as separate processes on loopback, started the
// way deploy/compose starts them, and clients that drive it over MCP (the
// official go-sdk client, through the mcpbridge process), REST (net/http)
// and gRPC (the generated clients, against the executor's governed proxy).
// Every scenario test gets a topology of its own, so the payment gateway's
// counters and the audit trail it reads belong to that test alone.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

// The model the demo agents run as; it must reach the audit rows.
const (
	scenarioModel        = "claude-sonnet-4"
	scenarioModelVersion = "20250514"
)

// refundInput is the declared example of ticket.refund: 25.00 EUR on
// acme's T-1001 (paid 49.90 EUR), with a sensitive cardholder reference.
const refundInput = `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"2500"},"reason":"Customer was charged twice","cardholder_reference":"CH4242424242"}`

// cardholderReference must never reach an audit row.
const cardholderReference = "CH4242424242"

// topology is one Postgres database and the suite's processes on it.
type topology struct {
	t      *testing.T
	root   string
	bin    string
	env    []string
	logDir string
	db     *pgxpool.Pool

	mu    sync.Mutex
	addr  map[string]endpoint
	procs []*process

	conns sync.Map // gRPC address → *grpc.ClientConn
}

// endpoint is where one process listens.
type endpoint struct{ grpc, http string }

// process is one running service.
type process struct {
	name    string
	cmd     *exec.Cmd
	done    chan error
	log     *os.File
	stopped bool
}

// topologyOptions tune a topology.
type topologyOptions struct {
	// env is added to every process's environment (e.g. the OTLP endpoint).
	env []string
	// executorArgs are added to the executor's flags.
	executorArgs []string
	// databaseURL, when set, is the (empty) database the services use
	// instead of a fresh one on the shared test server.
	databaseURL string
	// noServices stops after migrate and policy apply: the test starts
	// the services itself (e.g. in replicas).
	noServices bool
	// policy is the policy file applied instead of examples/policy/demo.yaml.
	policy string
}

// newTopology builds the binary, creates a fresh database, runs
// `mandate migrate` and `mandate policy apply -f examples/policy/demo.yaml`
// and starts audit, confirm, the helpdesk backend, catalog, the executor and
// the MCP bridge, each as its own process. Everything stops when the test
// ends; a process that does not stop cleanly on SIGTERM fails the test.
func newTopology(t *testing.T, opts topologyOptions) *topology {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary and runs the services as processes")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	pool, url := topologyDatabase(t, opts.databaseURL)
	tp := &topology{
		t: t, root: root, db: pool, logDir: t.TempDir(), addr: map[string]endpoint{},
	}
	tp.bin = mandateBinary(t, root)
	// The settings deploy/compose gives every service.
	tp.env = append(os.Environ(),
		"MANDATE_DATABASE_URL="+url,
		"MANDATE_DEV_SECRET="+devSecret,
		"MANDATE_SERVICE_SECRET="+serviceSecret,
		"MANDATE_LOG_LEVEL=debug",
		// No service falls back to the sample: it is asked for by name.
		"MANDATE_MANIFEST=sample",
	)
	tp.env = append(tp.env, opts.env...)
	t.Cleanup(tp.stop)
	t.Cleanup(func() {
		tp.conns.Range(func(_, c any) bool {
			_ = c.(*grpc.ClientConn).Close()
			return true
		})
	})

	tp.run("migrate", "--sample")
	policy := filepath.Join(root, "examples", "policy", "demo.yaml")
	if opts.policy != "" {
		policy = opts.policy
	}
	tp.run("policy", "apply", "-f", policy)
	if opts.noServices {
		return tp
	}

	// The services that depend on nothing but the database start together;
	// then confirm, which appends its decision rows to audit.
	tp.startAll(
		spec{name: "audit"},
		spec{name: "helpdesk"},
		spec{name: "catalog"},
	)
	tp.startAll(spec{name: "confirm", args: []string{"--audit-addr", tp.addr["audit"].grpc}})
	tp.startAll(spec{name: "executor", args: tp.executorArgs(opts.executorArgs...)})
	tp.startAll(spec{name: "mcpbridge", args: []string{
		"--executor-addr", tp.addr["executor"].grpc,
		"--catalog-addr", tp.addr["catalog"].grpc,
		"--confirm-addr", tp.addr["confirm"].grpc,
		"--audit-addr", tp.addr["audit"].grpc,
	}})
	return tp
}

// The scenario tests share one build of the binary: linking it takes
// seconds, starting the services a fraction of one. It lives in a directory
// named after this test process, and directories of processes that have
// exited are removed by the next run.
var shared struct {
	once sync.Once
	bin  string
	err  error
}

func mandateBinary(t *testing.T, root string) string {
	t.Helper()
	shared.once.Do(func() {
		prefix := filepath.Join(os.TempDir(), "mandate-e2e-")
		stale, _ := filepath.Glob(prefix + "*")
		for _, dir := range stale {
			pid, err := strconv.Atoi(strings.TrimPrefix(dir, prefix))
			if err == nil && pid != os.Getpid() && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
				_ = os.RemoveAll(dir)
			}
		}
		dir := prefix + strconv.Itoa(os.Getpid())
		if shared.err = os.MkdirAll(dir, 0o700); shared.err != nil {
			return
		}
		shared.bin = filepath.Join(dir, "mandate")
		build := exec.Command("go", "build", "-o", shared.bin, "./cmd/mandate")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			shared.err = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.bin
}

// run runs a one-shot subcommand and returns its output.
func (tp *topology) run(args ...string) string {
	tp.t.Helper()
	cmd := exec.Command(tp.bin, args...)
	cmd.Env = tp.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		tp.t.Fatalf("mandate %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// spec names a service to start and its own flags.
type spec struct {
	name string
	args []string
}

// startAll starts services concurrently and waits until each answers
// /healthz.
func (tp *topology) startAll(specs ...spec) {
	tp.t.Helper()
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, s := range specs {
		wg.Go(func() { errs[i] = tp.start(s) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		tp.t.Fatal(err)
	}
}

// start runs one service and waits until it answers /healthz. A port
// taken by some other process between freePort and the service's listen is
// retried on fresh ports.
func (tp *topology) start(s spec) error {
	var err error
	for range 3 {
		if err = tp.startOnce(s); !errors.Is(err, errAddrInUse) {
			return err
		}
	}
	return err
}

// errAddrInUse marks a service that exited because its port was taken.
var errAddrInUse = errors.New("address already in use")

func (tp *topology) startOnce(s spec) error {
	grpcAddr, httpAddr := freePort(tp.t), freePort(tp.t)
	log, err := os.Create(filepath.Join(tp.logDir, s.name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(tp.bin, append([]string{s.name, "--grpc-addr", grpcAddr, "--http-addr", httpAddr}, s.args...)...)
	cmd.Env, cmd.Stdout, cmd.Stderr = tp.env, log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("starting %s: %w", s.name, err)
	}
	p := &process{name: s.name, cmd: cmd, done: make(chan error, 1), log: log}
	go func() { p.done <- cmd.Wait() }()
	tp.mu.Lock()
	tp.procs = append(tp.procs, p)
	tp.addr[s.name] = endpoint{grpc: grpcAddr, http: httpAddr}
	tp.mu.Unlock()

	err = awaitHealthy(s.name, httpAddr, p.done, func() string { return tp.logOf(s.name) })
	if errors.Is(err, errAddrInUse) {
		tp.forget(p)
	}
	return err
}

// awaitHealthy polls http://httpAddr/healthz until it answers 200, the
// process exits (its exit status is put back on done) or 30 s pass; output
// is what the process printed. A process that exited because one of its
// ports was taken yields errAddrInUse.
func awaitHealthy(name, httpAddr string, done chan error, output func() string) error {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-done:
			done <- err
			out := output()
			if strings.Contains(out, "address already in use") {
				return fmt.Errorf("%s: %w", name, errAddrInUse)
			}
			return fmt.Errorf("%s exited before it became healthy (%w):\n%s", name, err, out)
		default:
		}
		resp, err := client.Get("http://" + httpAddr + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s never became healthy:\n%s", name, output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// forget drops a process that exited on start from the topology.
func (tp *topology) forget(p *process) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for i, q := range tp.procs {
		if q == p {
			tp.procs = append(tp.procs[:i], tp.procs[i+1:]...)
			break
		}
	}
	_ = p.log.Close()
}

func (tp *topology) logOf(name string) string {
	b, _ := os.ReadFile(filepath.Join(tp.logDir, name+".log"))
	return tail(string(b), 6000)
}

// stop sends SIGTERM to every process, newest first, and waits for each to
// exit; it flushes what the processes buffer (spans) and is idempotent.
func (tp *topology) stop() {
	tp.mu.Lock()
	procs := slices.Clone(tp.procs)
	tp.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		p := procs[i]
		if p.stopped {
			continue
		}
		p.stopped = true
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-p.done:
			if err != nil {
				tp.t.Errorf("%s did not stop cleanly: %v", p.name, err)
			}
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			tp.t.Errorf("%s did not stop within 20s (killed: %v)", p.name, <-p.done)
		}
		_ = p.log.Close()
		if tp.t.Failed() {
			tp.t.Logf("--- %s log ---\n%s", p.name, tp.logOf(p.name))
		}
	}
}

// orgs are the users' orgs as examples/policy/demo.yaml has them (sam is
// the lead TestScenarioApproveBySubmitter adds); the identity provider puts
// them in the token, and the helpdesk scopes approvals by them.
var orgs = map[string]string{
	"acme/alice": "support", "acme/bob": "support", "acme/carol": "finance", "acme/olive": "ops",
	"acme/sam": "support", "globex/dave": "support",
}

// token mints a token the processes accept: a user's, or with agent set an
// agent's acting for the user (running scenarioModel).
func (tp *topology) token(tenant, user, agent string) string {
	tp.t.Helper()
	r := identity.MintRequest{Issuer: "mandate-dev", Audience: "mandate", User: user, Tenant: tenant, Org: orgs[tenant+"/"+user], TTL: time.Hour}
	if agent != "" {
		r.Agent, r.Model, r.ModelVersion = agent, scenarioModel, scenarioModelVersion
	}
	tok, err := identity.MintDev([]byte(devSecret), r)
	if err != nil {
		tp.t.Fatal(err)
	}
	return tok
}

// conn is a gRPC connection to a service's port (shared per address).
func (tp *topology) conn(service string) *grpc.ClientConn {
	tp.t.Helper()
	addr := tp.addr[service].grpc
	if c, ok := tp.conns.Load(addr); ok {
		return c.(*grpc.ClientConn)
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tp.t.Fatal(err)
	}
	if prev, loaded := tp.conns.LoadOrStore(addr, c); loaded {
		_ = c.Close()
		return prev.(*grpc.ClientConn)
	}
	return c
}

// as returns a context, ending with the test, whose gRPC calls carry tok
// and the metadata pairs kv.
func (tp *topology) as(tok string, kv ...string) context.Context {
	return metadata.AppendToOutgoingContext(tp.t.Context(), append([]string{"authorization", "Bearer " + tok}, kv...)...)
}

// restResponse is what a REST call answered.
type restResponse struct {
	status      int
	contentType string
	body        map[string]any
	raw         string
}

// rest calls a service's HTTP port: method, path (from the root), bearer
// token, JSON body and extra headers as pairs.
func (tp *topology) rest(service, method, path, tok, body string, headers ...string) restResponse {
	tp.t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, "http://"+tp.addr[service].http+path, strings.NewReader(body))
	if err != nil {
		tp.t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tp.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	r := restResponse{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), raw: string(b)}
	_ = json.Unmarshal(b, &r.body)
	return r
}

// mcpSession connects the official MCP client to the bridge with a bearer
// token. opts may set handlers (an ElicitationHandler declares the
// elicitation capability).
func (tp *topology) mcpSession(tok string, opts *mcp.ClientOptions) *mcp.ClientSession {
	tp.t.Helper()
	ep := tp.addr["mcpbridge"]
	client := mcp.NewClient(&mcp.Implementation{Name: "scenario-agent", Version: "1"}, opts)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint:   "http://" + ep.http + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{tok}},
	}, nil)
	if err != nil {
		tp.t.Fatalf("MCP connect: %v\n%s", err, tp.logOf("mcpbridge"))
	}
	tp.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// callTool runs tools/call; a JSON-RPC error fails the test.
func callTool(t *testing.T, cs *mcp.ClientSession, name, args string, meta mcp.Meta) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: json.RawMessage(args), Meta: meta})
	if err != nil {
		t.Fatalf("tools/call %s: %v", name, err)
	}
	return res
}

// structured returns a tool result's structuredContent as a map.
func structured(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("structuredContent %s: %v", b, err)
	}
	return m
}

// toolRefusal returns an isError tool result's refusal, read from its
// `_meta` (mandate.dev/refusal); such a result never carries
// structuredContent, which clients validate against the tool's
// outputSchema.
func toolRefusal(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	if res.StructuredContent != nil {
		t.Fatalf("an isError result carries structuredContent: %v", res.StructuredContent)
	}
	b, err := json.Marshal(res.Meta["mandate.dev/refusal"])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		t.Fatalf("_meta mandate.dev/refusal %s: %v", b, err)
	}
	return m
}

// wantToolRefusal checks an isError tool result's code and stage and
// returns its refusal.
func wantToolRefusal(t *testing.T, res *mcp.CallToolResult, stage, code string) map[string]any {
	t.Helper()
	m := toolRefusal(t, res)
	if !res.IsError || m["stage"] != stage || m["code"] != code || m["invocation_id"] == "" {
		t.Fatalf("tool result: isError=%v %v; want %s at %s", res.IsError, m, code, stage)
	}
	return m
}

// refusalOf reads a gRPC error's status code, ErrorInfo reason and
// mandate.v1.CommandError detail.
func refusalOf(t *testing.T, err error) (codes.Code, string, *mandatev1.CommandError) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || err == nil {
		t.Fatalf("not a gRPC refusal: %v", err)
	}
	var reason string
	var ce *mandatev1.CommandError
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.GetReason()
		case *mandatev1.CommandError:
			ce = d
		}
	}
	if ce == nil {
		t.Fatalf("no CommandError in %v", err)
	}
	return st.Code(), reason, ce
}

// wantGRPCRefusal checks a refusal of the pipeline over gRPC: status code,
// the same code in ErrorInfo and CommandError, the stage, and an
// invocation id.
func wantGRPCRefusal(t *testing.T, err error, grpcCode codes.Code, stage, code string) *mandatev1.CommandError {
	t.Helper()
	ce := wantGRPCError(t, err, grpcCode, stage, code)
	if ce.GetInvocationId() == "" {
		t.Fatalf("refusal without an invocation id: %v", ce)
	}
	return ce
}

// wantGRPCError checks a Mandate service's gRPC error: status code, the
// same code in ErrorInfo and CommandError, and the stage.
func wantGRPCError(t *testing.T, err error, grpcCode codes.Code, stage, code string) *mandatev1.CommandError {
	t.Helper()
	c, reason, ce := refusalOf(t, err)
	if c != grpcCode || reason != code || ce.GetCode() != code || ce.GetStage() != stage {
		t.Fatalf("refusal %v (reason %q, %v); want %v %s at %s", c, reason, ce, grpcCode, code, stage)
	}
	return ce
}

// wantProblem checks a REST refusal: status, RFC 9457 content type, code,
// stage, and an invocation id.
func wantProblem(t *testing.T, r restResponse, httpStatus int, stage, code string) {
	t.Helper()
	if r.status != httpStatus || r.contentType != "application/problem+json" || r.body["code"] != code || r.body["stage"] != stage || r.body["invocation_id"] == "" {
		t.Fatalf("REST answer %d %q %s; want %d problem+json %s at %s", r.status, r.contentType, r.raw, httpStatus, code, stage)
	}
}

// gateway reads the helpdesk process's fake payment gateway counters.
func (tp *topology) gateway() helpdesk.GatewayCounters {
	tp.t.Helper()
	r := tp.rest("helpdesk", http.MethodGet, "/gateway/counters", "", "")
	var c helpdesk.GatewayCounters
	if r.status != http.StatusOK || json.Unmarshal([]byte(r.raw), &c) != nil {
		tp.t.Fatalf("gateway counters: %d %s", r.status, r.raw)
	}
	return c
}

// wantRefunds checks that the gateway moved exactly n refunds of eurMinor
// EUR in total, and that the backend booked n refunds.
func (tp *topology) wantRefunds(n int, eurMinor int64) {
	tp.t.Helper()
	c := tp.gateway()
	if c.Refunds != n || c.Moved["EUR"] != eurMinor {
		tp.t.Fatalf("payment gateway: %d refunds moving %v; want %d moving %d EUR minor", c.Refunds, c.Moved, n, eurMinor)
	}
	if booked := tp.count(`SELECT count(*) FROM helpdesk.refunds`); booked != n {
		tp.t.Fatalf("%d refunds booked by the backend, want %d", booked, n)
	}
}

// count runs a counting query on the topology's database.
func (tp *topology) count(sql string, args ...any) int {
	tp.t.Helper()
	var n int
	if err := tp.db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tp.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// challenges counts the confirmation challenges ever opened in a tenant.
func (tp *topology) challenges(tenant string) int {
	return tp.count(`SELECT count(*) FROM confirm.challenges WHERE tenant = $1`, tenant)
}

// auditor is olive, acme's auditor (audit.read).
func (tp *topology) auditor() context.Context { return tp.as(tp.token("acme", "olive", "")) }

// invocationRows reads an acme invocation's audit rows through
// AuditService.Get (as olive), waiting until want rows are there (the
// outcome row is written after the reply), and fails unless exactly want
// rows are.
func (tp *topology) invocationRows(invocation string, want int) []*mandatev1.AuditRecord {
	tp.t.Helper()
	client := mandatev1.NewAuditServiceClient(tp.conn("audit"))
	var rows []*mandatev1.AuditRecord
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := client.Get(tp.auditor(), &mandatev1.GetRequest{InvocationId: invocation})
		if err != nil && status.Code(err) != codes.NotFound {
			tp.t.Fatalf("audit Get %s: %v", invocation, err)
		}
		rows = resp.GetRecords()
		if len(rows) >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(rows) != want {
		tp.t.Fatalf("invocation %s has %d audit rows, want %d: %v", invocation, len(rows), want, rows)
	}
	for _, r := range rows {
		if strings.Contains(r.GetArgumentsJson(), cardholderReference) || strings.Contains(r.GetMessage(), cardholderReference) {
			tp.t.Fatalf("the sensitive cardholder reference reached an audit row: %v", r)
		}
	}
	return rows
}

// query runs AuditService.Query as olive and returns every matching acme
// row (all pages).
func (tp *topology) query(req *mandatev1.QueryRequest) []*mandatev1.AuditRecord {
	tp.t.Helper()
	client := mandatev1.NewAuditServiceClient(tp.conn("audit"))
	var rows []*mandatev1.AuditRecord
	for {
		resp, err := client.Query(tp.auditor(), req)
		if err != nil {
			tp.t.Fatalf("audit Query: %v", err)
		}
		rows = append(rows, resp.GetRecords()...)
		if resp.GetNextPageToken() == "" {
			return rows
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// outcome checks the last row of an invocation: the outcome phase with
// the given outcome, stage and code.
func outcome(t *testing.T, rows []*mandatev1.AuditRecord, outcome, stage, code string) *mandatev1.AuditRecord {
	t.Helper()
	last := rows[len(rows)-1]
	if last.GetPhase() != "outcome" || last.GetOutcome() != outcome || last.GetStage() != stage || last.GetCode() != code {
		t.Fatalf("outcome row %v; want %s %s %s", last, outcome, stage, code)
	}
	if len(rows) == 2 && (rows[0].GetPhase() != "intent" || rows[0].GetOutcome() != "pending") {
		t.Fatalf("first row %v; want the intent", rows[0])
	}
	return last
}

// otherTenantRows reads a tenant's trail with the operator tool (`mandate
// audit query`), for tenants without an auditor in the demo directory.
func (tp *topology) otherTenantRows(tenant string) []map[string]any {
	tp.t.Helper()
	out := tp.run("audit", "query", "--tenant", tenant, "--format", "json", "--limit", "1000")
	var page struct {
		Records []map[string]any `json:"records"`
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		tp.t.Fatalf("%v\n%s", err, out)
	}
	return page.Records
}

// jsonOf renders v compactly for messages and substring checks.
func jsonOf(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return strings.TrimSpace(b.String())
}

// topologyDatabase is a fresh database on the shared test server, or the
// one url names.
func topologyDatabase(t *testing.T, url string) (*pgxpool.Pool, string) {
	t.Helper()
	if url == "" {
		return pgtest.NewURL(t)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, url
}
