package main

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestBufGenerate runs the real buf with the real plugin binary on a copy
// of the repository's protos: the clean tree reproduces the committed
// manifest byte for byte, and an unsafe declaration fails the generation
// naming the rule and the command.
func TestBufGenerate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds buf and the plugin; skipped with -short")
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := t.TempDir()
	goBuild(t, root, "-o", filepath.Join(bin, "protoc-gen-mandate"), "./cmd/protoc-gen-mandate")

	t.Run("clean tree reproduces the committed manifest", func(t *testing.T) {
		ws := workspace(t, root, bin, nil)
		out, err := bufGenerate(t, root, ws)
		if err != nil {
			t.Fatalf("buf generate failed: %v\n%s", err, out)
		}
		for _, name := range []string{"manifest.json", "descriptors.binpb", "manifest.go"} {
			got := mustRead(t, filepath.Join(ws, "gen", "manifest", name))
			want := mustRead(t, filepath.Join(root, "gen", "manifest", name))
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the committed gen/manifest/%s; run make generate", name, name)
			}
		}
	})

	t.Run("confirmation NEVER on ticket.refund fails the build", func(t *testing.T) {
		ws := workspace(t, root, bin, func(helpdesk string) string {
			// The refund asks a human when its conditions say
			// (CONFIRMATION_CONDITIONAL); NEVER on an L3 command with side
			// effects is refused whatever the conditions.
			return strings.Replace(helpdesk, `confirmation: CONFIRMATION_CONDITIONAL`, `confirmation: CONFIRMATION_NEVER`, 1)
		})
		out, err := bufGenerate(t, root, ws)
		if err == nil {
			t.Fatalf("buf generate succeeded on an unsafe declaration:\n%s", out)
		}
		for _, want := range []string{"MANDATE1001", "ticket.refund", "CONFIRMATION_NEVER"} {
			if !strings.Contains(out, want) {
				t.Errorf("output does not mention %q:\n%s", want, out)
			}
		}
		if _, err := os.Stat(filepath.Join(ws, "gen", "manifest", "manifest.json")); err == nil {
			t.Error("a refused build still wrote a manifest")
		}
	})
}

func goBuild(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"build", "-trimpath", "-buildvcs=false"}, args...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", args, err, out)
	}
}

// workspace copies buf.yaml, proto/ and third_party/ into a temporary
// directory with a template that runs only protoc-gen-mandate.
func workspace(t *testing.T, root, bin string, editHelpdesk func(string) string) string {
	t.Helper()
	ws := t.TempDir()
	for _, dir := range []string{"proto", "third_party"} {
		copyTree(t, filepath.Join(root, dir), filepath.Join(ws, dir))
	}
	writeFile(t, filepath.Join(ws, "buf.yaml"), mustRead(t, filepath.Join(root, "buf.yaml")))
	writeFile(t, filepath.Join(ws, "buf.gen.yaml"), []byte(`version: v2
plugins:
  - local: `+filepath.Join(bin, "protoc-gen-mandate")+`
    out: gen/manifest
    strategy: all
inputs:
  - directory: proto
`))
	if editHelpdesk != nil {
		p := filepath.Join(ws, "proto", "examples", "helpdesk", "v1", "helpdesk.proto")
		writeFile(t, p, []byte(editHelpdesk(string(mustRead(t, p)))))
	}
	return ws
}

// bufGenerate runs the pinned buf (`go tool`, cached after the first
// build) from the repository root on the workspace.
func bufGenerate(t *testing.T, root, ws string) (string, error) {
	t.Helper()
	cmd := exec.Command("go", "tool", "-modfile=tools/go.mod", "buf", "generate", ws,
		"--template", filepath.Join(ws, "buf.gen.yaml"), "-o", ws)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "BUF_CACHE_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	return string(out), err
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
		b, err := os.ReadFile(path) //nolint:gosec // test copies the repository
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o600)
	})
	if err != nil {
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

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
