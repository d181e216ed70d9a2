package compile_test

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// repoRoot is the repository root, found from this file's location.
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// compileProtos compiles proto files in-process with the same import roots
// as buf.yaml and returns the descriptor set (imports first) with source
// info, as buf hands it to the plugin.
func compileProtos(t testing.TB, dir string, files ...string) *descriptorpb.FileDescriptorSet {
	t.Helper()
	root := repoRoot(t)
	c := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{
			dir,
			filepath.Join(root, "proto"),
			filepath.Join(root, "third_party", "protovalidate"),
			filepath.Join(root, "third_party", "googleapis"),
			filepath.Join(root, "third_party", "googleapis-extra"),
		}}),
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	res, err := c.Compile(t.Context(), files...)
	if err != nil {
		t.Fatalf("compiling %v: %v", files, err)
	}
	set := &descriptorpb.FileDescriptorSet{}
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := range imports.Len() {
			add(imports.Get(i).FileDescriptor)
		}
		set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
	}
	for _, f := range res {
		add(f)
	}
	return set
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
