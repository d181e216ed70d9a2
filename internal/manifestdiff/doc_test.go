package manifestdiff_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/manifestdiff"
)

var update = flag.Bool("update", false, "rewrite the rule table of docs/governance-diff.md from manifestdiff.Rules")

const (
	ruleTableBegin = "<!-- rule table: generated from manifestdiff.Rules by `go test ./internal/manifestdiff -run GovernanceDiffDoc -update`; do not edit -->\n"
	ruleTableEnd   = "<!-- end of rule table -->\n"
)

var docPath = filepath.Join("..", "..", "docs", "governance-diff.md")

// TestGovernanceDiffDoc keeps the rules table of docs/governance-diff.md
// equal to manifestdiff.Rules: every rule id with its severity and when it
// reports. After changing a rule, run
// `go test ./internal/manifestdiff -run GovernanceDiffDoc -update`.
func TestGovernanceDiffDoc(t *testing.T) {
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := bytes.Cut(doc, []byte(ruleTableBegin))
	_, after, ok2 := bytes.Cut(rest, []byte(ruleTableEnd))
	if !ok || !ok2 {
		t.Fatalf("%s has lost the markers around its rule table", docPath)
	}
	var b strings.Builder
	b.WriteString("| rule | severity | when |\n| --- | --- | --- |\n")
	for _, r := range manifestdiff.Rules() {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", r.ID, r.Severity, strings.ReplaceAll(r.When, "|", `\|`))
	}
	want := slices.Concat(before, []byte(ruleTableBegin), []byte(b.String()), []byte(ruleTableEnd), after)
	if *update {
		if err := os.WriteFile(docPath, want, 0o600); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !bytes.Equal(doc, want) {
		t.Fatalf("the rule table of %s differs from manifestdiff.Rules; run `go test ./internal/manifestdiff -run GovernanceDiffDoc -update`", docPath)
	}
}

// TestRulesAreDistinctAndDescribed: ids unique, each with a severity and
// a sentence.
func TestRulesAreDistinctAndDescribed(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range manifestdiff.Rules() {
		if seen[r.ID] || r.When == "" || r.Severity < manifestdiff.Info || r.Severity > manifestdiff.High {
			t.Errorf("rule %+v: repeated, undescribed or without a severity", r)
		}
		seen[r.ID] = true
	}
}

// TestTheSampleKeepsItsPromise is `make governance-diff` as a test: the
// sample manifest the build generates against the previous release's
// (docs/governance/manifest-previous.json), with the accepted changes of
// docs/governance/accepted.yaml, has no high finding.
func TestTheSampleKeepsItsPromise(t *testing.T) {
	read := func(parts ...string) []byte {
		b, err := os.ReadFile(filepath.Join(append([]string{"..", ".."}, parts...)...))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	old, err := manifestdiff.Parse("manifest-previous.json", read("docs", "governance", "manifest-previous.json"))
	if err != nil {
		t.Fatal(err)
	}
	cur, err := manifestdiff.Parse("manifest.json", read("gen", "manifest", "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	ov, err := manifestdiff.ParseOverrides("accepted.yaml", read("docs", "governance", "accepted.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	findings, _ := ov.Apply(manifestdiff.Diff(old, cur))
	if n := manifestdiff.Failing(findings, manifestdiff.High); n > 0 {
		var b bytes.Buffer
		_ = manifestdiff.WriteText(&b, findings)
		t.Fatalf("%d high finding(s) against the previous release; accept them in docs/governance/accepted.yaml with a reason, or undo them:\n%s", n, b.String())
	}
}
