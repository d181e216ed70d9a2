// Package helm_test renders the chart deploy/helm/mandate with Helm and
// validates every object against the Kubernetes schemas with kubeconform,
// both Go tools pinned in tools/helm/go.mod and built from the Go module
// proxy (or the module cache). The schemas are made from the OpenAPI
// document of the Kubernetes release the chart targets (kubeschema_test.go),
// so nothing is fetched from anywhere else. The tests skip only when the
// tools or that module cannot be had (offline with an empty module cache).
package helm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/mandate-dev/mandate/internal/app"
)

// kubernetesVersion is the release whose schemas the chart is validated
// against and that helm template renders for.
const kubernetesVersion = "1.37.2"

// chart is the chart's directory, relative to this package.
const chart = "mandate"

var tools struct {
	once                      sync.Once
	dir                       string
	helm, kubeconform, schema string
	skip                      string
	err                       error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if tools.dir != "" {
		_ = os.RemoveAll(tools.dir)
	}
	os.Exit(code)
}

// offline reports whether a go command failed for want of the network.
var offline = regexp.MustCompile(`dial tcp|no such host|connection refused|i/o timeout|GOPROXY=off|module lookup disabled|GOFLAGS=-mod=mod`)

// setup builds helm and kubeconform and writes the schemas, once.
func setup(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds Helm and kubeconform")
	}
	tools.once.Do(func() {
		root, err := filepath.Abs("../..")
		if err != nil {
			tools.err = err
			return
		}
		if tools.dir, tools.err = os.MkdirTemp("", "mandate-helm-"); tools.err != nil {
			return
		}
		build := func(name, pkg string) string {
			out := filepath.Join(tools.dir, name)
			cmd := exec.Command("go", "build", "-modfile=tools/helm/go.mod", "-o", out, pkg)
			cmd.Dir = root
			if b, err := cmd.CombinedOutput(); err != nil {
				if offline.Match(b) {
					tools.skip = "cannot build " + name + " offline: " + string(b)
				} else {
					tools.err = errors.New("go build " + pkg + ": " + err.Error() + "\n" + string(b))
				}
				return ""
			}
			return out
		}
		if tools.helm = build("helm", "helm.sh/helm/v3/cmd/helm"); tools.helm == "" {
			return
		}
		if tools.kubeconform = build("kubeconform", "github.com/yannh/kubeconform/cmd/kubeconform"); tools.kubeconform == "" {
			return
		}
		tools.schema, tools.skip, tools.err = schemas(tools.dir)
	})
	if tools.err != nil {
		t.Fatal(tools.err)
	}
	if tools.skip != "" {
		t.Skip(tools.skip)
	}
}

// schemas downloads k8s.io/kubernetes at kubernetesVersion into the module
// cache (go mod download: checksummed by the Go checksum database) and
// converts its swagger.json; it returns kubeconform's -schema-location.
func schemas(dir string) (location, skip string, err error) {
	cmd := exec.Command("go", "mod", "download", "-json", "k8s.io/kubernetes@v"+kubernetesVersion)
	cmd.Dir = dir // outside any module
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var mod struct{ Dir, Error string }
	_ = json.Unmarshal(stdout.Bytes(), &mod)
	if runErr != nil || mod.Dir == "" {
		msg := mod.Error + stderr.String()
		if offline.MatchString(msg) {
			return "", "cannot download k8s.io/kubernetes offline: " + msg, nil
		}
		return "", "", errors.New("go mod download k8s.io/kubernetes: " + msg)
	}
	swagger, err := os.ReadFile(filepath.Join(mod.Dir, "api", "openapi-spec", "swagger.json"))
	if err != nil {
		return "", "", err
	}
	out := filepath.Join(dir, "schemas")
	if err := os.Mkdir(out, 0o700); err != nil {
		return "", "", err
	}
	n, err := writeKubeSchemas(swagger, out)
	if err != nil {
		return "", "", err
	}
	if n < 50 {
		return "", "", errors.New("swagger.json yielded only a few kinds")
	}
	return filepath.Join(out, "{{ .ResourceKind }}{{ .KindSuffix }}.json"), "", nil
}

// object is one rendered manifest.
type object map[string]any

