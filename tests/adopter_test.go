package tests

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The inventory sample (examples/inventory) is a module of its own, built
// the way docs/adopting.md tells an adopter: its own buf config, Mandate's
// protos from `mandate proto export`, a backend on pkg/backend and
// pkg/receipt, a policy file. These tests build it from outside this
// module and drive it end to end, on `mandate dev` and on the separate
// services over Postgres.

// inventoryBins builds the sample's backend and its gRPC client in the
// sample's own module, after checking that its generated code is what its
// buf config generates.
func inventoryBins(t *testing.T) (dir, backend, ctl string) {
	t.Helper()
	root, _ := filepath.Abs("..")
	dir = filepath.Join(root, "examples", "inventory")
	out := t.TempDir()
	regen := exec.Command("go", "tool", "-modfile="+filepath.Join(root, "tools", "go.mod"), "buf", "generate", "-o", out)
	regen.Dir = dir
	if b, err := regen.CombinedOutput(); err != nil {
		t.Fatalf("buf generate in examples/inventory: %v\n%s", err, b)
	}
	for _, f := range []string{"gen/inventory/v1/inventory.pb.go", "gen/inventory/v1/inventory_grpc.pb.go", "gen/manifest/manifest.json", "gen/manifest/descriptors.binpb"} {
		want, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, f)); string(got) != string(want) {
			t.Fatalf("examples/inventory/%s is not what its buf config generates: run buf generate there", f)
		}
	}
	exported := t.TempDir()
	if b, err := exec.Command(mandateBinary(t, root), "proto", "export", exported).CombinedOutput(); err != nil {
		t.Fatalf("mandate proto export: %v\n%s", err, b)
	}
	if err := sameTree(exported, filepath.Join(dir, "third_party", "mandate")); err != nil {
		t.Fatalf("examples/inventory/third_party/mandate is not what `mandate proto export` writes: run `mandate proto export --force third_party/mandate` there: %v", err)
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/inventory", "./cmd/inventoryctl")
	build.Dir = dir
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building examples/inventory in its own module: %v\n%s", err, b)
	}
	return dir, filepath.Join(bin, "inventory"), filepath.Join(bin, "inventoryctl")
}

