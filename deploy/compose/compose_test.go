package compose_test

import (
	"bufio"
	"bytes"
	"context"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	composecli "github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/mandate-dev/mandate/internal/app"
)

// binary is where the Dockerfile installs mandate; health checks call it.
const binary = "/usr/local/bin/mandate"

// longRunning are the services `docker compose up` keeps running, with the
// mandate subcommand each runs.
var longRunning = map[string]string{
	"audit": "audit", "confirm": "confirm", "catalog": "catalog",
	"executor": "executor", "mcpbridge": "mcpbridge", "helpdesk": "helpdesk",
}

// published is what the host may reach, and nothing else: service →
// container ports published on 127.0.0.1 under the same number.
var published = map[string][]uint32{
	"mcpbridge": {8085},       // MCP
	"executor":  {8082, 9092}, // REST, gRPC
	"confirm":   {8083},       // approval pages
	"jaeger":    {16686},      // Jaeger UI
}

// load reads compose.yaml as `docker compose` would, with the given
// variables (none: every dev-only default applies) and the tools profile.
func load(t *testing.T, env ...string) *types.Project {
	t.Helper()
	opts, err := composecli.NewProjectOptions([]string{"compose.yaml"},
		composecli.WithName("mandate-test"),
		composecli.WithWorkingDirectory("."),
		composecli.WithEnv(env),
		composecli.WithProfiles([]string{"tools"}),
		composecli.WithInterpolation(true),
		composecli.WithResolvedPaths(true),
		composecli.WithConsistency(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("compose.yaml does not load: %v", err)
	}
	return p
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, ok := p.Services[name]
	if !ok {
		t.Fatalf("compose.yaml has no service %q", name)
	}
	return s
}

func env(s types.ServiceConfig) map[string]string {
	out := map[string]string{}
	for k, v := range s.Environment {
		if v != nil {
			out[k] = *v
		}
	}
	return out
}

// flags returns the flags `mandate <sub…> -h` lists, mapped to their
// variables: the subcommand's real flag set, not a copy of it.
func flags(t *testing.T, sub []string) map[string]string {
	t.Helper()
	var out, errOut bytes.Buffer
	code := app.Run(context.Background(), append(slices.Clone(sub), "-h"), app.IO{Stdout: &out, Stderr: &errOut,
		Env: func(string) (string, bool) { return "", false }})
	if code != 0 {
		t.Fatalf("`mandate %s` is not a mandate subcommand (exit %d):\n%s%s", strings.Join(sub, " "), code, out.String(), errOut.String())
	}
	re := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)[^\n]*\n(?:\s+[^\n]*\n)*?\s+[^\n]*\(env (MANDATE_[A-Z0-9_]+)\)`)
	got := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(errOut.String()+out.String(), -1) {
		got[m[1]] = m[2]
	}
	if len(got) == 0 {
		t.Fatalf("`mandate %s -h` lists no flags:\n%s", strings.Join(sub, " "), errOut.String())
	}
	return got
}

// subcommand splits a command into the subcommand path and its flags.
func subcommand(cmd []string) (sub, args []string) {
	for i, a := range cmd {
		if strings.HasPrefix(a, "-") {
			return cmd[:i], cmd[i:]
		}
	}
	return cmd, nil
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%q is not host:port: %v", addr, err)
	}
	return p
}

func TestServicesAndDependencies(t *testing.T) {
	p := load(t)
	want := []string{"postgres", "migrate", "policy", "audit", "confirm", "catalog", "executor", "mcpbridge", "helpdesk", "nats", "jaeger", "mandate"}
	for _, name := range want {
		service(t, p, name)
	}
	if extra := slices.DeleteFunc(slices.Collect(maps.Keys(p.Services)), func(n string) bool { return slices.Contains(want, n) }); len(extra) > 0 {
		t.Errorf("services not covered by this test: %v", extra)
	}

	pg := service(t, p, "postgres")
	if pg.Image != "postgres:15" || pg.HealthCheck == nil || !strings.Contains(strings.Join(pg.HealthCheck.Test, " "), "pg_isready") {
		t.Errorf("postgres: image %q, health check %+v", pg.Image, pg.HealthCheck)
	}
	if len(pg.Volumes) == 0 || pg.Volumes[0].Target != "/var/lib/postgresql/data" || pg.Volumes[0].Type != types.VolumeTypeVolume {
		t.Errorf("postgres keeps its data in no named volume: %+v", pg.Volumes)
	}

	dep := func(s types.ServiceConfig, on, cond string) {
		t.Helper()
		if d, ok := s.DependsOn[on]; !ok || d.Condition != cond {
			t.Errorf("%s: depends_on %s = %+v, want condition %s", s.Name, on, d, cond)
		}
	}
	migrate := service(t, p, "migrate")
	if !slices.Equal(migrate.Command, []string{"migrate"}) {
		t.Errorf("migrate runs %q", migrate.Command)
	}
	dep(migrate, "postgres", types.ServiceConditionHealthy)
	policy := service(t, p, "policy")
	if !slices.Equal(policy.Command, []string{"policy", "apply", "-f", "/etc/mandate/demo.yaml"}) {
		t.Errorf("policy runs %q", policy.Command)
	}
	dep(policy, "migrate", types.ServiceConditionCompletedSuccessfully)
	var mounted bool
	for _, v := range policy.Volumes {
		if v.Target == "/etc/mandate/demo.yaml" && v.ReadOnly {
			src, err := filepath.Rel(mustAbs(t, "../.."), v.Source)
			mounted = err == nil && src == filepath.Join("examples", "policy", "demo.yaml")
		}
	}
	if !mounted {
		t.Errorf("policy does not mount examples/policy/demo.yaml read-only at /etc/mandate/demo.yaml: %+v", policy.Volumes)
	}
	for _, name := range []string{"migrate", "policy"} {
		if s := service(t, p, name); s.Restart != "no" {
			t.Errorf("%s is a one-shot job but restarts %q", name, s.Restart)
		}
	}

	for name := range longRunning {
		s := service(t, p, name)
		dep(s, "postgres", types.ServiceConditionHealthy)
		dep(s, "migrate", types.ServiceConditionCompletedSuccessfully)
		dep(s, "policy", types.ServiceConditionCompletedSuccessfully)
		if s.Restart != "unless-stopped" {
			t.Errorf("%s restarts %q", name, s.Restart)
		}
	}
	for _, on := range []string{"audit", "confirm", "catalog", "helpdesk"} {
		dep(service(t, p, "executor"), on, types.ServiceConditionHealthy)
	}
	for _, on := range []string{"catalog", "executor", "confirm"} {
		dep(service(t, p, "mcpbridge"), on, types.ServiceConditionHealthy)
	}
	nats := service(t, p, "nats")
	if nats.Image != "nats:2" || !slices.Contains(nats.Command, "-js") {
		t.Errorf("nats: image %q, command %q; want nats:2 with JetStream (-js)", nats.Image, nats.Command)
	}
	if len(nats.Volumes) == 0 || nats.Volumes[0].Type != types.VolumeTypeVolume {
		t.Errorf("nats keeps its streams in no named volume: %+v", nats.Volumes)
	}
	dep(service(t, p, "executor"), "nats", types.ServiceConditionStarted)
	for _, name := range []string{"executor", "mandate"} {
		if u := env(service(t, p, name))["MANDATE_EVENTS_URL"]; u != "nats://nats:4222" {
			t.Errorf("%s: MANDATE_EVENTS_URL=%q, want the nats service (nats://nats:4222)", name, u)
		}
	}
	if js := service(t, p, "jaeger"); env(js)["COLLECTOR_OTLP_ENABLED"] != "true" {
		t.Errorf("jaeger does not accept OTLP: %v", env(js))
	}
	if tools := service(t, p, "mandate"); !slices.Equal(tools.Profiles, []string{"tools"}) {
		t.Errorf("the tools service would start with `up`: profiles %v", tools.Profiles)
	}
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// builder is the one service that builds the mandate image.
const builder = "migrate"

// checkImageBuiltOnce: every service that runs the mandate image names the
// same tag and never pulls it; exactly one builds it (Compose builds once
// per service with `build:`, and every build of a tag leaves the previous
// image dangling); and every other one but the tools service depends on
// that one, so `up` of any service builds the image first.
func checkImageBuiltOnce(t *testing.T, p *types.Project) {
	t.Helper()
	image := service(t, p, builder).Image
	if !strings.HasPrefix(image, "mandate:") {
		t.Fatalf("%s runs image %q, want the mandate image", builder, image)
	}
	var builders, users []string
	for name, s := range p.Services {
		if s.Build != nil {
			builders = append(builders, name)
		}
		if s.Image != image {
			if s.Build != nil || strings.HasPrefix(s.Image, "mandate") {
				t.Errorf("%s runs image %q, not the shared %q", name, s.Image, image)
			}
			continue
		}
		users = append(users, name)
		if s.PullPolicy != types.PullPolicyNever {
			t.Errorf("%s: pull_policy %q, want never: %s exists only where it is built", name, s.PullPolicy, image)
		}
		if name == builder || slices.Contains(s.Profiles, "tools") {
			continue
		}
		if d, ok := s.DependsOn[builder]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
			t.Errorf("%s does not wait for %s, which builds its image", name, builder)
		}
	}
	if !slices.Equal(builders, []string{builder}) {
		t.Errorf("services with build: %v, want only %s", builders, builder)
	}
	if len(users) < 1+len(longRunning) {
		t.Errorf("only %v run %s", users, image)
	}
}

// TestImageBuiltOnce: `up --build` builds the mandate image once, in the
// stack and in the own-service override alike.
func TestImageBuiltOnce(t *testing.T) {
	checkImageBuiltOnce(t, load(t))
	checkImageBuiltOnce(t, load(t, "MANDATE_IMAGE=mandate:v9"))
	if got := service(t, load(t, "MANDATE_IMAGE=mandate:v9"), "executor").Image; got != "mandate:v9" {
		t.Errorf("MANDATE_IMAGE=mandate:v9 runs %q", got)
	}
	opts, err := composecli.NewProjectOptions([]string{"compose.yaml", "own-service.yaml"},
		composecli.WithName("mandate-test"), composecli.WithWorkingDirectory("."),
		composecli.WithEnv([]string{"MANDATE_OWN_DIR=/srv/inventory", "MANDATE_OWN_BACKEND=inventory.v1.InventoryService=host.docker.internal:9300"}),
		composecli.WithProfiles([]string{"tools"}), composecli.WithInterpolation(true), composecli.WithResolvedPaths(true), composecli.WithConsistency(true))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checkImageBuiltOnce(t, p)
}

// TestHealthChecksProbeTheServicesOwnPort: each long-running service
// checks its own /healthz with the binary the image ships, on the port its
// MANDATE_HTTP_ADDR binds, and the check is a valid `mandate healthcheck`.
func TestHealthChecksProbeTheServicesOwnPort(t *testing.T) {
	p := load(t)
	hc := flags(t, []string{"healthcheck"})
	for name := range longRunning {
		s := service(t, p, name)
		if s.HealthCheck == nil || s.HealthCheck.Disable || len(s.HealthCheck.Test) == 0 {
			t.Errorf("%s has no health check", name)
			continue
		}
		httpAddr := env(s)["MANDATE_HTTP_ADDR"]
		want := []string{"CMD", binary, "healthcheck", "--url", "http://127.0.0.1:" + port(t, httpAddr) + "/healthz"}
		if !slices.Equal(s.HealthCheck.Test, want) {
			t.Errorf("%s health check %q, want %q", name, s.HealthCheck.Test, want)
		}
		_, args := subcommand(s.HealthCheck.Test[2:])
		for _, a := range args {
			if strings.HasPrefix(a, "--") {
				if _, ok := hc[strings.TrimPrefix(a, "--")]; !ok {
					t.Errorf("%s: `mandate healthcheck` has no flag %s", name, a)
				}
			}
		}
		if s.HealthCheck.Interval == nil || s.HealthCheck.Retries == nil {
			t.Errorf("%s health check without interval or retries", name)
		}
	}
}

// TestEnvironmentIsFlags: every service runs a real mandate subcommand,
// every flag in its command exists, and every MANDATE_* variable it sets
// is a flag of that subcommand — a renamed flag fails here, not at `up`.
func TestEnvironmentIsFlags(t *testing.T) {
	p := load(t)
	for name, s := range p.Services {
		if s.Image == "" || !strings.HasPrefix(s.Image, "mandate:") {
			continue // postgres, jaeger
		}
		sub, args := subcommand(s.Command)
		if len(sub) == 0 { // the tools service: variables of the operator tools
			tools := map[string]bool{}
			for _, tool := range [][]string{{"token"}, {"audit", "query"}, {"audit", "verify"}, {"policy", "apply"}, {"migrate"}, {"events", "tail"}} {
				for _, v := range flags(t, tool) {
					tools[v] = true
				}
			}
			for k := range env(s) {
				if strings.HasPrefix(k, "MANDATE_") && !tools[k] {
					t.Errorf("%s: %s is a flag of no operator tool", name, k)
				}
			}
			continue
		}
		accepted := flags(t, sub)
		byVar := map[string]bool{}
		for _, v := range accepted {
			byVar[v] = true
		}
		for _, a := range args {
			if f, ok := strings.CutPrefix(a, "-"); ok {
				if _, known := accepted[strings.TrimPrefix(f, "-")]; !known {
					t.Errorf("%s: `mandate %s` has no flag %s", name, strings.Join(sub, " "), a)
				}
			}
		}
		for k := range env(s) {
			if strings.HasPrefix(k, "MANDATE_") && !byVar[k] {
				t.Errorf("%s: `mandate %s` has no flag for %s", name, strings.Join(sub, " "), k)
			}
		}
		if cmd, ok := longRunning[name]; ok && (len(sub) != 1 || sub[0] != cmd) {
			t.Errorf("%s runs `mandate %s`, want `mandate %s`", name, strings.Join(sub, " "), cmd)
		}
	}
}

// TestServicesFindEachOther: the addresses services are given are the
// ones the named services listen on, and every long-running service
// exports traces to Jaeger's OTLP/gRPC port.
func TestServicesFindEachOther(t *testing.T) {
	p := load(t)
	grpcPort := func(name string) string { return port(t, env(service(t, p, name))["MANDATE_GRPC_ADDR"]) }
	for name := range longRunning {
		e := env(service(t, p, name))
		for _, k := range []string{"MANDATE_GRPC_ADDR", "MANDATE_HTTP_ADDR"} {
			if host, _, err := net.SplitHostPort(e[k]); err != nil || host != "0.0.0.0" {
				t.Errorf("%s: %s=%q does not listen on every interface of the container", name, k, e[k])
			}
		}
		if e["OTEL_EXPORTER_OTLP_ENDPOINT"] != "http://jaeger:4317" {
			t.Errorf("%s: OTEL_EXPORTER_OTLP_ENDPOINT=%q, want http://jaeger:4317", name, e["OTEL_EXPORTER_OTLP_ENDPOINT"])
		}
		if v := e["OTEL_EXPORTER_OTLP_PROTOCOL"]; v != "" && v != "grpc" {
			t.Errorf("%s: OTEL_EXPORTER_OTLP_PROTOCOL=%q but 4317 is Jaeger's gRPC port", name, v)
		}
	}
	ex := env(service(t, p, "executor"))
	wantAddr := map[string]string{
		"MANDATE_AUDIT_ADDR":   "audit:" + grpcPort("audit"),
		"MANDATE_CONFIRM_ADDR": "confirm:" + grpcPort("confirm"),
	}
	for k, want := range wantAddr {
		if ex[k] != want {
			t.Errorf("executor: %s=%q, want %q", k, ex[k], want)
		}
	}
	if got, want := env(service(t, p, "confirm"))["MANDATE_AUDIT_ADDR"], "audit:"+grpcPort("audit"); got != want {
		t.Errorf("confirm: MANDATE_AUDIT_ADDR=%q, want %q (its decision rows)", got, want)
	}
	if got, want := env(service(t, p, "mcpbridge"))["MANDATE_AUDIT_ADDR"], "audit:"+grpcPort("audit"); got != want {
		t.Errorf("mcpbridge: MANDATE_AUDIT_ADDR=%q, want %q (its edge refusals)", got, want)
	}
	backends := strings.Split(ex["MANDATE_BACKEND"], ",")
	slices.Sort(backends)
	if want := []string{"examples.helpdesk.v1.HelpdeskService=helpdesk:" + grpcPort("helpdesk"), "mandate.v1.CatalogService=catalog:" + grpcPort("catalog")}; !slices.Equal(backends, want) {
		t.Errorf("executor: MANDATE_BACKEND=%v, want %v", backends, want)
	}
	br := env(service(t, p, "mcpbridge"))
	for k, svc := range map[string]string{"MANDATE_CATALOG_ADDR": "catalog", "MANDATE_EXECUTOR_ADDR": "executor", "MANDATE_CONFIRM_ADDR": "confirm"} {
		if want := svc + ":" + grpcPort(svc); br[k] != want {
			t.Errorf("mcpbridge: %s=%q, want %q", k, br[k], want)
		}
	}
	if want := "http://localhost:" + port(t, br["MANDATE_HTTP_ADDR"]) + "/mcp"; br["MANDATE_RESOURCE_URL"] != want {
		t.Errorf("mcpbridge: MANDATE_RESOURCE_URL=%q, want %q (the published MCP endpoint)", br["MANDATE_RESOURCE_URL"], want)
	}
	cf := env(service(t, p, "confirm"))
	if want := "http://localhost:" + port(t, cf["MANDATE_HTTP_ADDR"]); cf["MANDATE_APPROVAL_BASE_URL"] != want {
		t.Errorf("confirm: MANDATE_APPROVAL_BASE_URL=%q, want %q (the published approval pages)", cf["MANDATE_APPROVAL_BASE_URL"], want)
	}
}

// TestConfirmSideEffectsAgrees: the executor enforces
// --confirm-side-effects and the catalog's tools state it, so compose gives
// both the one value an operator sets.
func TestConfirmSideEffectsAgrees(t *testing.T) {
	for _, want := range []string{"false", "true"} {
		var vars []string
		if want == "true" {
			vars = append(vars, "MANDATE_CONFIRM_SIDE_EFFECTS=true")
		}
		p := load(t, vars...)
		for _, name := range []string{"catalog", "executor"} {
			if got, ok := env(service(t, p, name))["MANDATE_CONFIRM_SIDE_EFFECTS"]; !ok || got != want {
				t.Errorf("%s: MANDATE_CONFIRM_SIDE_EFFECTS=%q (set %v), want %q", name, got, ok, want)
			}
		}
	}
}

// TestOnlyWhatAUserNeedsIsPublished: the MCP bridge, the executor's REST
// and gRPC ports, the approval pages and the Jaeger UI, on loopback only.
func TestOnlyWhatAUserNeedsIsPublished(t *testing.T) {
	p := load(t)
	for name, s := range p.Services {
		var got []uint32
		for _, pc := range s.Ports {
			got = append(got, pc.Target)
			if pc.HostIP != "127.0.0.1" || pc.Published != itoa(pc.Target) {
				t.Errorf("%s publishes %d as %s:%s, want 127.0.0.1:%d", name, pc.Target, pc.HostIP, pc.Published, pc.Target)
			}
		}
		slices.Sort(got)
		if want := published[name]; !slices.Equal(got, want) {
			t.Errorf("%s publishes %v, want %v", name, got, want)
		}
	}
	// The published container ports are the ones the services bind.
	for _, name := range []string{"mcpbridge", "executor", "confirm"} {
		e := env(service(t, p, name))
		for _, pt := range published[name] {
			if port(t, e["MANDATE_HTTP_ADDR"]) != itoa(pt) && port(t, e["MANDATE_GRPC_ADDR"]) != itoa(pt) {
				t.Errorf("%s publishes %d, which it does not listen on", name, pt)
			}
		}
	}
}

// TestREADMEPromises: the table of published endpoints in README.md names
// exactly the published ports of compose.yaml.
func TestREADMEPromises(t *testing.T) {
	p := load(t)
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `([a-z]+)` \\| [^|]*?(?:localhost|127\\.0\\.0\\.1):([0-9]+)")
	promised := map[string][]uint32{}
	sc := bufio.NewScanner(bytes.NewReader(readme))
	for sc.Scan() {
		if m := row.FindStringSubmatch(sc.Text()); m != nil {
			n, err := strconv.ParseUint(m[2], 10, 16)
			if err != nil {
				t.Fatalf("README port %q: %v", m[2], err)
			}
			promised[m[1]] = append(promised[m[1]], uint32(n))
		}
	}
	for name, ports := range promised {
		slices.Sort(ports)
		var got []uint32
		for _, pc := range service(t, p, name).Ports {
			got = append(got, pc.Target)
		}
		slices.Sort(got)
		if !slices.Equal(ports, got) {
			t.Errorf("README promises %s on %v, compose.yaml publishes %v", name, ports, got)
		}
	}
	for name := range published {
		if _, ok := promised[name]; !ok {
			t.Errorf("README's table does not list %s", name)
		}
	}
	for _, s := range []string{"MANDATE_DEV_SECRET", "MANDATE_SERVICE_SECRET", "POSTGRES_PASSWORD", "dev-only"} {
		if !bytes.Contains(readme, []byte(s)) {
			t.Errorf("README does not mention %s", s)
		}
	}
}

// TestSecretsAreDevOnlyDefaultsAndOverridable: unset, the secrets are
// marked dev-only, long enough and distinct (the services refuse a shared
// one); set in the environment, they replace the defaults everywhere.
func TestSecretsAreDevOnlyDefaultsAndOverridable(t *testing.T) {
	p := load(t)
	for name := range longRunning {
		e := env(service(t, p, name))
		dev, svc := e["MANDATE_DEV_SECRET"], e["MANDATE_SERVICE_SECRET"]
		if !strings.Contains(dev, "dev-only") || !strings.Contains(svc, "dev-only") || len(dev) < 32 || len(svc) < 32 || dev == svc {
			t.Errorf("%s: default secrets %q / %q (want distinct, >= 32 bytes, marked dev-only)", name, dev, svc)
		}
		if url := e["MANDATE_DATABASE_URL"]; url != "" && !strings.Contains(url, "dev-only") {
			t.Errorf("%s: default database URL %q is not marked dev-only", name, url)
		}
	}
	p = load(t, "MANDATE_DEV_SECRET=operator-dev-secret-0123456789abcdef", "MANDATE_SERVICE_SECRET=operator-service-secret-0123456789abcdef", "POSTGRES_PASSWORD=operator-pw")
	for name, s := range p.Services {
		for k, v := range env(s) {
			if strings.Contains(v, "dev-only") {
				t.Errorf("%s: %s keeps a dev-only default when the operator sets the secrets", name, k)
			}
		}
	}
	if got := env(service(t, p, "mandate"))["MANDATE_DEV_SECRET"]; got != "operator-dev-secret-0123456789abcdef" {
		t.Errorf("tools service dev secret %q", got)
	}
}

// TestDockerfileBuildsTheBinary: one multi-stage Dockerfile, built from the
// repository root, compiling ./cmd/mandate statically into the path the
// health checks call, running as a non-root user.
func TestDockerfileBuildsTheBinary(t *testing.T) {
	p := load(t)
	root := mustAbs(t, "../..")
	for name, s := range p.Services {
		if s.Build == nil {
			continue
		}
		if s.Build.Context != root || s.Build.Dockerfile != "deploy/compose/Dockerfile" {
			t.Errorf("%s builds %s with %s, want the repository root with deploy/compose/Dockerfile", name, s.Build.Context, s.Build.Dockerfile)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("build context is not the module root: %v", err)
	}
	src, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(src)
	var froms []string
	for _, l := range strings.Split(df, "\n") {
		if strings.HasPrefix(l, "FROM ") {
			froms = append(froms, l)
		}
	}
	if len(froms) != 2 || froms[0] != "FROM golang:1.26 AS build" {
		t.Errorf("stages %q, want a golang:1.26 build stage and a runtime stage", froms)
	}
	build := regexp.MustCompile(`CGO_ENABLED=0 go build -trimpath [^\n]*-o /out/mandate \./cmd/mandate\n`)
	if !build.MatchString(df) {
		t.Errorf("the build stage does not build ./cmd/mandate with -trimpath and CGO off")
	}
	for _, want := range []string{"COPY --from=build /out/mandate " + binary + "\n", "USER nonroot:nonroot\n", `ENTRYPOINT ["` + binary + `"]`} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "mandate", "main.go")); err != nil {
		t.Errorf("./cmd/mandate: %v", err)
	}
}

// TestOwnServiceOverride: own-service.yaml turns the stack onto a
// deployment's own manifest, policy and backend — every service that loads
// a manifest loads the mounted one, the policy job applies the mounted
// policy, the executor relays to the named backend — and refuses to load
// without its two variables.
func TestOwnServiceOverride(t *testing.T) {
	opts, err := composecli.NewProjectOptions([]string{"compose.yaml", "own-service.yaml"},
		composecli.WithName("mandate-test"), composecli.WithWorkingDirectory("."),
		composecli.WithEnv([]string{"MANDATE_OWN_DIR=/srv/inventory", "MANDATE_OWN_BACKEND=inventory.v1.InventoryService=host.docker.internal:9300"}),
		composecli.WithProfiles([]string{"tools"}), composecli.WithInterpolation(true), composecli.WithResolvedPaths(true), composecli.WithConsistency(true))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("compose.yaml + own-service.yaml do not load: %v", err)
	}
	for _, name := range []string{"confirm", "catalog", "executor", "mcpbridge"} {
		s := service(t, p, name)
		if e := env(s); e["MANDATE_MANIFEST"] != "/etc/mandate/own/manifest.json" || e["MANDATE_DESCRIPTORS"] != "/etc/mandate/own/descriptors.binpb" {
			t.Errorf("%s loads %q / %q", name, e["MANDATE_MANIFEST"], e["MANDATE_DESCRIPTORS"])
		}
		mounted := false
		for _, v := range s.Volumes {
			mounted = mounted || (v.Source == "/srv/inventory" && v.Target == "/etc/mandate/own" && v.ReadOnly)
		}
		if !mounted {
			t.Errorf("%s does not mount MANDATE_OWN_DIR read-only: %+v", name, s.Volumes)
		}
	}
	if got := env(service(t, p, "executor"))["MANDATE_BACKEND"]; got != "inventory.v1.InventoryService=host.docker.internal:9300,mandate.v1.CatalogService=catalog:9091" {
		t.Errorf("executor backends %q", got)
	}
	if got := strings.Join(service(t, p, "policy").Command, " "); got != "policy apply -f /etc/mandate/own/policy.yaml" {
		t.Errorf("policy job runs %q", got)
	}

	opts, err = composecli.NewProjectOptions([]string{"compose.yaml", "own-service.yaml"},
		composecli.WithName("mandate-test"), composecli.WithWorkingDirectory("."), composecli.WithEnv(nil), composecli.WithInterpolation(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := opts.LoadProject(context.Background()); err == nil || !strings.Contains(err.Error(), "MANDATE_OWN_") {
		t.Errorf("loads without MANDATE_OWN_DIR and MANDATE_OWN_BACKEND: %v", err)
	}
}

// TestNoRaceWithPostgresInit: Postgres is healthy only once it answers
// over TCP (the image's temporary init server listens on the socket
// alone), and the Dockerfile names no remote syntax image, so a build
// needs nothing from a registry beyond the base images.
func TestNoRaceWithPostgresInit(t *testing.T) {
	p := load(t)
	hc := service(t, p, "postgres").HealthCheck
	if hc == nil || !strings.Contains(strings.Join(hc.Test, " "), "pg_isready -h 127.0.0.1") {
		t.Errorf("postgres health check %+v does not check over TCP", hc)
	}
	df, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(df), "# syntax=") {
		t.Error("the Dockerfile names a syntax image, which every build fetches from a registry")
	}
	if got := env(service(t, p, "mcpbridge"))["MANDATE_ADVERTISE_URL"]; got != "http://mcpbridge:8085" {
		t.Errorf("the bridge advertises %q", got)
	}
}
