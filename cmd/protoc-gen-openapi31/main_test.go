package main

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
)

// request is a CodeGeneratorRequest for the helpdesk proto and its
// imports, from the compiled-in descriptors.
func request(param string) *pluginpb.CodeGeneratorRequest {
	var files []*descriptorpb.FileDescriptorProto
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
		files = append(files, protodesc.ToFileDescriptorProto(fd))
	}
	target := helpdeskv1.File_examples_helpdesk_v1_helpdesk_proto
	add(target)
	return &pluginpb.CodeGeneratorRequest{FileToGenerate: []string{target.Path()}, ProtoFile: files, Parameter: proto.String(param)}
}

func TestGenerate(t *testing.T) {
	resp := generate(request("title=Helpdesk,version=2.0"))
	if resp.GetError() != "" {
		t.Fatal(resp.GetError())
	}
	if len(resp.GetFile()) != 2 || resp.GetFile()[0].GetName() != "openapi.json" || resp.GetFile()[1].GetName() != "openapi.go" {
		t.Fatalf("files %v", resp.GetFile())
	}
	var doc struct {
		OpenAPI string `json:"openapi"`
		Info    struct{ Title, Version string }
		Paths   map[string]any
	}
	if err := json.Unmarshal([]byte(resp.GetFile()[0].GetContent()), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" || doc.Info.Title != "Helpdesk" || doc.Info.Version != "2.0" || doc.Paths["/v1/tickets/{ticket_id}:refund"] == nil {
		t.Fatalf("document %+v", doc)
	}
	if resp := generate(request("colour=blue")); !strings.Contains(resp.GetError(), `unknown parameter "colour"`) {
		t.Fatalf("an unknown parameter: %q", resp.GetError())
	}
}

// TestBufGenerate runs the real buf with the plugin binary on a copy of
// the repository's protos: it reproduces the committed gen/openapi byte
// for byte.
func TestBufGenerate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds buf and the plugin; skipped with -short")
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := t.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", filepath.Join(bin, "protoc-gen-openapi31"), "./cmd/protoc-gen-openapi31")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ws := t.TempDir()
	for _, dir := range []string{"proto", "third_party"} {
		copyTree(t, filepath.Join(root, dir), filepath.Join(ws, dir))
	}
	copyFile(t, filepath.Join(root, "buf.yaml"), filepath.Join(ws, "buf.yaml"))
	// The repository's template, reduced to this plugin.
	tmpl := mustRead(t, filepath.Join(root, "buf.gen.yaml"))
	i := bytes.Index(tmpl, []byte("  - local: bin/protoc-gen-openapi31"))
	j := bytes.Index(tmpl[i+1:], []byte("  - local:"))
	if i < 0 || j < 0 {
		t.Fatal("buf.gen.yaml does not run bin/protoc-gen-openapi31")
	}
	entry := strings.Replace(string(tmpl[i:i+1+j]), "bin/protoc-gen-openapi31", filepath.Join(bin, "protoc-gen-openapi31"), 1)
	if err := os.WriteFile(filepath.Join(ws, "buf.gen.yaml"), []byte("version: v2\nplugins:\n"+entry+"inputs:\n  - directory: proto\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "tool", "-modfile=tools/go.mod", "buf", "generate", ws, "--template", filepath.Join(ws, "buf.gen.yaml"), "-o", ws)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "BUF_CACHE_DIR="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("buf generate: %v\n%s", err, out)
	}
	for _, name := range []string{"openapi.json", "openapi.go"} {
		if !bytes.Equal(mustRead(t, filepath.Join(ws, "gen", "openapi", name)), mustRead(t, filepath.Join(root, "gen", "openapi", name))) {
			t.Errorf("%s differs from the committed gen/openapi/%s; run make generate", name, name)
		}
	}
}

func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		copyFile(t, path, filepath.Join(to, rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	if err := os.WriteFile(to, mustRead(t, from), 0o600); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path) //nolint:gosec // test reads the repository
	if err != nil {
		t.Fatal(err)
	}
	return b
}