// startInventory runs the sample's backend with the secrets the executor
// signs with and returns its address.
func startInventory(t *testing.T, bin, serviceSecret, devSecret string) string {
	t.Helper()
	addr := freePort(t)
	cmd := exec.Command(bin, "--listen", addr)
	cmd.Env = append(os.Environ(), "MANDATE_SERVICE_SECRET="+serviceSecret, "MANDATE_DEV_SECRET="+devSecret)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(15 * time.Second); ; {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			_ = c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("the inventory backend does not listen on %s:\n%s", addr, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// inventoryDeployment is where a test reaches one deployment of the sample.
type inventoryDeployment struct {
	mcp, rest, grpc, confirmREST, auditREST string
	sam, bot, cora                          string
	ctl                                     string
}

// ctlRun runs inventoryctl against the executor and returns its output.
func (d inventoryDeployment) ctlRun(t *testing.T, token string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(d.ctl, append([]string{"--addr", d.grpc, "--token", token}, args...)...)
	b, err := cmd.CombinedOutput()
	return string(b), err
}

// drive runs the adopter's scenario against d: the agent's tool list, a
// replayed reservation, the generated gRPC client through the executor,
// the service's own REST route, and a four-eyes write-off approved by a
// second person, with its sensitive field withheld from the trail.
func (d inventoryDeployment) drive(t *testing.T) {
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "adopter-agent", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: d.mcp, HTTPClient: &http.Client{Transport: bearer{d.bot}}}, nil)
	if err != nil {
		t.Fatalf("MCP connect: %v", err)
	}
	defer func() { _ = cs.Close() }()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	if got := strings.Join(names, ","); !strings.Contains(got, "stock.query") || !strings.Contains(got, "stock.reserve") ||
		!strings.Contains(got, "stock.release") || !strings.Contains(got, "stock.write_off") || strings.Contains(got, "ops.review") {
		t.Fatalf("stock-bot's tools: %s", got)
	}

	// An idempotent reservation, retried with the same key: one effect.
	reserve := `{"sku":"SKU-1","quantity":7,"order_id":"O-1"}`
	first := structured(t, callTool(t, cs, "stock.reserve", reserve, mcp.Meta{"mandate.dev/idempotency_key": "order-O-1"}))
	again := structured(t, callTool(t, cs, "stock.reserve", reserve, mcp.Meta{"mandate.dev/idempotency_key": "order-O-1"}))
	if first["reservation_id"] == nil || first["reservation_id"] != again["reservation_id"] {
		t.Fatalf("reservation %v, its retry %v", first, again)
	}

	// The generated gRPC client, pointed at the executor.
	out, err := d.ctlRun(t, d.sam, "query", "SKU-1")
	if err != nil || !strings.Contains(out, `"onHand":100`) || !strings.Contains(out, `"reserved":7`) {
		t.Fatalf("inventoryctl query through the executor: %v\n%s", err, out)
	}
	// The service's own google.api.http route.
	code, body := do(t, http.MethodGet, d.rest+"/v1/stock/SKU-1", d.sam, "")
	if code != http.StatusOK || body["reserved"] != float64(7) {
		t.Fatalf("GET /v1/stock/SKU-1: %d %v", code, body)
	}

	// A write-off: L3, four eyes. The headless agent is told to wait for
	// an approver; cora, who holds stock.approve, approves; the retry runs.
	writeOff := `{"sku":"SKU-1","quantity":2,"value":{"currency_code":"EUR","amount_minor":1990},"reason":"Broken in the warehouse","inspector_badge":"B-7731"}`
	m := wantToolRefusal(t, callTool(t, cs, "stock.write_off", writeOff, nil), "confirmation_check", "confirmation.required")
	challenge, _ := m["challenge_id"].(string)
	if challenge == "" {
		t.Fatalf("no challenge in %v", m)
	}
	if code, body := do(t, http.MethodPost, d.confirmREST+"/v1/challenges/"+challenge+":decide", d.cora, `{"decision":"DECISION_APPROVE"}`); code != http.StatusOK {
		t.Fatalf("cora approving: %d %v", code, body)
	}
	res := callTool(t, cs, "stock.write_off", writeOff, mcp.Meta{"mandate.dev/approval": challenge})
	done := structured(t, res)
	if done["on_hand"] != float64(98) {
		t.Fatalf("write-off result %v", done)
	}
	inv, _ := res.Meta["mandate.dev/invocation_id"].(string)
	// The outcome row of a dispatched call is written just after the reply.
	var trail string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, body = do(t, http.MethodGet, d.auditREST+"/v1/audit/invocations/"+inv, d.cora, "")
		trail = jsonOf(body)
		if strings.Contains(trail, `"phase":"outcome"`) || time.Now().After(deadline) {
			break
		}
	}
	if code != http.StatusOK || !strings.Contains(trail, `"approver":"cora"`) || !strings.Contains(trail, `"subject":"SKU-1"`) ||
		!strings.Contains(trail, `"outcome":"executed"`) || strings.Contains(trail, "B-7731") {
		t.Fatalf("the write-off's audit rows (%d): %s", code, trail)
	}
	if out, err := d.ctlRun(t, d.sam, "query", "SKU-1"); err != nil || !strings.Contains(out, `"onHand":98`) {
		t.Fatalf("stock after the write-off: %v\n%s", err, out)
	}
	d.driveDeclaredPolicy(t, cs, tools.Tools)
}

