package tests

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/manifest/manifesttest"
)

// healthDigest reads the manifest digest a process reports in /healthz.
func healthDigest(t *testing.T, httpAddr string) string {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/healthz") //nolint:noctx // test
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var h struct {
		Status         string `json:"status"`
		ManifestDigest string `json:"manifest_digest"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || h.Status != "SERVING" {
		t.Fatalf("/healthz of %s: %+v %v", httpAddr, h, err)
	}
	return h.ManifestDigest
}

// TestServicesOnDifferentManifestsRefuseEachOther: a catalog and an MCP
// bridge deployed with another manifest than the executor. Each reports
// its digest in /healthz; the agent's refund through the bridge is
// refused by the executor with manifest.mismatch at request_check — a
// clear refusal, not "unknown tool" — audited as one refused row, and
// nothing reaches the payment gateway.
func TestServicesOnDifferentManifestsRefuseEachOther(t *testing.T) {
	tp := newTopology(t, topologyOptions{noServices: true})
	v := manifesttest.Variant(t, t.TempDir())
	variant := []string{"--manifest", v.Manifest, "--descriptors", v.Descriptors}
	tp.startAll(spec{name: "audit"}, spec{name: "helpdesk"}, spec{name: "catalog", args: variant})
	tp.startAll(spec{name: "confirm", args: []string{"--audit-addr", tp.addr["audit"].grpc}})
	tp.startAll(spec{name: "executor", args: tp.executorArgs()}) // the sample, MANDATE_MANIFEST=sample
	tp.startAll(spec{name: "mcpbridge", args: append([]string{
		"--executor-addr", tp.addr["executor"].grpc,
		"--catalog-addr", tp.addr["catalog"].grpc,
		"--confirm-addr", tp.addr["confirm"].grpc,
	}, variant...)})

	for name, want := range map[string]string{"executor": manifest.SampleDigest(), "confirm": manifest.SampleDigest(), "catalog": v.Digest, "mcpbridge": v.Digest} {
		if got := healthDigest(t, tp.addr[name].http); got != want {
			t.Errorf("%s reports manifest %q, want %q", name, got, want)
		}
	}

	cs := tp.mcpSession(tp.token("acme", "carol", "payout-bot"), nil)
	res := callTool(t, cs, "ticket.refund", refundInput, mcp.Meta{"mandate.dev/idempotency-key": "mismatch-1"})
	m := wantToolRefusal(t, res, "request_check", "manifest.mismatch")
	if msg, _ := m["message"].(string); !strings.Contains(msg, v.Digest) || !strings.Contains(msg, manifest.SampleDigest()) {
		t.Errorf("the refusal does not name both manifests: %v", m)
	}
	rows := tp.invocationRows(m["invocation_id"].(string), 1)
	if r := rows[0]; r.GetStage() != "request_check" || r.GetCode() != "manifest.mismatch" || r.GetOutcome() != "refused" {
		t.Fatalf("audit row of the refusal: %v", r)
	}
	tp.wantRefunds(0, 0)
	if n := tp.challenges("acme"); n != 0 {
		t.Fatalf("%d challenges opened for a refused call", n)
	}
}

// TestDevRunsAnExternalBackend: `mandate dev --manifest … --descriptors …
// --backend … --policy …` governs a backend it does not run: the helpdesk
// sample started as its own process (`mandate helpdesk`), verifying the
// executor's relay with the service secret given to both. Tokens are
// written for the policy's users and agents, and a call through dev's REST
// endpoint reaches the external backend.
func TestDevRunsAnExternalBackend(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	root, _ := filepath.Abs("..")
	bin := mandateBinary(t, root)
	files := manifesttest.Sample(t, t.TempDir())
	dir := t.TempDir()
	polFile := filepath.Join(dir, "policy.yaml")
	pol := "version: 1\ntenants:\n  - id: acme\n    display_name: Acme\n    features: [refunds]\n    roles:\n      support: [ticket.read]\n" +
		"    users:\n      - {id: zoe, org: support, roles: [support]}\n    agents:\n      - {id: helper, user: zoe}\n"
	if err := os.WriteFile(polFile, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}

	grpcAddr, httpAddr := freePort(t), freePort(t)
	backend := exec.Command(bin, "helpdesk", "--store", "memory", "--grpc-addr", grpcAddr, "--http-addr", httpAddr)
	backend.Env = append(os.Environ(), "MANDATE_DEV_SECRET="+devSecret, "MANDATE_SERVICE_SECRET="+serviceSecret)
	out := &syncBuffer{}
	backend.Stdout, backend.Stderr = out, out
	if err := backend.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- backend.Wait() }()
	t.Cleanup(func() {
		_ = backend.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("helpdesk did not stop cleanly: %v", err)
			}
		case <-time.After(15 * time.Second):
			_ = backend.Process.Kill()
			t.Error("helpdesk did not stop within 15s")
		}
		if t.Failed() {
			t.Logf("helpdesk output:\n%s", tail(out.String(), 4000))
		}
	})
	if err := awaitHealthy("helpdesk", httpAddr, done, func() string { return tail(out.String(), 4000) }); err != nil {
		t.Fatal(err)
	}

	d := startDev(t, "--manifest", files.Manifest, "--descriptors", files.Descriptors,
		"--backend", "examples.helpdesk.v1.HelpdeskService="+grpcAddr, "--policy", polFile,
		"--dev-secret", devSecret, "--service-secret", serviceSecret)
	if len(d.tokens) != 2 || d.tokens["zoe"] == "" || d.tokens["helper@zoe"] == "" {
		t.Fatalf("tokens for %v, want zoe and helper@zoe", d.tokens)
	}
	if !strings.Contains(d.out.String(), "backend examples.helpdesk.v1.HelpdeskService: "+grpcAddr) {
		t.Fatalf("the banner does not name the external backend:\n%s", d.out.String())
	}
	if got := healthDigest(t, d.httpAddr); got != files.Digest {
		t.Fatalf("dev reports manifest %q, want %q", got, files.Digest)
	}
	code, body := post(t, d.base+"/v1/commands/ticket.search:execute", d.tokens["helper@zoe"], `{"input":{"query":"charged twice"}}`)
	if code != http.StatusOK || !strings.Contains(jsonOf(body["result"]), "T-1001") {
		t.Fatalf("search through the external backend: %d %v", code, body)
	}
	// The policy given is the one enforced: zoe holds no payment.refund.
	code, body = post(t, d.base+"/v1/commands/ticket.refund:execute", d.tokens["zoe"], `{"input":`+refundInput+`}`)
	if code != http.StatusForbidden || body["code"] != "authorization.permission_denied" {
		t.Fatalf("a refund by a user without payment.refund: %d %v", code, body)
	}
}
