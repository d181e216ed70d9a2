package manifestdiff_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/manifestdiff"
)

func TestOverridesRefuseBadEntries(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"unknown rule", "overrides:\n  - rule: risk.lowerd\n    severity: info\n    reason: r\n", `o.yaml:2: unknown rule "risk.lowerd" (did you mean "risk.lowered"?)`},
		{"bad severity", "overrides:\n  - rule: risk.lowered\n    severity: low\n    reason: r\n", `o.yaml:2: severity "low": want high, warn, info or ignore`},
		{"no reason", "overrides:\n  - rule: risk.lowered\n    severity: info\n", "o.yaml:2: the override of risk.lowered has no reason"},
		{"unknown key", "overrides:\n  - rule: risk.lowered\n    severity: info\n    reason: r\n    path: /risk\n", `o.yaml:5: unknown key "path"`},
		{"twice", "overrides:\n  - rule: risk.lowered\n    command: a\n    severity: info\n    reason: r\n  - rule: risk.lowered\n    command: a\n    severity: warn\n    reason: r\n",
			"o.yaml:6: risk.lowered for a is overridden twice (first at line 2)"},
		{"unknown top-level key", "override:\n  - rule: risk.lowered\n", "field override not found"},
		{"not a mapping", "overrides:\n  - risk.lowered\n", "o.yaml:2: an override is a mapping"},
	} {
		_, err := manifestdiff.ParseOverrides("o.yaml", []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, manifestdiff.ErrInput) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if o, err := manifestdiff.ParseOverrides("empty.yaml", []byte("# nothing accepted\n")); err != nil || o == nil {
		t.Errorf("a file of comments: %v", err)
	}
}

// TestOverridesApply: an entry for the rule and command wins over the
// rule's; ignore drops the finding; an entry that matched nothing is
// returned as unused; an overridden finding keeps its default and reason.
func TestOverridesApply(t *testing.T) {
	o, n := sample(t), sample(t)
	n.cmd(refund)["risk"] = "L2"
	n.cmd(search)["risk"] = "L1"   // risk.raised, info
	n.cmd(erase)["risk"] = "L3"    // risk.lowered on another command
	n.cmd(refund)["deadline"] = "" // deadline.changed
	findings := manifestdiff.Diff(o.parse(t, "old"), n.parse(t, "new"))
	ov, err := manifestdiff.ParseOverrides("o.yaml", []byte(`
overrides:
  - rule: risk.lowered
    severity: warn
    reason: every lowering is reviewed this release
  - rule: risk.lowered
    command: ticket.refund
    severity: info
    reason: refunds are capped upstream now
  - rule: deadline.changed
    severity: ignore
    reason: deadlines are operational
  - rule: sod.removed
    severity: info
    reason: nothing removes one here
`))
	if err != nil {
		t.Fatal(err)
	}
	kept, unused := ov.Apply(findings)
	sev := map[string]manifestdiff.Severity{}
	for _, f := range kept {
		sev[f.Rule+" "+f.Command] = f.Severity
		if f.Rule == "risk.lowered" && (f.Override == nil || f.Override.Default != high) {
			t.Errorf("%s %s: override %+v, want the default high recorded", f.Rule, f.Command, f.Override)
		}
	}
	want := map[string]manifestdiff.Severity{"risk.lowered ticket.refund": info, "risk.lowered customer.erase": warn, "risk.raised ticket.search": info}
	for k, s := range want {
		if sev[k] != s {
			t.Errorf("%s: %v, want %v", k, sev[k], s)
		}
	}
	if len(kept) != len(want) {
		t.Errorf("kept %d findings, want %d (deadline.changed ignored):\n%s", len(kept), len(want), text(t, kept))
	}
	if len(unused) != 1 || unused[0].Rule != "sod.removed" || unused[0].Line != 13 {
		t.Errorf("unused %+v, want sod.removed at line 13", unused)
	}
	if got := manifestdiff.Failing(kept, high); got != 0 {
		t.Errorf("failing at high: %d", got)
	}
	if got := manifestdiff.Failing(kept, warn); got != 1 {
		t.Errorf("failing at warn: %d, want 1", got)
	}
	if got := manifestdiff.Failing(kept, 0); got != 0 {
		t.Errorf("failing at none: %d", got)
	}
	var nilOverrides *manifestdiff.Overrides
	if k, u := nilOverrides.Apply(findings); len(k) != len(findings) || u != nil {
		t.Errorf("no overrides changed the findings")
	}
}

// TestJSONReport: the --json shape: severities by name, old and new as
// JSON values (null when absent), the override's default and reason.
func TestJSONReport(t *testing.T) {
	o, n := sample(t), sample(t)
	n.cmd(refund)["permissions"] = []any{}
	ov, err := manifestdiff.ParseOverrides("o.yaml", []byte("overrides:\n  - rule: permission.removed\n    severity: warn\n    reason: moved to the policy\n"))
	if err != nil {
		t.Fatal(err)
	}
	kept, _ := ov.Apply(manifestdiff.Diff(o.parse(t, "old"), n.parse(t, "new")))
	var b bytes.Buffer
	if err := manifestdiff.WriteJSON(&b, manifestdiff.Report{Old: "a", New: "b", FailOn: "high", Counts: manifestdiff.Count(kept), Findings: kept}); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Counts   map[string]int `json:"counts"`
		Findings []map[string]any
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Findings) != 1 || got.Counts["warn"] != 1 {
		t.Fatalf("report %s", b.String())
	}
	f := got.Findings[0]
	ovr, _ := f["override"].(map[string]any)
	if f["rule"] != "permission.removed" || f["severity"] != "warn" || f["old"] != "payment.refund" || f["new"] != nil ||
		f["command"] != refund || f["path"] != "/permissions/payment.refund" || ovr["default"] != "high" || ovr["reason"] != "moved to the policy" {
		t.Fatalf("finding %v", f)
	}
}