// driveDeclaredPolicy: what the adopter declared beyond permissions and
// confirmation holds for its own service — a budget on stock.reserve (an
// agent reserves at most 50 units of a SKU an hour) and a condition on
// stock.write_off (an agent gives a reason of at least 10 characters).
// The tool descriptors say so, each refusal names its stage, code and
// rule and leaves one audit row, and the backend never sees the call.
func (d inventoryDeployment) driveDeclaredPolicy(t *testing.T, cs *mcp.ClientSession, tools []*mcp.Tool) {
	t.Helper()
	for _, tl := range tools {
		switch tl.Name {
		case "stock.reserve":
			if !strings.Contains(tl.Description, "an agent reserves at most 50 units of a SKU an hour") || !strings.Contains(jsonOf(tl.Meta), "agent-hourly-units") {
				t.Fatalf("stock.reserve's descriptor does not state its limit: %q, _meta %s", tl.Description, jsonOf(tl.Meta))
			}
		case "stock.write_off":
			if !strings.Contains(tl.Description, "an agent must give a reason of at least 10 characters") {
				t.Fatalf("stock.write_off's descriptor does not state its condition: %q", tl.Description)
			}
		}
	}
	rowsOf := func(inv string) string {
		code, body := do(t, http.MethodGet, d.auditREST+"/v1/audit/invocations/"+inv, d.cora, "")
		if code != http.StatusOK {
			t.Fatalf("the audit rows of %s: %d %v", inv, code, body)
		}
		return jsonOf(body)
	}
	// stock-bot reserved 7 units of SKU-1 once (its retry was a replay,
	// which spends nothing): 43 more fit, one more does not.
	structured(t, callTool(t, cs, "stock.reserve", `{"sku":"SKU-1","quantity":43,"order_id":"O-2"}`, mcp.Meta{"mandate.dev/idempotency_key": "order-O-2"}))
	m := wantToolRefusal(t, callTool(t, cs, "stock.reserve", `{"sku":"SKU-1","quantity":1,"order_id":"O-3"}`, mcp.Meta{"mandate.dev/idempotency_key": "order-O-3"}),
		"budget_check", "budget.exhausted")
	// Within the hour, rounded up to its grain (a 64th: 56.25 s, limits.md).
	if wait, _ := m["retry_after"].(float64); wait <= 0 || wait > 3600+57 {
		t.Fatalf("the exhausted budget's refusal does not say when to retry (retry_after %v): %v", m["retry_after"], m)
	}
	if msg, _ := m["message"].(string); m["retriable"] != true || !strings.Contains(msg, "agent-hourly-units") || !strings.Contains(msg, "0 of 50 left") {
		t.Fatalf("the exhausted budget's refusal: %v", m)
	}
	if trail := rowsOf(m["invocation_id"].(string)); strings.Count(trail, `"phase"`) != 1 || !strings.Contains(trail, `"outcome":"refused"`) ||
		!strings.Contains(trail, `"code":"budget.exhausted"`) {
		t.Fatalf("the refusal's audit rows: %s", trail)
	}
	// Another SKU is another budget; sam's own reservations are no agent's.
	structured(t, callTool(t, cs, "stock.reserve", `{"sku":"SKU-2","quantity":5,"order_id":"O-4"}`, nil))
	if code, body := do(t, http.MethodPost, d.rest+"/v1/stock/SKU-1:reserve", d.sam, `{"quantity":1,"order_id":"O-5"}`); code != http.StatusOK {
		t.Fatalf("sam reserving SKU-1 himself past stock-bot's budget: %d %v", code, body)
	}
	if out, err := d.ctlRun(t, d.sam, "query", "SKU-1"); err != nil || !strings.Contains(out, `"reserved":51`) {
		t.Fatalf("SKU-1 after the budget (7 + 43 by stock-bot, 1 by sam): %v\n%s", err, out)
	}

	// The condition: a short reason from an agent is denied before anyone
	// is asked to approve.
	m = wantToolRefusal(t, callTool(t, cs, "stock.write_off",
		`{"sku":"SKU-1","quantity":1,"value":{"currency_code":"EUR","amount_minor":995},"reason":"Broken","inspector_badge":"B-7731"}`, nil),
		"condition_check", "condition.denied")
	if msg, _ := m["message"].(string); !strings.Contains(msg, "agent-reason") || m["challenge_id"] != nil {
		t.Fatalf("the condition's refusal: %v", m)
	}
	if trail := rowsOf(m["invocation_id"].(string)); strings.Count(trail, `"phase"`) != 1 || !strings.Contains(trail, `"code":"condition.denied"`) ||
		strings.Contains(trail, "B-7731") {
		t.Fatalf("the denied write-off's audit rows: %s", trail)
	}
}

