package archtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// binaries maps each per-service binary to the service it runs. A
// per-service binary exists to map less code while it idles (issue #13:
// each idle service <= 30 MB RSS), so it must link nothing of another
// service: not its packages, not its command, not the libraries only that
// service needs.
var binaries = map[string]string{
	module + "/cmd/mandate-audit":     "audit",
	module + "/cmd/mandate-catalog":   "catalog",
	module + "/cmd/mandate-confirm":   "confirm",
	module + "/cmd/mandate-executor":  "executor",
	module + "/cmd/mandate-mcpbridge": "mcpbridge",
	module + "/cmd/mandate-helpdesk":  "helpdesk",
}

// notPerService are the binaries under cmd/ that run no single service.
var notPerService = []string{
	module + "/cmd/mandate", // all-in-one: every service, `mandate dev`, the operator tools
	module + "/cmd/mandate-bench",
	module + "/cmd/protoc-gen-mandate",
	module + "/cmd/protoc-gen-openapi31",
}

// onlyFor are third-party modules a single service needs, by module path.
var onlyFor = map[string]string{
	"github.com/modelcontextprotocol/go-sdk": "mcpbridge",
	"github.com/nats-io/nats.go":             "executor", // the outbox relay
}

// allInOneOnly are packages, by path prefix, that only the all-in-one
// binary needs: the in-process transport of `mandate dev` and the
// migration runner of `mandate migrate`. No service runs them.
var allInOneOnly = []string{
	module + "/internal/server/inprocess",
	module + "/internal/storage/migrate/migrator",
	"github.com/fullstorydev/grpchan",
	"github.com/jhump/protoreflect",
	"github.com/pressly/goose",
}

// perServiceTags are the build tags `make binaries` and
// scripts/idle-rss.sh build the per-service binaries with.
const perServiceTags = "grpcnotrace"

// methodKeepers are packages that keep every exported method of every type
// a binary links, by the service allowed to link them ("" for none).
// text/template's executor looks methods up by names known only at run
// time (reflect.Value.MethodByName), so wherever it is reachable the
// linker can drop no exported method: some 5 MB more to map. text/template
// itself is not listed: every service links it through cel-go (cel's
// prompt templates, which nothing runs), and linked but never executed it
// keeps nothing; TestPerServiceBinariesCallNoMethodByName checks what the
// linker actually reaches.
var methodKeepers = map[string]string{
	"html/template":          "", // executes text/template; the approval pages write their HTML by hand
	"golang.org/x/net/trace": "", // gRPC's request tracing (html/template), which grpcnotrace leaves out
}

// TestPerServiceBinariesLinkOneService: the dependency graph of
// cmd/mandate-<service> holds no package of another service (services/Y,
// the helpdesk sample, internal/app/<Y>cmd), nor the all-in-one
// internal/app, nor a library only another service uses.
func TestPerServiceBinariesLinkOneService(t *testing.T) {
	mains := goList(t, "-f", "{{if eq .Name \"main\"}}{{.ImportPath}}{{end}}", module+"/cmd/...")
	for _, m := range strings.Fields(mains) {
		if _, ok := binaries[m]; !ok && !slices.Contains(notPerService, m) {
			t.Errorf("%s is neither in binaries nor in notPerService: name the service it runs", m)
		}
	}
	for bin, deps := range binaryDeps(t) {
		own := binaries[bin]
		for _, dep := range deps {
			if other := ownerOf(dep); other != "" && other != own {
				t.Errorf("%s (service %s) links %s, which belongs to %s", bin, own, dep, other)
			}
		}
	}
}

// binaryDeps returns every per-service binary's dependencies, as go list
// sees them with the build flags given.
func binaryDeps(t *testing.T, flags ...string) map[string][]string {
	t.Helper()
	args := append(slices.Clone(flags), "-json=ImportPath,Deps")
	for b := range binaries {
		args = append(args, b)
	}
	deps := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(goList(t, args...)))
	for {
		var p struct {
			ImportPath string
			Deps       []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return deps
		} else if err != nil {
			t.Fatal(err)
		}
		deps[p.ImportPath] = p.Deps
	}
}

