package compile_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/compile"
)

var update = flag.Bool("update", false, "rewrite the rule table of docs/build-rules.md from compile.Rules")

func ruleSeverity(t *testing.T, id string) compile.Severity {
	t.Helper()
	for _, r := range compile.Rules {
		if r.ID == id {
			return r.Severity
		}
	}
	t.Fatalf("rule %s is not in compile.Rules", id)
	return compile.SeverityError
}

// TestEveryRuleIsInTheTable: every rule id the compiler reports is in
// compile.Rules (which gives it its severity), every rule of the table is
// reported somewhere, and every one has a case in ruleCases that fires it.
func TestEveryRuleIsInTheTable(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(repoRoot(t), "internal", "compile", "compile.go"))
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, m := range regexp.MustCompile(`"(MANDATE1[0-9]{3})"`).FindAllStringSubmatch(string(src), -1) {
		used[m[1]] = true
	}
	fired := map[string]bool{}
	for _, tc := range ruleCases {
		fired[tc.wantRule] = true
	}
	var ids []string
	for _, r := range compile.Rules {
		ids = append(ids, r.ID)
		if !used[r.ID] {
			t.Errorf("%s is in the table but compile.go never reports it", r.ID)
		}
		if !fired[r.ID] {
			t.Errorf("%s has no case in ruleCases", r.ID)
		}
		if r.Checks == "" || r.Fix == "" {
			t.Errorf("%s does not say what it checks and how to fix it", r.ID)
		}
		delete(used, r.ID)
	}
	for id := range used {
		t.Errorf("compile.go reports %s, which is not in compile.Rules", id)
	}
	if !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != len(ids) {
		t.Errorf("compile.Rules is not in id order without repeats: %v", ids)
	}
}

const (
	ruleTableBegin = "<!-- rule table: generated from compile.Rules by `go test ./internal/compile -run BuildRulesDoc -update`; do not edit -->\n"
	ruleTableEnd   = "<!-- end of rule table -->\n"
)

// TestBuildRulesDoc keeps the table of docs/build-rules.md equal to
// compile.Rules. After changing a rule, run
// `go test ./internal/compile -run BuildRulesDoc -update`.
func TestBuildRulesDoc(t *testing.T) {
	path := filepath.Join(repoRoot(t), "docs", "build-rules.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := bytes.Cut(doc, []byte(ruleTableBegin))
	_, after, ok2 := bytes.Cut(rest, []byte(ruleTableEnd))
	if !ok || !ok2 {
		t.Fatalf("%s has lost the markers around its rule table", path)
	}
	var b strings.Builder
	b.WriteString("| rule | severity | checks | fix |\n| --- | --- | --- | --- |\n")
	for _, r := range compile.Rules {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.ID, r.Severity, cell(r.Checks), cell(r.Fix))
	}
	want := slices.Concat(before, []byte(ruleTableBegin), []byte(b.String()), []byte(ruleTableEnd), after)
	if *update {
		if err := os.WriteFile(path, want, 0o600); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !bytes.Equal(doc, want) {
		t.Fatalf("the rule table of %s differs from compile.Rules; run `go test ./internal/compile -run BuildRulesDoc -update`", path)
	}
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
