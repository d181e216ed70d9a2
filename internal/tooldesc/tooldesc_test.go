package tooldesc_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/tooldesc"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestHelpdeskToolsGolden(t *testing.T) {
	s, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	got, err := manifest.Canonical(tooldesc.FromSet(s, tooldesc.Options{}), true)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "helpdesk_tools.golden.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("tool descriptors differ from %s; review the change and rerun with -update", golden)
	}
}

func TestAnnotations(t *testing.T) {
	s, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		code                                         string
		readOnly, destructive, idempotent, openWorld bool
		confirmation                                 bool
	}{
		{"ticket.search", true, false, true, false, false},
		// A human is asked for some refunds only: its conditions say which.
		{"ticket.refund", false, true, false, true, false},
		{"expense.report.create", false, false, true, false, false},
		{"expense.report.submit", false, false, true, true, false},
		{"expense.report.approve", false, true, true, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.code, func(t *testing.T) {
			c, ok := s.ByCode(tc.code)
			if !ok {
				t.Fatalf("%s not in the manifest", tc.code)
			}
			tool := tooldesc.FromCommand(c, tooldesc.Options{})
			a := tool.Annotations
			if a.ReadOnlyHint != tc.readOnly || a.DestructiveHint != tc.destructive || a.IdempotentHint != tc.idempotent || a.OpenWorldHint != tc.openWorld {
				t.Errorf("annotations %+v, want readOnly=%v destructive=%v idempotent=%v openWorld=%v", a, tc.readOnly, tc.destructive, tc.idempotent, tc.openWorld)
			}
			if tool.Meta[tooldesc.MetaConfirmationRequired] != tc.confirmation {
				t.Errorf("confirmation_required = %v, want %v", tool.Meta[tooldesc.MetaConfirmationRequired], tc.confirmation)
			}
			if tool.Name != tc.code || !strings.HasPrefix(tool.Description, c.DisplayName+" — "+c.AgentHint) {
				t.Errorf("name %q description %q", tool.Name, tool.Description)
			}
		})
	}
	refund, _ := s.ByCode("ticket.refund")
	meta := tooldesc.FromCommand(refund, tooldesc.Options{}).Meta
	if got := meta["mandate.dev/sensitive_fields"].([]string); len(got) != 1 || got[0] != "/cardholder_reference" {
		t.Errorf("sensitive fields = %v", got)
	}
	if got := meta["mandate.dev/side_effects"].([]string); len(got) != 2 || got[0] != "ledger" || got[1] != "payment-gateway" {
		t.Errorf("side effects = %v", got)
	}
}

// TestMetaKeys checks that every `_meta` key is under mandate.dev/ and that
// a key without a value is left out rather than set to "".
func TestMetaKeys(t *testing.T) {
	s, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tooldesc.FromSet(s, tooldesc.Options{}) {
		for k, v := range tool.Meta {
			if !strings.HasPrefix(k, "mandate.dev/") {
				t.Errorf("%s: _meta key %q is not under mandate.dev/", tool.Name, k)
			}
			if v == "" {
				t.Errorf("%s: _meta %q is an empty placeholder", tool.Name, k)
			}
		}
	}
	cases := []struct {
		code            string
		recall, feature any // nil: absent
	}{
		{"ticket.search", nil, nil},
		{"ticket.refund", nil, "refunds"},
		{"expense.report.create", nil, "expenses"},
		{"expense.report.submit", "expense.report.recall", "expenses"},
	}
	for _, tc := range cases {
		t.Run(tc.code, func(t *testing.T) {
			c, ok := s.ByCode(tc.code)
			if !ok {
				t.Fatalf("%s not in the manifest", tc.code)
			}
			meta := tooldesc.FromCommand(c, tooldesc.Options{}).Meta
			if meta[tooldesc.MetaRecall] != tc.recall || meta[tooldesc.MetaRequiredFeature] != tc.feature {
				t.Errorf("recall %v, required feature %v; want %v, %v", meta[tooldesc.MetaRecall], meta[tooldesc.MetaRequiredFeature], tc.recall, tc.feature)
			}
			if _, ok := meta[tooldesc.MetaRecall]; ok != (tc.recall != nil) {
				t.Errorf("recall key present = %v", ok)
			}
			if _, ok := meta[tooldesc.MetaRequiredFeature]; ok != (tc.feature != nil) {
				t.Errorf("required_feature key present = %v", ok)
			}
		})
	}
}

// TestConfirmSideEffects checks that a descriptor's confirmation_required
// follows the deployment's --confirm-side-effects as the executor does: a
// command with side effects, DEFAULT confirmation and risk below L3 needs
// confirmation only when the setting is on, a command without side effects
// never gains it, and a declared requirement never goes away.
func TestConfirmSideEffects(t *testing.T) {
	s, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	submit, ok := s.ByCode("expense.report.submit")
	if !ok || len(submit.SideEffects) == 0 || submit.Confirmation != "DEFAULT" || manifest.RiskLevel(submit.Risk) >= 3 {
		t.Fatalf("expense.report.submit is no longer a low-risk DEFAULT command with side effects: %+v", submit)
	}
	cases := []struct {
		code string
		on   bool
		want bool
	}{
		{"expense.report.submit", false, false},
		{"expense.report.submit", true, true},
		{"expense.report.create", true, false},
		{"ticket.search", true, false},
		{"ticket.refund", false, false}, // CONDITIONAL: its conditions say when
		{"ticket.refund", true, true},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s confirm-side-effects=%v", tc.code, tc.on), func(t *testing.T) {
			c, ok := s.ByCode(tc.code)
			if !ok {
				t.Fatalf("%s not in the manifest", tc.code)
			}
			o := tooldesc.Options{ConfirmSideEffects: tc.on}
			if got := tooldesc.FromCommand(c, o).Meta[tooldesc.MetaConfirmationRequired]; got != tc.want || o.ConfirmationRequired(c) != tc.want {
				t.Fatalf("confirmation_required = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestConditionsInWords: a command's declared conditions are said in its
// tool description, in the declaration's words (when a human is asked,
// when a call is refused), and listed under mandate.dev/conditions without
// their expressions; a command without conditions has neither.
func TestConditionsInWords(t *testing.T) {
	s, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	refund, _ := s.ByCode("ticket.refund")
	tool := tooldesc.FromCommand(refund, tooldesc.Options{})
	if want := refund.DisplayName + " — " + refund.AgentHint +
		" When a human is asked: a human is asked for a refund of 1.00 or more (100 minor units); a smaller refund runs at once." +
		" Refused: an agent may not refund more than 10,000.00 (1000000 minor units); such a refund is made by a user." +
		" Limits: an agent refunds at most 50.00 per currency a day (5000 minor units) (limit agent-daily-refunds; past it a human is asked)."; tool.Description != want {
		t.Errorf("description %q\nwant        %q", tool.Description, want)
	}
	conds, _ := tool.Meta[tooldesc.MetaConditions].([]tooldesc.Condition)
	if len(conds) != 2 || conds[0].ID != "refund-needs-a-human" || conds[0].Effect != "REQUIRE_CONFIRMATION" || conds[1].Effect != "DENY" {
		t.Errorf("conditions meta %+v", tool.Meta[tooldesc.MetaConditions])
	}
	search, _ := s.ByCode("ticket.search")
	plain := tooldesc.FromCommand(search, tooldesc.Options{})
	if _, ok := plain.Meta[tooldesc.MetaConditions]; ok || plain.Description != search.DisplayName+" — "+search.AgentHint {
		t.Errorf("a command without conditions: %q %v", plain.Description, plain.Meta)
	}
}