func (o object) kind() string { s, _ := o["kind"].(string); return s }
func (o object) name() string { return str(o, "metadata", "name") }

// get walks maps by key; nil when a key is missing.
func get(v any, path ...string) any {
	if o, ok := v.(object); ok {
		v = map[string]any(o)
	}
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func str(v any, path ...string) string { s, _ := get(v, path...).(string); return s }

// render runs helm template with the value files and --set pairs, checks
// every object with kubeconform and returns them.
func render(t *testing.T, files []string, set ...string) []object {
	t.Helper()
	args := []string{"template", "mandate", chart, "--namespace", "mandate", "--kube-version", kubernetesVersion}
	for _, f := range files {
		args = append(args, "-f", filepath.Join(chart, f))
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := exec.Command(tools.helm, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var objs []object
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		// A plain map: yaml decodes nested mappings into the target's
		// type, and nested objects must be map[string]any.
		var o map[string]any
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("rendered YAML: %v", err)
		}
		if o != nil {
			objs = append(objs, object(o))
		}
	}
	file := filepath.Join(t.TempDir(), "rendered.yaml")
	if err := os.WriteFile(file, out, 0o600); err != nil {
		t.Fatal(err)
	}
	res := kubeconform(t, file)
	var validated int
	for _, o := range objs {
		if o.kind() != "ServiceMonitor" {
			validated++
		}
	}
	if res.Summary.Valid != validated || res.Summary.Invalid+res.Summary.Errors != 0 {
		t.Fatalf("kubeconform: %+v for %d objects:\n%s", res.Summary, validated, res.Raw)
	}
	return objs
}

// conformResult is kubeconform's JSON output.
type conformResult struct {
	Resources []struct{ Kind, Name, Status, Msg string }
	Summary   struct{ Valid, Invalid, Errors, Skipped int }
	Raw       string `json:"-"`
}

// kubeconform validates a file strictly against the schemas;
// ServiceMonitor, a CRD, has none and is skipped.
func kubeconform(t *testing.T, file string) conformResult {
	t.Helper()
	cmd := exec.Command(tools.kubeconform, "-strict", "-summary", "-output", "json", "-kubernetes-version", kubernetesVersion,
		"-schema-location", tools.schema, "-skip", "ServiceMonitor", file)
	out, _ := cmd.Output() // exits 1 when something is invalid
	var res conformResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("kubeconform output: %v\n%s", err, out)
	}
	res.Raw = string(out)
	return res
}

func byKind(objs []object, kind string) map[string]object {
	out := map[string]object{}
	for _, o := range objs {
		if o.kind() == kind {
			out[o.name()] = o
		}
	}
	return out
}

// services are the Deployments the chart makes by default.
var services = []string{"audit", "catalog", "confirm", "executor", "mcpbridge"}

// TestSchemasRefuseWhatKubernetesWould: the converted schemas are strict
// enough to matter — an unknown field, a wrong type and a missing required
// field are each invalid — so a passing render is not a vacuous one.
func TestSchemasRefuseWhatKubernetesWould(t *testing.T) {
	setup(t)
	cases := []struct{ name, manifest string }{
		{"unknown field", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n  selector: {matchLabels: {a: b}}\n  template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: i}]}}\n"},
		{"wrong type", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: http}]}\n"},
		{"missing required", "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: x}\nspec: {minAvailable: 1, selector: {matchExpressions: [{key: a}]}}\n"},
		{"unknown field in a nested type", "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {name: x}\nspec: {maxReplicas: 2, scaleTargetRef: {kind: Deployment, name: x, apiVersoin: apps/v1}}\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "bad.yaml")
			if err := os.WriteFile(file, []byte(tc.manifest), 0o600); err != nil {
				t.Fatal(err)
			}
			if res := kubeconform(t, file); res.Summary.Invalid != 1 {
				t.Fatalf("kubeconform did not refuse it: %s", res.Raw)
			}
		})
	}
	// And a valid one passes.
	file := filepath.Join(t.TempDir(), "good.yaml")
	good := "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 80, targetPort: http}], selector: {a: b}}\n"
	if err := os.WriteFile(file, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	if res := kubeconform(t, file); res.Summary.Valid != 1 {
		t.Fatalf("a valid Service was refused: %s", res.Raw)
	}
}

