package app

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	genmanifest "github.com/mandate-dev/mandate/gen/manifest"
)

// loosened returns the sample manifest with ticket.refund's risk lowered
// (risk.lowered, high) and its reason allowed 5000 characters
// (schema.bound_relaxed, warn).
func loosened(t *testing.T) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(genmanifest.Manifest, &m); err != nil {
		t.Fatal(err)
	}
	for _, c := range m["commands"].([]any) {
		if c := c.(map[string]any); c["code"] == "ticket.refund" {
			c["risk"] = "L2"
			c["input_schema"].(map[string]any)["properties"].(map[string]any)["reason"].(map[string]any)["maxLength"] = 5000
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestManifestDiffExitCodes: 0 when nothing is at or above --fail-on, 1
// when something is (after overrides), 2 for usage and input errors.
func TestManifestDiffExitCodes(t *testing.T) {
	dir := t.TempDir()
	old := writeFile(t, dir, "old.json", genmanifest.Manifest)
	cur := writeFile(t, dir, "new.json", loosened(t))
	notManifest := writeFile(t, dir, "other.json", []byte(`{"format":"something/v9","commands":[]}`))
	accept := writeFile(t, dir, "accept.yaml", []byte("overrides:\n  - rule: risk.lowered\n    command: ticket.refund\n    severity: info\n    reason: reviewed\n"))
	ignoreAll := writeFile(t, dir, "ignore.yaml", []byte("overrides:\n  - rule: risk.lowered\n    severity: ignore\n    reason: r\n  - rule: schema.bound_relaxed\n    severity: ignore\n    reason: r\n"))
	unused := writeFile(t, dir, "unused.yaml", []byte("overrides:\n  - rule: sod.removed\n    severity: info\n    reason: r\n"))
	badOverrides := writeFile(t, dir, "bad.yaml", []byte("overrides:\n  - rule: risk.lowerd\n    severity: info\n    reason: r\n"))
	for _, tc := range []struct {
		name      string
		args      []string
		code      int
		out, errs string
	}{
		{"same manifest", []string{old, old}, 0, "", "0 high, 0 warn, 0 info; none at or above high"},
		{"risk lowered", []string{old, cur}, 1, "high  risk.lowered  ticket.refund  /risk  \"L3\" → \"L2\"", "1 high, 1 warn, 0 info; 1 at or above high: failed"},
		{"flags after the files", []string{old, cur, "--fail-on", "none"}, 0, "risk.lowered", "none at or above none"},
		{"accepted", []string{"--overrides", accept, old, cur}, 0, "[overridden from high: reviewed]", "0 high, 1 warn, 1 info"},
		{"accepted, fail on warn", []string{"--overrides", accept, "--fail-on=warn", old, cur}, 1, "schema.bound_relaxed", "1 at or above warn: failed"},
		{"all ignored, fail on info", []string{"--overrides", ignoreAll, "--fail-on", "info", old, cur}, 0, "", "0 high, 0 warn, 0 info"},
		{"unused override", []string{"--overrides", unused, old, old}, 0, "", "unused.yaml:2: the override of sod.removed matched no finding; remove it"},
		{"one file", []string{old}, 2, "", "want two manifests, OLD and NEW (got 1 arguments)"},
		{"missing file", []string{old, filepath.Join(dir, "nope.json")}, 2, "", "nope.json: no such file"},
		{"not a manifest", []string{old, notManifest}, 2, "", `format is "something/v9"`},
		{"bad fail-on", []string{"--fail-on", "low", old, cur}, 2, "", "--fail-on (MANDATE_FAIL_ON)"},
		{"bad overrides", []string{"--overrides", badOverrides, old, cur}, 2, "", `unknown rule "risk.lowerd" (did you mean "risk.lowered"?)`},
		{"missing overrides", []string{"--overrides", filepath.Join(dir, "none.yaml"), old, cur}, 2, "", "none.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := run(t, nil, append([]string{"manifest", "diff"}, tc.args...)...)
			if code != tc.code || !strings.Contains(out, tc.out) || !strings.Contains(errOut, tc.errs) {
				t.Fatalf("exit %d, stdout:\n%s\nstderr:\n%s\nwant exit %d, %q in stdout, %q in stderr", code, out, errOut, tc.code, tc.out, tc.errs)
			}
		})
	}
	// The other way round the changes tighten: info, exit 0.
	if code, out, errOut := run(t, nil, "manifest", "diff", cur, old); code != 0 || !strings.Contains(out, "info  risk.raised") {
		t.Fatalf("reversed: exit %d\n%s%s", code, out, errOut)
	}
	for _, args := range [][]string{{"manifest"}, {"manifest", "compare"}} {
		if code, _, errOut := run(t, nil, args...); code != 2 || !strings.Contains(errOut, "Usage: mandate manifest diff") {
			t.Errorf("%v: exit %d, %s", args, code, errOut)
		}
	}
	if code, _, _ := run(t, nil, "manifest", "diff", "-h"); code != 0 {
		t.Errorf("-h: exit %d", code)
	}
}

// TestManifestDiffJSON: --json is one report with the findings and the
// verdict; the exit code is the same as without it.
func TestManifestDiffJSON(t *testing.T) {
	dir := t.TempDir()
	old := writeFile(t, dir, "old.json", genmanifest.Manifest)
	cur := writeFile(t, dir, "new.json", loosened(t))
	code, out, errOut := run(t, map[string]string{"MANDATE_JSON": "true"}, "manifest", "diff", old, cur)
	if code != 1 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r struct {
		FailOn   string `json:"fail_on"`
		Failed   bool   `json:"failed"`
		Counts   map[string]int
		Findings []struct{ Rule, Severity, Command, Path string }
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !r.Failed || r.FailOn != "high" || r.Counts["high"] != 1 || r.Counts["warn"] != 1 || len(r.Findings) != 2 ||
		r.Findings[0].Path != "/input_schema/properties/reason/maxLength" || r.Findings[1].Rule != "risk.lowered" || r.Findings[1].Severity != "high" {
		t.Fatalf("report %+v", r)
	}
}

// TestManifestDiffReadsGitObjects: OLD may be REF:PATH, read with git show
// from the working directory's repository.
func TestManifestDiffReadsGitObjects(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	dir := t.TempDir()
	gitRun := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	gitRun("init", "-q")
	writeFile(t, dir, "manifest.json", genmanifest.Manifest)
	gitRun("add", "manifest.json")
	gitRun("commit", "-q", "-m", "release")
	gitRun("tag", "v0.1.0")
	writeFile(t, dir, "manifest.json", loosened(t))
	t.Chdir(dir)
	code, out, errOut := run(t, nil, "manifest", "diff", "v0.1.0:manifest.json", "manifest.json")
	if code != 1 || !strings.Contains(out, "risk.lowered  ticket.refund") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut = run(t, nil, "manifest", "diff", "v9.9.9:manifest.json", "manifest.json")
	if code != 2 || !strings.Contains(errOut, "v9.9.9:manifest.json: not a file, and git show failed") {
		t.Fatalf("unknown ref: exit %d, %s", code, errOut)
	}
}

// TestGovernanceDiffDocListsTheExitCodes: docs/governance-diff.md's exit
// code table has the codes the command uses.
func TestGovernanceDiffDocListsTheExitCodes(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "governance-diff.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, code := range []string{"`0` | no finding at or above `--fail-on`", "`1` | at least one finding at or above `--fail-on`", "`2` | usage or input error"} {
		if !strings.Contains(string(doc), "| "+code) {
			t.Errorf("docs/governance-diff.md does not list exit code %s", code)
		}
	}
	if diffExitClean != 0 || diffExitFindings != 1 || diffExitInput != 2 {
		t.Error("the exit codes changed: update docs/governance-diff.md")
	}
}
