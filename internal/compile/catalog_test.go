package compile_test

import (
	"path/filepath"
	"testing"

	"github.com/mandate-dev/mandate/internal/compile"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// TestWithCatalogCommands: a deployment's build that declares only its own
// commands gets the catalog's ops.review too, with the descriptors it
// needs, and the manifest loads; a build that has the catalog's file
// (this repository's) is unchanged.
func TestWithCatalogCommands(t *testing.T) {
	set := compileProtos(t, filepath.Join(repoRoot(t), "internal", "compile", "testdata"), "clean.proto")
	fds, targets, err := compile.WithCatalogCommands(set, []string{"clean.proto"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := compile.Compile(fds, targets)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := manifest.Load(out.Manifest, out.DescriptorSet)
	if err != nil {
		t.Fatal(err)
	}
	review, ok := loaded.ByCode("ops.review")
	if !ok || review.RPC.Service != "mandate.v1.CatalogService" || !review.Published() {
		t.Fatalf("ops.review: %+v %v", review, ok)
	}
	if _, ok := loaded.ByCode("ledger.entry.get"); !ok {
		t.Fatal("the build's own command is missing")
	}
	if len(set.GetFile()) == len(fds.GetFile()) {
		t.Fatal("the input was changed in place or nothing was added")
	}

	again, targets2, err := compile.WithCatalogCommands(fds, targets)
	if err != nil || len(again.GetFile()) != len(fds.GetFile()) || len(targets2) != len(targets) {
		t.Fatalf("a build with the catalog's file changed: %d → %d files, %v → %v (%v)", len(fds.GetFile()), len(again.GetFile()), targets, targets2, err)
	}
}