// TestLint: helm lint --strict passes with the default and the HA values.
func TestLint(t *testing.T) {
	setup(t)
	for _, files := range [][]string{nil, {"values-ha.yaml"}} {
		args := []string{"lint", "--strict", chart, "--kube-version", kubernetesVersion}
		for _, f := range files {
			args = append(args, "-f", filepath.Join(chart, f))
		}
		if out, err := exec.Command(tools.helm, args...).CombinedOutput(); err != nil {
			t.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func TestDefaultValues(t *testing.T) {
	setup(t)
	objs := render(t, nil)
	deps := byKind(objs, "Deployment")
	if len(deps) != len(services) {
		t.Fatalf("%d Deployments, want %v", len(deps), services)
	}
	for _, s := range services {
		d, ok := deps["mandate-"+s]
		if !ok {
			t.Fatalf("no Deployment mandate-%s", s)
		}
		if r := get(d, "spec", "replicas"); r != 1 {
			t.Errorf("%s: replicas %v, want 1", s, r)
		}
	}
	if pdbs := byKind(objs, "PodDisruptionBudget"); len(pdbs) != len(services) || get(pdbs["mandate-executor"], "spec", "maxUnavailable") != 1 {
		t.Errorf("PodDisruptionBudgets %v, want one per service with maxUnavailable 1", pdbs)
	}
	for _, kind := range []string{"HorizontalPodAutoscaler", "Ingress", "ServiceMonitor"} {
		if n := len(byKind(objs, kind)); n != 0 {
			t.Errorf("%d %s by default, want none", n, kind)
		}
	}
	job := byKind(objs, "Job")["mandate-migrate"]
	if job == nil || str(job, "metadata", "annotations", "helm.sh/hook") != "pre-install,pre-upgrade" {
		t.Errorf("migrate Job %v, want a pre-install,pre-upgrade hook", job)
	}
	wantWiring(t, objs)
	wantBalanced(t, objs, "5m", "2m", "30s")
}

// wantBalanced checks client-side balancing: a headless Service of the
// gRPC port of every service the others dial, each dial target
// dns:///<that Service>:<port>, and the connection lifetime and keepalive
// settings on the services that serve and dial.
func wantBalanced(t *testing.T, objs []object, age, grace, keepalive string) {
	t.Helper()
	svcs := byKind(objs, "Service")
	deps := byKind(objs, "Deployment")
	for _, s := range []string{"audit", "catalog", "confirm", "executor"} {
		h := svcs["mandate-"+s+"-headless"]
		if h == nil {
			t.Errorf("no headless Service mandate-%s-headless", s)
			continue
		}
		ports, _ := get(h, "spec", "ports").([]any)
		if str(h, "spec", "clusterIP") != "None" || len(ports) != 1 || str(ports[0], "name") != "grpc" {
			t.Errorf("mandate-%s-headless: clusterIP %q, ports %v; want None and the gRPC port alone", s, str(h, "spec", "clusterIP"), ports)
		}
		if str(svcs["mandate-"+s], "spec", "type") != "ClusterIP" || str(svcs["mandate-"+s], "spec", "clusterIP") == "None" {
			t.Errorf("mandate-%s lost its ClusterIP Service (the Ingress and outside clients use it)", s)
		}
	}
	if svcs["mandate-mcpbridge-headless"] != nil {
		t.Error("a headless Service of the bridge's gRPC port, which no service dials")
	}
	exec, bridge, conf := containerEnv(deps["mandate-executor"]), containerEnv(deps["mandate-mcpbridge"]), containerEnv(deps["mandate-confirm"])
	want := map[string]string{
		"executor MANDATE_AUDIT_ADDR":      "dns:///mandate-audit-headless:9094",
		"confirm MANDATE_AUDIT_ADDR":       "dns:///mandate-audit-headless:9094",
		"bridge MANDATE_AUDIT_ADDR":        "dns:///mandate-audit-headless:9094",
		"executor MANDATE_CONFIRM_ADDR":    "dns:///mandate-confirm-headless:9093",
		"bridge MANDATE_CATALOG_ADDR":      "dns:///mandate-catalog-headless:9091",
		"bridge MANDATE_EXECUTOR_ADDR":     "dns:///mandate-executor-headless:9092",
		"bridge MANDATE_CONFIRM_ADDR":      "dns:///mandate-confirm-headless:9093",
		"executor MANDATE_BACKEND catalog": "mandate.v1.CatalogService=dns:///mandate-catalog-headless:9091",
	}
	got := map[string]string{
		"executor MANDATE_AUDIT_ADDR": exec["MANDATE_AUDIT_ADDR"], "executor MANDATE_CONFIRM_ADDR": exec["MANDATE_CONFIRM_ADDR"],
		"bridge MANDATE_CATALOG_ADDR": bridge["MANDATE_CATALOG_ADDR"], "bridge MANDATE_EXECUTOR_ADDR": bridge["MANDATE_EXECUTOR_ADDR"],
		"bridge MANDATE_CONFIRM_ADDR":      bridge["MANDATE_CONFIRM_ADDR"],
		"bridge MANDATE_AUDIT_ADDR":        bridge["MANDATE_AUDIT_ADDR"],
		"confirm MANDATE_AUDIT_ADDR":       conf["MANDATE_AUDIT_ADDR"],
		"executor MANDATE_BACKEND catalog": strings.Split(exec["MANDATE_BACKEND"], ",")[0],
	}
	if !equalMaps(got, want) {
		t.Errorf("dial targets %v, want %v", got, want)
	}
	for name, d := range deps {
		env := containerEnv(d)
		if env["MANDATE_GRPC_MAX_CONNECTION_AGE"] != age || env["MANDATE_GRPC_MAX_CONNECTION_AGE_GRACE"] != grace {
			t.Errorf("%s: connection age %q, grace %q; want %s, %s", name, env["MANDATE_GRPC_MAX_CONNECTION_AGE"], env["MANDATE_GRPC_MAX_CONNECTION_AGE_GRACE"], age, grace)
		}
		dials := name == "mandate-executor" || name == "mandate-mcpbridge" || name == "mandate-confirm"
		if v, set := env["MANDATE_GRPC_KEEPALIVE_TIME"]; dials && v != keepalive || !dials && set {
			t.Errorf("%s: MANDATE_GRPC_KEEPALIVE_TIME %q (set: %v)", name, v, set)
		}
	}
}

// TestServiceSideBalancing: grpc.clientSideBalancing=false dials the
// ClusterIP Services as host:port and makes no headless Service but the
// bridge's pods; the connection settings follow their values.
func TestServiceSideBalancing(t *testing.T) {
	setup(t)
	objs := render(t, []string{"values-ha.yaml"}, "grpc.clientSideBalancing=false", "grpc.maxConnectionAge=90s", "grpc.keepaliveTime=0s")
	for name, s := range byKind(objs, "Service") {
		if str(s, "spec", "clusterIP") == "None" && name != "mandate-mcpbridge-pods" {
			t.Errorf("headless Service %s with client-side balancing off", name)
		}
	}
	for name, d := range byKind(objs, "Deployment") {
		for k, v := range containerEnv(d) {
			if strings.Contains(v, "dns:///") {
				t.Errorf("%s: %s=%s", name, k, v)
			}
		}
		env := containerEnv(d)
		keepalive := ""
		if name == "mandate-executor" || name == "mandate-mcpbridge" || name == "mandate-confirm" {
			keepalive = "0s" // no pings
		}
		if env["MANDATE_GRPC_MAX_CONNECTION_AGE"] != "90s" || env["MANDATE_GRPC_KEEPALIVE_TIME"] != keepalive {
			t.Errorf("%s: connection age %q, keepalive %q", name, env["MANDATE_GRPC_MAX_CONNECTION_AGE"], env["MANDATE_GRPC_KEEPALIVE_TIME"])
		}
	}
	if got := containerEnv(byKind(objs, "Deployment")["mandate-mcpbridge"])["MANDATE_EXECUTOR_ADDR"]; got != "mandate-executor:9092" {
		t.Errorf("bridge MANDATE_EXECUTOR_ADDR %q", got)
	}
	wantWiring(t, objs)
}

func TestHAValues(t *testing.T) {
	setup(t)
	objs := render(t, []string{"values-ha.yaml"})
	deps := byKind(objs, "Deployment")
	hpas := byKind(objs, "HorizontalPodAutoscaler")
	for _, s := range services {
		name := "mandate-" + s
		if r, set := get(deps[name], "spec").(map[string]any)["replicas"]; set {
			t.Errorf("%s: replicas %v set while the HPA scales it", s, r)
		}
		h := hpas[name]
		if str(h, "spec", "scaleTargetRef", "name") != name || get(h, "spec", "minReplicas") != 2 {
			t.Errorf("HPA %s: %v", name, h)
		}
		metrics, _ := get(h, "spec", "metrics").([]any)
		if len(metrics) != 1 || str(metrics[0], "resource", "name") != "cpu" {
			t.Errorf("HPA %s scales on %v, want CPU", name, metrics)
		}
		if pdb := byKind(objs, "PodDisruptionBudget")[name]; get(pdb, "spec", "minAvailable") != 1 {
			t.Errorf("PDB %s: %v, want minAvailable 1", name, get(pdb, "spec"))
		}
		if get(deps[name], "spec", "template", "spec", "topologySpreadConstraints") == nil {
			t.Errorf("%s: replicas not spread across nodes", s)
		}
		if str(deps[name], "spec", "template", "metadata", "annotations", "prometheus.io/scrape") != "true" {
			t.Errorf("%s: no Prometheus scrape annotations", s)
		}
	}
	wantBalanced(t, objs, "5m", "2m", "30s")
	ing := byKind(objs, "Ingress")["mandate"]
	routes := map[string]string{}
	paths, _ := get(get(ing, "spec", "rules").([]any)[0], "http", "paths").([]any)
	for _, p := range paths {
		routes[str(p, "path")] = str(p, "backend", "service", "name")
	}
	want := map[string]string{"/mcp": "mandate-mcpbridge", "/.well-known/oauth-protected-resource": "mandate-mcpbridge",
		"/v1/": "mandate-executor", "/approve/": "mandate-confirm"}
	if !equalMaps(routes, want) {
		t.Errorf("Ingress routes %v, want %v", routes, want)
	}
	env := containerEnv(deps["mandate-mcpbridge"])
	if env["MANDATE_RESOURCE_URL"] != "https://mandate.example.com/mcp" || env["MANDATE_STATE_SECRET"] != "secret:mandate/state-secret" {
		t.Errorf("bridge env %v", env)
	}
	if got := containerEnv(deps["mandate-confirm"])["MANDATE_APPROVAL_BASE_URL"]; got != "https://mandate.example.com" {
		t.Errorf("approval base URL %q", got)
	}
	wantWiring(t, objs)
}

// TestEverythingOn: the sample backend, a ServiceMonitor, a manifest
// ConfigMap, OTLP export, events and a database URL from another Secret.
func TestEverythingOn(t *testing.T) {
	setup(t)
	objs := render(t, []string{"values-ha.yaml"},
		"services.helpdesk.enabled=true", "metrics.serviceMonitor.enabled=true", "manifest.configMap=mandate-manifest",
		"otel.endpoint=http://otel-collector:4317", "services.executor.eventsURL=nats://nats:4222",
		"secrets.databaseURL.name=mandate-db-app", "secrets.databaseURL.key=uri",
		"services.executor.backends={billing.v1.BillingService=billing:9000}",
		"services.confirm.webhookURL=https://hooks.example.com/mandate", "secrets.webhookSecretKey=webhook-secret")
	deps := byKind(objs, "Deployment")
	if len(deps) != len(services)+1 || len(byKind(objs, "ServiceMonitor")) != len(services)+1 {
		t.Fatalf("%d Deployments, %d ServiceMonitors", len(deps), len(byKind(objs, "ServiceMonitor")))
	}
	env := containerEnv(deps["mandate-executor"])
	if env["MANDATE_BACKEND"] != "mandate.v1.CatalogService=dns:///mandate-catalog-headless:9091,examples.helpdesk.v1.HelpdeskService=dns:///mandate-helpdesk-headless:9191,billing.v1.BillingService=billing:9000" {
		t.Errorf("MANDATE_BACKEND %q", env["MANDATE_BACKEND"])
	}
	if env["MANDATE_DATABASE_URL"] != "secret:mandate-db-app/uri" || env["OTEL_EXPORTER_OTLP_ENDPOINT"] != "http://otel-collector:4317" ||
		env["MANDATE_MANIFEST"] != "/etc/mandate/manifest/manifest.json" || env["MANDATE_EVENTS_URL"] != "nats://nats:4222" {
		t.Errorf("executor env %v", env)
	}
	if c := containerEnv(deps["mandate-confirm"]); c["MANDATE_WEBHOOK_URL"] != "https://hooks.example.com/mandate" || c["MANDATE_WEBHOOK_SECRET"] != "secret:mandate/webhook-secret" {
		t.Errorf("confirm env %v: want the webhook URL and its secret from the Secret", c)
	}
	wantWiring(t, objs)
}

func TestMetricsOff(t *testing.T) {
	setup(t)
	objs := render(t, []string{"values-ha.yaml"}, "metrics.enabled=false", "metrics.serviceMonitor.enabled=true")
	for name, d := range byKind(objs, "Deployment") {
		if v := containerEnv(d)["MANDATE_METRICS"]; v != "false" {
			t.Errorf("%s: MANDATE_METRICS %q", name, v)
		}
		if get(d, "spec", "template", "metadata", "annotations") != nil {
			t.Errorf("%s: annotations %v with metrics off", name, get(d, "spec", "template", "metadata", "annotations"))
		}
	}
	if n := len(byKind(objs, "ServiceMonitor")); n != 0 {
		t.Errorf("%d ServiceMonitors with metrics off", n)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func container(o object) map[string]any {
	cs, _ := get(o, "spec", "template", "spec", "containers").([]any)
	if len(cs) != 1 {
		return nil
	}
	c, _ := cs[0].(map[string]any)
	return c
}

// containerEnv maps the one container's variables to their values; one
// read from a Secret reads "secret:<name>/<key>".
func containerEnv(o object) map[string]string {
	out := map[string]string{}
	env, _ := get(container(o), "env").([]any)
	for _, e := range env {
		v := str(e, "value")
		if ref := get(e, "valueFrom", "secretKeyRef"); ref != nil {
			v = "secret:" + str(ref, "name") + "/" + str(ref, "key")
		}
		out[str(e, "name")] = v
	}
	return out
}

// flagVars returns the variables of `mandate <sub> -h`'s flags (the real
// flag set, as deploy/compose/compose_test.go reads it).
func flagVars(t *testing.T, sub string) map[string]bool {
	t.Helper()
	var out, errOut bytes.Buffer
	code := app.Run(context.Background(), []string{sub, "-h"}, app.IO{Stdout: &out, Stderr: &errOut,
		Env: func(string) (string, bool) { return "", false }})
	if code != 0 {
		t.Fatalf("`mandate %s` is not a subcommand (exit %d)", sub, code)
	}
	re := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)[^\n]*\n(?:\s+[^\n]*\n)*?\s+[^\n]*\(env (MANDATE_[A-Z0-9_]+)\)`)
	got := map[string]bool{}
	for _, m := range re.FindAllStringSubmatch(errOut.String()+out.String(), -1) {
		got[m[2]] = true
		got["--"+m[1]] = true
	}
	return got
}

// wantWiring checks what ties the objects together: every MANDATE_*
// variable is a flag of the container's subcommand; the listen ports match
// the container ports; the probes run `mandate healthcheck` with its real
// flags against the HTTP port; every gRPC address names a Service and its
// port (dns:/// a headless one); every Service selects a Deployment's pods.
func wantWiring(t *testing.T, objs []object) {
	t.Helper()
	hc := flagVars(t, "healthcheck")
	svcs := byKind(objs, "Service")
	var pods []map[string]any
	workloads := append(slices.Collect(mapValues(byKind(objs, "Deployment"))), slices.Collect(mapValues(byKind(objs, "Job")))...)
	for _, o := range workloads {
		c := container(o)
		args, _ := get(c, "args").([]any)
		if len(args) != 1 {
			t.Fatalf("%s: args %v, want the subcommand alone", o.name(), args)
		}
		sub := args[0].(string)
		flags := flagVars(t, sub)
		env := containerEnv(o)
		for name := range env {
			if !strings.HasPrefix(name, "MANDATE_") || flags[name] {
				continue
			}
			t.Errorf("%s sets %s, which is no flag of `mandate %s`", o.name(), name, sub)
		}
		if o.kind() != "Deployment" {
			continue
		}
		pods = append(pods, get(o, "spec", "template", "metadata", "labels").(map[string]any))
		ports := map[string]string{}
		cps, _ := get(c, "ports").([]any)
		for _, p := range cps {
			ports[str(p, "name")] = jsonOf(get(p, "containerPort"))
		}
		for _, v := range []struct{ env, port string }{{"MANDATE_HTTP_ADDR", "http"}, {"MANDATE_GRPC_ADDR", "grpc"}} {
			if _, port, _ := net.SplitHostPort(env[v.env]); port == "" || port != ports[v.port] {
				t.Errorf("%s: %s=%q but the %s container port is %s", o.name(), v.env, env[v.env], v.port, ports[v.port])
			}
		}
		for _, probe := range []string{"readinessProbe", "livenessProbe"} {
			cmd, _ := get(c, probe, "exec", "command").([]any)
			if len(cmd) < 4 || cmd[0] != "/usr/local/bin/mandate" || cmd[1] != "healthcheck" {
				t.Errorf("%s %s: %v, want mandate healthcheck", o.name(), probe, cmd)
				continue
			}
			for i := 2; i < len(cmd); i += 2 {
				if !hc[cmd[i].(string)] {
					t.Errorf("%s %s: %v is no flag of mandate healthcheck", o.name(), probe, cmd[i])
				}
			}
			// Readiness is /healthz (the service can serve: its database
			// answers), liveness /livez (the process runs): a database
			// outage takes pods out of rotation, it does not restart them.
			path := "/healthz"
			if probe == "livenessProbe" {
				path = "/livez"
			}
			if cmd[3] != "http://127.0.0.1:"+ports["http"]+path {
				t.Errorf("%s %s probes %v, not its HTTP port %s", o.name(), probe, cmd[3], ports["http"])
			}
		}
		for _, name := range []string{"MANDATE_AUDIT_ADDR", "MANDATE_CONFIRM_ADDR", "MANDATE_CATALOG_ADDR", "MANDATE_EXECUTOR_ADDR"} {
			if addr, ok := env[name]; ok {
				wantServicePort(t, svcs, o.name()+" "+name, addr)
			}
		}
		for _, b := range strings.Split(env["MANDATE_BACKEND"], ",") {
			if _, addr, ok := strings.Cut(b, "="); ok && strings.HasPrefix(strings.TrimPrefix(addr, "dns:///"), "mandate-") {
				wantServicePort(t, svcs, o.name()+" MANDATE_BACKEND", addr)
			}
		}
	}
	for name, s := range svcs {
		sel, _ := get(s, "spec", "selector").(map[string]any)
		if !slices.ContainsFunc(pods, func(labels map[string]any) bool { return matches(sel, labels) }) {
			t.Errorf("Service %s selects no Deployment's pods (%v)", name, sel)
		}
	}
}

// wantServicePort checks that a dial target names a Service's gRPC port:
// host:port, or dns:///host:port of a headless Service (one record per
// pod, which the client balances over).
func wantServicePort(t *testing.T, svcs map[string]object, what, addr string) {
	t.Helper()
	hostPort, balanced := strings.CutPrefix(addr, "dns:///")
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		t.Errorf("%s: %q is not host:port or dns:///host:port", what, addr)
		return
	}
	if headless := str(svcs[host], "spec", "clusterIP") == "None"; balanced != headless {
		t.Errorf("%s: %s, but Service %s is headless: %v (dns:/// balances over a headless Service's records; a ClusterIP's one address would pin the connection)", what, addr, host, headless)
	}
	ports, _ := get(svcs[host], "spec", "ports").([]any)
	if !slices.ContainsFunc(ports, func(p any) bool { return jsonOf(get(p, "port")) == port && str(p, "name") == "grpc" }) {
		t.Errorf("%s: %s names no Service's gRPC port", what, addr)
	}
}

func matches(sel, labels map[string]any) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func mapValues[K comparable, V any](m map[K]V) func(func(V) bool) {
	return func(yield func(V) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

func jsonOf(v any) string { b, _ := json.Marshal(v); return string(b) }
