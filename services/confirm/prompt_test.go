package confirm_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestRenderPromptGolden renders prompts from real declarations (the
// embedded helpdesk manifest) and from the fixtures, and compares them with
// reviewed golden files. Regenerate them with
// `go test ./services/confirm -run Golden -update`.
func TestRenderPromptGolden(t *testing.T) {
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	fixtures := confirmtest.Commands()
	lookup := func(code string) *manifest.Command {
		if c, ok := set.ByCode(code); ok {
			return c
		}
		return fixtures[code]
	}
	cases := []struct {
		name, code string
		in         confirm.PromptInput
	}{
		{"ticket_refund_by_agent", "ticket.refund", confirm.PromptInput{
			// The executor withheld the card reference already.
			ArgumentsJSON:  `{"ticket_id": "T-1042", "amount_cents": 1250, "reason": "damaged <b>item</b>", "cardholder_reference": "[withheld]"}`,
			WithheldFields: []string{"/cardholder_reference"},
			RequesterUser:  "alice", RequesterAgent: "support-bot",
		}},
		{"ticket_refund_sensitive_value_reached_the_renderer", "ticket.refund", confirm.PromptInput{
			// It did not: the renderer withholds it anyway.
			ArgumentsJSON: `{"ticket_id":"T-7","amount_cents":99,"cardholder_reference":"4111-1111-SECRET"}`,
			RequesterUser: "alice",
		}},
		{"ticket_refund_money", "ticket.refund", confirm.PromptInput{
			ArgumentsJSON:  `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"2500"},"reason":"Charged twice","cardholder_reference":"[withheld]"}`,
			WithheldFields: []string{"/cardholder_reference"},
			RequesterUser:  "carol", RequesterAgent: "finance-bot",
		}},
		{"ticket_refund_hostile_reason", "ticket.refund", confirm.PromptInput{
			// Bidi overrides make the reason read "25.00 EUR" next to an
			// amount of 9,999.99 EUR: shown as markers, never obeyed.
			ArgumentsJSON:  "{\"ticket_id\":\"T-1001\",\"amount\":{\"currency_code\":\"EUR\",\"amount_minor\":\"999999\"},\"reason\":\"Approved amount: \u202eRUE 00.52\u202c\u2066\u200f\u2069\",\"cardholder_reference\":\"[withheld]\"}",
			WithheldFields: []string{"/cardholder_reference"},
			RequesterUser:  "carol", RequesterAgent: "finance-bot",
		}},
		{"expense_create_enum_and_nested_money", "expense.report.create", confirm.PromptInput{
			ArgumentsJSON: `{"title":"Customer visit Lyon","payroll_id":"P-1234","labels":{"project":"atlas"},
				"lines":[{"description":"Train","amount":{"currency_code":"EUR","amount_minor":"8990"},"category":"EXPENSE_CATEGORY_TRAVEL"},
				{"description":"Hotel","amount":{"currency_code":"JPY","amount_minor":"12000"},"category":"EXPENSE_CATEGORY_LODGING"}]}`,
			RequesterUser: "bob",
		}},
		{"expense_submit_reversible", "expense.report.submit", confirm.PromptInput{
			ArgumentsJSON: `{"report_id":"R-9"}`, RequesterUser: "bob",
		}},
		{"payout_four_eyes_nested_sensitive", "payment.payout", confirm.PromptInput{
			ArgumentsJSON: `{"vendor":"V-1","amount_cents":1000000,"iban":"DE89370400440532013000",
				"beneficiaries":[{"name":"A","iban":"FR7630006000011234567890189"},{"name":"B"}]}`,
			RequesterUser: "alice", RequesterAgent: "support-bot",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := lookup(tc.code)
			if cmd == nil {
				t.Fatalf("no declaration %s", tc.code)
			}
			p, err := confirm.RenderPrompt(cmd, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := confirm.RenderPrompt(cmd, tc.in)
			got, _ := json.MarshalIndent(p, "", "  ")
			if twice, _ := json.MarshalIndent(again, "", "  "); !bytes.Equal(got, twice) {
				t.Fatal("rendering is not deterministic")
			}
			got = append(got, '\n')
			for _, secret := range []string{"4111-1111-SECRET", "DE89370400440532013000", "FR7630006000011234567890189"} {
				if bytes.Contains(got, []byte(secret)) {
					t.Fatalf("the prompt shows the sensitive value %s", secret)
				}
			}
			path := filepath.Join("testdata", "prompt_"+tc.name+".golden.json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("prompt differs from %s (rerun with -update and review the diff):\n%s", path, got)
			}
		})
	}
}

func TestRenderPromptRefuses(t *testing.T) {
	cmd := confirmtest.Commands()["ticket.refund"]
	cases := []struct {
		name string
		in   confirm.PromptInput
	}{
		{"not JSON", confirm.PromptInput{ArgumentsJSON: `{"a":`}},
		{"not an object", confirm.PromptInput{ArgumentsJSON: `[1,2]`}},
		{"trailing data", confirm.PromptInput{ArgumentsJSON: `{} {}`}},
		{"bad pointer", confirm.PromptInput{ArgumentsJSON: `{}`, WithheldFields: []string{"card"}}},
		{"too large", confirm.PromptInput{ArgumentsJSON: `{"a":"` + strings.Repeat("x", 70000) + `"}`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.RequesterUser = "alice"
			if _, err := confirm.RenderPrompt(cmd, tc.in); !errors.Is(err, confirm.ErrInvalid) {
				t.Fatalf("got %v, want schema.invalid", err)
			}
		})
	}
	if p, err := confirm.RenderPrompt(cmd, confirm.PromptInput{RequesterUser: "alice"}); err != nil || p.ArgumentsJSON != "{}" {
		t.Fatalf("no arguments: %q %v", p.ArgumentsJSON, err)
	}
}

// TestRenderPromptReasons: the conditions an OpenRequest names become the
// prompt's reasons in the declaration's words, with their ids, neutralised;
// an id that is not a condition of the command asking for a confirmation
// (unknown, or a DENY) is refused, so the caller cannot write the reason.
func TestRenderPromptReasons(t *testing.T) {
	cmd := *confirmtest.Commands()["ticket.refund"]
	cmd.Conditions = []manifest.Condition{
		{ID: "large", Expression: "request.amount.amount_minor > 2000", Effect: "REQUIRE_CONFIRMATION", Description: "a human is asked above 20.00\u202e"},
		{ID: "no-bots", Expression: "principal.agent != ''", Effect: "DENY", Description: "no agents"},
	}
	p, err := confirm.RenderPrompt(&cmd, confirm.PromptInput{RequesterUser: "alice", Conditions: []string{"large"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Reasons) != 1 || p.Reasons[0] != "a human is asked above 20.00⟦U+202E⟧ (condition large)" {
		t.Fatalf("reasons %q", p.Reasons)
	}
	if p, _ := confirm.RenderPrompt(&cmd, confirm.PromptInput{RequesterUser: "alice"}); p.Reasons != nil {
		t.Errorf("a prompt no condition asked for has reasons %q", p.Reasons)
	}
	for _, ids := range [][]string{{"unknown"}, {"no-bots"}} {
		if _, err := confirm.RenderPrompt(&cmd, confirm.PromptInput{RequesterUser: "alice", Conditions: ids}); !errors.Is(err, confirm.ErrInvalid) {
			t.Errorf("conditions %v: %v, want refused as invalid", ids, err)
		}
	}
}
