package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// adoptingExpect is what each `sh` block of docs/adopting.md's "The path,
// step by step" must print, in order; the test fails when the counts
// differ, so the guide cannot grow an untested block.
var adoptingExpect = [][]string{
	{"wrote 16 files to third_party/mandate"},
	{},
	{},
	{"would add tenant shop", "would add user shop/cora"},
}

// TestAdoptingGuide runs the `sh` blocks of docs/adopting.md's path in a
// copy of examples/inventory (its replace pointed back at this checkout),
// with this checkout's `mandate` and buf on PATH, against a fresh
// database: every command the guide gives an adopter works as written.
func TestAdoptingGuide(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a second module and runs the binary")
	}
	root, _ := filepath.Abs("..")
	guide, err := os.ReadFile(filepath.Join(root, "docs", "adopting.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(guide), "\n## The path, step by step\n")
	if !ok {
		t.Fatal(`docs/adopting.md has no "## The path, step by step" section`)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	var blocks []string
	for {
		_, after, ok := strings.Cut(rest, "\n```sh\n")
		if !ok {
			break
		}
		body, next, ok := strings.Cut(after, "\n```\n")
		if !ok {
			t.Fatal("unterminated ```sh block")
		}
		blocks = append(blocks, body)
		rest = "\n" + next
	}
	if len(blocks) != len(adoptingExpect) {
		t.Fatalf("the guide's path has %d sh blocks; adoptingExpect lists %d", len(blocks), len(adoptingExpect))
	}

	// The adopter's module: a copy of the sample without its generated
	// code and exported protos, which the guide's commands write again.
	work := filepath.Join(t.TempDir(), "inventory")
	if out, err := exec.Command("cp", "-r", filepath.Join(root, "examples", "inventory"), work).CombinedOutput(); err != nil {
		t.Fatalf("copying the sample: %v %s", err, out)
	}
	for _, d := range []string{"gen", "third_party"} {
		if err := os.RemoveAll(filepath.Join(work, d)); err != nil {
			t.Fatal(err)
		}
	}
	edit := exec.Command("go", "mod", "edit", "-replace", "github.com/mandate-dev/mandate="+root)
	edit.Dir = work
	if out, err := edit.CombinedOutput(); err != nil {
		t.Fatalf("go mod edit: %v %s", err, out)
	}
	bin := t.TempDir()
	if err := os.Symlink(mandateBinary(t, root), filepath.Join(bin, "mandate")); err != nil {
		t.Fatal(err)
	}
	wrapper := "#!/bin/sh\nexec go tool -modfile=" + filepath.Join(root, "tools", "go.mod") + " buf \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "buf"), []byte(wrapper), 0o755); err != nil { //nolint:gosec // an executable the test runs
		t.Fatal(err)
	}
	_, url := topologyDatabase(t, "")
	env := append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "MANDATE_DATABASE_URL="+url)
	migrate := exec.Command(filepath.Join(bin, "mandate"), "migrate")
	migrate.Env = env
	if out, err := migrate.CombinedOutput(); err != nil {
		t.Fatalf("mandate migrate: %v\n%s", err, out)
	}
	for i, b := range blocks {
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", b)
		cmd.Dir, cmd.Env = work, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("block %d failed: %v\n%s\n--- output ---\n%s", i+1, err, b, out)
		}
		for _, want := range adoptingExpect[i] {
			if !strings.Contains(string(out), want) {
				t.Errorf("block %d does not print %q:\n%s", i+1, want, out)
			}
		}
	}
	for _, f := range []string{"gen/manifest/manifest.json", "gen/inventory/v1/inventory_grpc.pb.go", "third_party/mandate/mandate/v1/options.proto"} {
		if _, err := os.Stat(filepath.Join(work, f)); err != nil {
			t.Errorf("the guide's commands did not write %s: %v", f, err)
		}
	}
}
