package schema

import (
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	cases := []struct {
		name, in     string
		pointers     []string
		want         string
		wantWithheld string
	}{
		{"top level", `{"ticket_id":"T-1001","cardholder_reference":"CH4242424242"}`, []string{"/cardholder_reference"},
			`{"cardholder_reference":"[withheld]","ticket_id":"T-1001"}`, "/cardholder_reference"},
		{"absent field", `{"ticket_id":"T-1001"}`, []string{"/cardholder_reference"}, `{"ticket_id":"T-1001"}`, ""},
		{"list wildcard", `{"parties":[{"tax_id":"A"},{"tax_id":"B","name":"n"}]}`, []string{"/parties/*/tax_id"},
			`{"parties":[{"tax_id":"[withheld]"},{"name":"n","tax_id":"[withheld]"}]}`, "/parties/0/tax_id,/parties/1/tax_id"},
		{"nested object value", `{"card":{"number":"4242"}}`, []string{"/card"}, `{"card":"[withheld]"}`, "/card"},
		{"not an object", `[1,2]`, []string{"/x"}, `{}`, ""},
		{"not JSON", `card=4242`, []string{"/card"}, `{}`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, withheld := Redact([]byte(tc.in), tc.pointers)
			if string(out) != tc.want || strings.Join(withheld, ",") != tc.wantWithheld {
				t.Fatalf("Redact = %s %v, want %s %s", out, withheld, tc.want, tc.wantWithheld)
			}
			if strings.Contains(string(out), "4242") {
				t.Fatal("sensitive value survived")
			}
		})
	}
}
