package compile_test

import (
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/mandate-dev/mandate/internal/compile/compiletest"
)

// repoRoot is the repository root.
func repoRoot(t testing.TB) string {
	t.Helper()
	return compiletest.Root(t)
}

// compileProtos compiles proto files in-process with the same import roots
// as buf.yaml and returns the descriptor set (imports first) with source
// info, as buf hands it to the plugin.
func compileProtos(t testing.TB, dir string, files ...string) *descriptorpb.FileDescriptorSet {
	t.Helper()
	return compiletest.Protos(t, dir, files...)
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