// TestAdopterInventoryOnDev: the sample on `mandate dev --manifest
// --descriptors --backend --policy`, its backend a process of its own.
func TestAdopterInventoryOnDev(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a second module and runs processes")
	}
	dir, backendBin, ctl := inventoryBins(t)
	addr := startInventory(t, backendBin, serviceSecret, devSecret)
	t.Setenv("MANDATE_SERVICE_SECRET", serviceSecret)
	t.Setenv("MANDATE_DEV_SECRET", devSecret)
	dev := startDev(t,
		"--manifest", filepath.Join(dir, "gen", "manifest", "manifest.json"),
		"--descriptors", filepath.Join(dir, "gen", "manifest", "descriptors.binpb"),
		"--backend", "inventory.v1.InventoryService="+addr,
		"--policy", filepath.Join(dir, "policy.yaml"))
	inventoryDeployment{
		mcp: dev.base + "/mcp", rest: dev.base, grpc: dev.grpcAddr, confirmREST: dev.base, auditREST: dev.base,
		sam: dev.tokens["sam"], bot: dev.tokens["stock-bot@sam"], cora: dev.tokens["cora"], ctl: ctl,
	}.drive(t)
}

// TestAdopterInventoryOnServices: the same scenario on the separate
// services over Postgres, each a process, with the sample's manifest.
func TestAdopterInventoryOnServices(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a second module and runs processes")
	}
	dir, backendBin, ctl := inventoryBins(t)
	addr := startInventory(t, backendBin, serviceSecret, devSecret)
	tp := newTopology(t, topologyOptions{noServices: true, policy: filepath.Join(dir, "policy.yaml"), env: []string{
		"MANDATE_MANIFEST=" + filepath.Join(dir, "gen", "manifest", "manifest.json"),
		"MANDATE_DESCRIPTORS=" + filepath.Join(dir, "gen", "manifest", "descriptors.binpb"),
	}})
	tp.startAll(spec{name: "audit"}, spec{name: "catalog"})
	tp.startAll(spec{name: "confirm", args: []string{"--audit-addr", tp.addr["audit"].grpc}})
	tp.startAll(spec{name: "executor", args: []string{
		"--audit-addr", tp.addr["audit"].grpc, "--confirm-addr", tp.addr["confirm"].grpc,
		"--backend", "inventory.v1.InventoryService=" + addr + ",mandate.v1.CatalogService=" + tp.addr["catalog"].grpc,
	}})
	tp.startAll(spec{name: "mcpbridge", args: []string{
		"--executor-addr", tp.addr["executor"].grpc, "--catalog-addr", tp.addr["catalog"].grpc, "--confirm-addr", tp.addr["confirm"].grpc,
	}})
	inventoryDeployment{
		mcp: "http://" + tp.addr["mcpbridge"].http + "/mcp", rest: "http://" + tp.addr["executor"].http, grpc: tp.addr["executor"].grpc,
		confirmREST: "http://" + tp.addr["confirm"].http, auditREST: "http://" + tp.addr["audit"].http,
		sam: tp.token("shop", "sam", ""), bot: tp.token("shop", "sam", "stock-bot"), cora: tp.token("shop", "cora", ""), ctl: ctl,
	}.drive(t)
}

// sameTree reports the first file that differs between two directories,
// or is in one and not the other.
func sameTree(want, got string) error {
	files := map[string]bool{}
	for _, root := range []string{want, got} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				rel, _ := filepath.Rel(root, path)
				files[rel] = true
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	for rel := range files {
		a, errA := os.ReadFile(filepath.Join(want, rel))
		b, errB := os.ReadFile(filepath.Join(got, rel))
		if errA != nil || errB != nil || string(a) != string(b) {
			return fmt.Errorf("%s differs", rel)
		}
	}
	return nil
}