// ownerOf returns the service a package belongs to, "all-in-one" for the
// mandate binary's own command package, or "" for shared packages.
func ownerOf(pkg string) string {
	if s := serviceOf(pkg); s != "" {
		return s
	}
	if pkg == module+"/examples/helpdesk" || strings.HasPrefix(pkg, module+"/examples/helpdesk/") {
		return "helpdesk"
	}
	if pkg == module+"/internal/app" {
		return "all-in-one"
	}
	if rest, ok := strings.CutPrefix(pkg, module+"/internal/app/"); ok {
		if name, ok := strings.CutSuffix(rest, "cmd"); ok && !strings.Contains(name, "/") {
			return name
		}
	}
	for mod, svc := range onlyFor {
		if pkg == mod || strings.HasPrefix(pkg, mod+"/") {
			return svc
		}
	}
	for _, prefix := range allInOneOnly {
		if pkg == prefix || strings.HasPrefix(pkg, prefix+"/") {
			return "all-in-one"
		}
	}
	return ""
}

// TestPerServiceBinariesKeepDeadCodeElimination: built as `make binaries`
// builds them, no per-service binary links a package that stops the linker
// from dropping unused methods, unless its service needs it.
func TestPerServiceBinariesKeepDeadCodeElimination(t *testing.T) {
	for bin, deps := range binaryDeps(t, "-tags", perServiceTags) {
		own := binaries[bin]
		for _, dep := range deps {
			if allowed, ok := methodKeepers[dep]; ok && allowed != own {
				t.Errorf("%s (service %s, -tags %s) links %s, which keeps every exported method alive", bin, own, perServiceTags, dep)
			}
		}
	}
}

// goList runs `go list args…` and returns its output.
func goList(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	return string(out)
}

// TestPerServiceBinariesCallNoMethodByName: the linker's own view of what
// TestPerServiceBinariesKeepDeadCodeElimination approximates with package
// lists. Each per-service binary is linked as `make binaries` links it,
// with -dumpdep; no function the compiler marked <ReflectMethod> (one that
// calls reflect.Value.Method or MethodByName with a name it cannot see,
// as text/template's executor does) may be reachable, since one such
// function makes the linker keep every exported method of every type.
func TestPerServiceBinariesCallNoMethodByName(t *testing.T) {
	if testing.Short() {
		t.Skip("links every per-service binary")
	}
	dir := t.TempDir()
	for _, bin := range slices.Sorted(maps.Keys(binaries)) {
		cmd := exec.Command("go", "build", "-trimpath", "-tags", perServiceTags, "-ldflags=-dumpdep",
			"-o", filepath.Join(dir, path.Base(bin)), bin)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		var stdout bytes.Buffer
		cmd.Stdout = &stdout
		dump, err := cmd.StderrPipe() // go build relays the linker's dump on its stderr
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		reflecting, tail := reflectMethodCallers(dump)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("go build %s: %v\n%s%s", bin, err, stdout.String(), tail)
		}
		for _, fn := range reflecting {
			t.Errorf("%s (-tags %s) reaches %s, which calls a method by a name known only at run time: the linker keeps every exported method",
				bin, perServiceTags, fn)
		}
	}
}

// reflectMethodCallers reads a linker's -dumpdep output ("from -> to" per
// line, a symbol followed by its flags) and returns the reachable symbols
// flagged <ReflectMethod>, and the last lines read (for a failed build).
func reflectMethodCallers(dump io.Reader) (callers []string, tail string) {
	sc := bufio.NewScanner(dump)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var last []string
	for sc.Scan() {
		line := sc.Text()
		if last = append(last, line); len(last) > 20 {
			last = last[1:]
		}
		for _, sym := range strings.Split(line, " -> ") {
			if name, ok := strings.CutSuffix(sym, " <ReflectMethod>"); ok && !slices.Contains(callers, name) {
				callers = append(callers, name)
			}
		}
	}
	_, _ = io.Copy(io.Discard, dump)
	return callers, strings.Join(last, "\n")
}
