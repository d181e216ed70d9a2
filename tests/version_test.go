package tests

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/manifest"
)

// TestVersionOfTheBuiltBinary: the binary as built reports its module
// version ("(devel)" from a work tree, or the pseudo-version Go stamps
// from VCS), a commit (the revision, or
// "unknown" when the build was not stamped, as under -buildvcs=false), the
// toolchain that built it and the digest of the manifest it embeds — as
// text and as the same values in JSON.
func TestVersionOfTheBuiltBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	root, _ := filepath.Abs("..")
	bin := mandateBinary(t, root)
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("mandate version: %v", err)
	}
	text := map[string]string{}
	for l := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		k, v, ok := strings.Cut(l, ": ")
		if !ok {
			t.Fatalf("line %q is not key: value", l)
		}
		text[k] = v
	}
	if v := text["version"]; v != "(devel)" && !strings.HasPrefix(v, "v") {
		t.Errorf("version %q is neither (devel) nor a module version", v)
	}
	if text["commit"] == "" || text["go"] != runtime.Version() || text["manifest_digest"] != set.Digest() {
		t.Fatalf("mandate version printed %v; want a commit, %s and %s", text, runtime.Version(), set.Digest())
	}
	if text["commit"] != "unknown" && len(text["commit"]) != 40 {
		t.Errorf("commit %q is neither unknown nor a git revision", text["commit"])
	}
	out, err = exec.Command(bin, "version", "--json").Output()
	if err != nil {
		t.Fatalf("mandate version --json: %v", err)
	}
	var js map[string]string
	if err := json.Unmarshal(out, &js); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	for k, v := range text {
		if js[k] != v {
			t.Errorf("--json %s = %q, the text says %q", k, js[k], v)
		}
	}
	t.Logf("%v", text)
}
