// Package compiletest compiles .proto files in process for tests, with the
// import roots buf.yaml uses, and turns them into what protoc-gen-mandate
// would build from them: a descriptor set, or a loaded *manifest.Set. Tests
// that need commands the sample domain does not declare (an L4 four-eyes
// command, say) compile a fixture with it instead of hand-writing a
// manifest.
package compiletest

import (
	"path/filepath"
	"runtime"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/mandate-dev/mandate/internal/compile"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// Root is the repository root, found from this file's location.
func Root(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("compiletest: cannot locate the source file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Testdata is internal/compile/testdata, where the compiler's fixtures
// live (clean.proto declares every option legitimately).
func Testdata(t testing.TB) string {
	t.Helper()
	return filepath.Join(Root(t), "internal", "compile", "testdata")
}

// Protos compiles files (paths relative to dir) with dir, proto/ and the
// vendored third-party roots on the import path, and returns the
// descriptor set with source info, imports first, as buf hands it to a
// plugin.
func Protos(t testing.TB, dir string, files ...string) *descriptorpb.FileDescriptorSet {
	t.Helper()
	root := Root(t)
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
		t.Fatalf("compiletest: compiling %v: %v", files, err)
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

// Set compiles files as Protos does, builds the manifest of the commands
// they declare (compile.Compile, the build-time rules included) and loads
// it with its descriptors, as a deployment loads its own build.
func Set(t testing.TB, dir string, files ...string) *manifest.Set {
	t.Helper()
	out, err := compile.Compile(Protos(t, dir, files...), files)
	if err != nil {
		t.Fatalf("compiletest: building the manifest of %v: %v", files, err)
	}
	set, err := manifest.Load(out.Manifest, out.DescriptorSet)
	if err != nil {
		t.Fatalf("compiletest: loading the manifest of %v: %v", files, err)
	}
	return set
}
