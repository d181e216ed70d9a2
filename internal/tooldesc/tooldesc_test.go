package tooldesc_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
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
	got, err := manifest.Canonical(tooldesc.FromSet(s), true)
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
		{"ticket.refund", false, true, false, true, true},
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
			tool := tooldesc.FromCommand(c)
			a := tool.Annotations
			if a.ReadOnlyHint != tc.readOnly || a.DestructiveHint != tc.destructive || a.IdempotentHint != tc.idempotent || a.OpenWorldHint != tc.openWorld {
				t.Errorf("annotations %+v, want readOnly=%v destructive=%v idempotent=%v openWorld=%v", a, tc.readOnly, tc.destructive, tc.idempotent, tc.openWorld)
			}
			if tool.Meta["mandate/confirmation_required"] != tc.confirmation {
				t.Errorf("confirmation_required = %v, want %v", tool.Meta["mandate/confirmation_required"], tc.confirmation)
			}
			if tool.Name != tc.code || tool.Description != c.DisplayName+" — "+c.AgentHint {
				t.Errorf("name %q description %q", tool.Name, tool.Description)
			}
		})
	}
	refund, _ := s.ByCode("ticket.refund")
	meta := tooldesc.FromCommand(refund).Meta
	if got := meta["mandate/sensitive_fields"].([]string); len(got) != 1 || got[0] != "/cardholder_reference" {
		t.Errorf("sensitive fields = %v", got)
	}
	if got := meta["mandate/side_effects"].([]string); len(got) != 2 || got[0] != "ledger" || got[1] != "payment-gateway" {
		t.Errorf("side effects = %v", got)
	}
}
