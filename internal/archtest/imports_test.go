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

// pkg is a package as go list reports it: its path and its non-test imports.
type pkg struct {
	ImportPath string
	Imports    []string
}

// listPackages runs go list on pattern.
func listPackages(t *testing.T, pattern string) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports", pattern).Output()
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
