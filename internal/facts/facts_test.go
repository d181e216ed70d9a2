package facts_test

import (
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/facts"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// TestSampleFacts: the helpdesk sample's ticket.refund and
// expense.report.create read as the approver's prompt needs them.
func TestSampleFacts(t *testing.T) {
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	refund, _ := set.ByCode("ticket.refund")
	f := refund.Facts()
	if f == nil {
		t.Fatal("ticket.refund has no facts")
	}
	cases := []struct {
		name      string
		kind      facts.Kind
		sensitive bool
	}{
		{"ticket_id", facts.Identifier, false},
		{"amount", facts.Money, false},
		{"reason", facts.Text, false},
		{"cardholder_reference", facts.Identifier, true},
	}
	for _, tc := range cases {
		fd := f.Input.Field(tc.name)
		if fd == nil || fd.Kind != tc.kind || fd.Sensitive != tc.sensitive || fd.Description == "" {
			t.Errorf("ticket.refund %s: %+v, want kind %s, sensitive %v, a description", tc.name, fd, tc.kind, tc.sensitive)
		}
	}
	if len(f.InputSensitive) != 1 || f.InputSensitive[0] != "/cardholder_reference" {
		t.Errorf("sensitive %q", f.InputSensitive)
	}
	create, _ := set.ByCode("expense.report.create")
	lines := create.Facts().Input.Field("lines")
	if lines == nil || !lines.List || lines.Kind != facts.Message {
		t.Fatalf("lines %+v", lines)
	}
	category := lines.Message.Field("category")
	if category == nil || category.Kind != facts.Enum || len(category.Values) == 0 {
		t.Fatalf("category %+v", category)
	}
	for _, v := range category.Values {
		if v.Name == "EXPENSE_CATEGORY_UNSPECIFIED" {
			t.Errorf("category lists %s, which its rules refuse", v.Name)
		}
	}
	if labels := create.Facts().Input.Field("labels"); labels == nil || !labels.Map || labels.Kind != facts.Text {
		t.Errorf("labels %+v", labels)
	}
	for _, c := range set.Commands() {
		want := time.Duration(0)
		if c.Deadline != "" {
			want, _ = time.ParseDuration(c.Deadline)
		}
		if c.Facts().Deadline != want {
			t.Errorf("%s: deadline %s, want %s", c.Code, c.Facts().Deadline, want)
		}
	}
}

func TestAnchoredPattern(t *testing.T) {
	for p, want := range map[string]bool{
		"^T-[0-9]{4,10}$": true, `^v[0-9]+\.[0-9]+$`: true, "^[A-Z]{3}$": true,
		"^.*$": false, "^[^<>]{1,200}$": false, `^\S+$`: false, `^\p{L}+$`: false, "T-[0-9]+$": false, "^T-[0-9]+": false,
	} {
		if got := facts.AnchoredPattern(p); got != want {
			t.Errorf("AnchoredPattern(%q) = %v, want %v", p, got, want)
		}
	}
}
