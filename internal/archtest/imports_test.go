// Package archtest holds tests of the code's architecture.
package archtest

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const (
	module   = "github.com/mandate-dev/mandate"
	services = module + "/services/"
)

// knownViolations lists, per service, the other services it still imports
// while its ports are moved onto the mandatev1 messages. It shrinks to
// nothing: an entry here is a debt, and an entry that is no longer needed
// fails the test so that it is removed.
var knownViolations = map[string][]string{}

// TestServicesImportNoOtherService: the proto is the contract between
// services. No non-test file of a service (services/X and its
// subpackages) imports another service's packages (services/Y/...); tests
// may, to assemble a topology.
func TestServicesImportNoOtherService(t *testing.T) {
	found := map[string][]string{}
	for _, p := range listPackages(t, module+"/services/...") {
		owner := serviceOf(p.ImportPath)
		for _, imp := range p.Imports {
			other := serviceOf(imp)
			if other == "" || other == owner {
				continue
			}
			if slices.Contains(knownViolations[owner], other) {
				found[owner] = append(found[owner], other)
				continue
			}
			t.Errorf("%s imports %s: services share the mandatev1 messages and internal/contract, never each other's packages", p.ImportPath, imp)
		}
	}
	for owner, others := range knownViolations {
		for _, other := range others {
			if !slices.Contains(found[owner], other) {
				t.Errorf("services/%s no longer imports services/%s: remove it from knownViolations", owner, other)
			}
		}
	}
}

// serviceOf returns the service a package belongs to ("" if none).
func serviceOf(pkg string) string {
	rest, ok := strings.CutPrefix(pkg, services)
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, "/")
	return name
}

// TestExamplesImportNoInternalPackage: the sample backend is built as a backend outside this
// module must be (docs/architecture/topology.md: Mandate governs services it has never seen),
// on the exported packages alone (pkg/backend, pkg/receipt, the generated gen/...). No non-test
// file under examples/ imports a package under internal/, which Go would refuse to another module. Tests
// are exempt for now: they mint tokens and build servers and databases with Mandate's internal
// helpers.
func TestExamplesImportNoInternalPackage(t *testing.T) {
	packages := 0
	for _, p := range listPackages(t, module+"/examples/...") {
		packages++
		for _, imp := range p.Imports {
			if imp == module+"/internal" || strings.HasPrefix(imp, module+"/internal/") {
				t.Errorf("%s imports %s: a backend is built on exported packages only (pkg/backend, pkg/receipt)", p.ImportPath, imp)
			}
		}
	}
	if packages == 0 {
		t.Fatal("go list found no package under examples/")
	}
}

// compositionRoots are the only packages outside services/ that may import
// a service's packages: the commands, and internal/app, which assembles
// services into processes (and into test topologies, internal/app/servicetest).
var compositionRoots = []string{module + "/cmd/", module + "/internal/app"}

// TestOnlyTheCompositionRootImportsServices: everything else a service is
// built from (internal/..., pkg/..., gen/..., examples/...) sits below the
// services, so no non-test file outside services/ and the composition root
// imports services/... — a shared package that reached up into a service
// would make every other service link it.
func TestOnlyTheCompositionRootImportsServices(t *testing.T) {
	checked := 0
	for _, p := range listPackages(t, module+"/...") {
		if serviceOf(p.ImportPath) != "" || slices.ContainsFunc(compositionRoots, func(root string) bool {
			return p.ImportPath == strings.TrimSuffix(root, "/") || strings.HasPrefix(p.ImportPath, strings.TrimSuffix(root, "/")+"/")
		}) {
			continue
		}
		checked++
		for _, imp := range p.Imports {
			if serviceOf(imp) != "" {
				t.Errorf("%s imports %s: only cmd/ and internal/app (the composition root) import services", p.ImportPath, imp)
			}
		}
	}
	if checked == 0 {
		t.Fatal("go list found no package outside services/ and the composition root")
	}
}

// runtimePackages are the packages that serve calls, by pattern: the
// executor and the MCP bridge, the gRPC/HTTP server scaffolding, and the
// runtime codec itself.
var runtimePackages = []string{
	module + "/services/executor/...",
	module + "/services/mcpbridge/...",
	module + "/internal/server/...",
	module + "/internal/schema",
}

// buildTimeOnly are the packages that run when a manifest is built, never
// when a call is served.
var buildTimeOnly = []string{
	module + "/internal/schema/jsonschema",
}

// TestRuntimeLinksNoJSONSchemaProjection: the JSON Schema projection of a
// message (internal/schema/jsonschema) is written into the tool
// descriptors at build time; what serves calls validates inputs with the
// runtime codec (internal/schema), which the projection imports and never
// the reverse. No non-test file of a runtime package depends on it,
// directly or through another package.
func TestRuntimeLinksNoJSONSchemaProjection(t *testing.T) {
	pkgs := listPackages(t, runtimePackages...)
	for _, pattern := range runtimePackages {
		root := strings.TrimSuffix(pattern, "/...")
		if !slices.ContainsFunc(pkgs, func(p pkg) bool { return p.ImportPath == root || strings.HasPrefix(p.ImportPath, root+"/") }) {
			t.Errorf("go list found no package for %s", pattern)
		}
	}
	for _, p := range pkgs {
		for _, dep := range p.Deps {
			if slices.Contains(buildTimeOnly, dep) {
				how := "depends on"
				if slices.Contains(p.Imports, dep) {
					how = "imports"
				}
				t.Errorf("%s %s %s: the JSON Schema projection runs at build time; runtime code decodes with internal/schema", p.ImportPath, how, dep)
			}
		}
	}
}

// pkg is a package as go list reports it: its path, its non-test imports
// and their transitive closure.
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// listPackages runs go list on patterns.
func listPackages(t *testing.T, patterns ...string) []pkg {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-json=ImportPath,Imports,Deps"}, patterns...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
}
