package confirm_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/compile/compiletest"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/confirm"
)

// refund is the helpdesk sample's ticket.refund declaration.
func refund(t *testing.T) *manifest.Command {
	t.Helper()
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	cmd, ok := set.ByCode("ticket.refund")
	if !ok {
		t.Fatal("no ticket.refund in the embedded manifest")
	}
	return cmd
}

// field returns the field at pointer, failing the test without one.
func field(t *testing.T, fields []confirm.PromptField, pointer string) confirm.PromptField {
	t.Helper()
	for _, f := range fields {
		if f.Pointer == pointer {
			return f
		}
	}
	t.Fatalf("no field %s in %+v", pointer, fields)
	return confirm.PromptField{}
}

func TestNeutralise(t *testing.T) {
	cases := []struct {
		name, in, want string
		marked         bool
	}{
		{"plain", "Charged twice, 25.00 EUR", "Charged twice, 25.00 EUR", false},
		{"right-to-left script stays", "שלום עולם", "שלום עולם", false},
		{"accents and emoji stay", "café 👍", "café 👍", false},
		{"no-break space stays", "25\u00a0EUR", "25\u00a0EUR", false},
		{"RLO and PDF", "a\u202eRUE 00.52\u202cb", "a⟦U+202E⟧RUE 00.52⟦U+202C⟧b", true},
		{"embeddings", "\u202a\u202b\u202d", "⟦U+202A⟧⟦U+202B⟧⟦U+202D⟧", true},
		{"isolates", "\u2066\u2067\u2068\u2069", "⟦U+2066⟧⟦U+2067⟧⟦U+2068⟧⟦U+2069⟧", true},
		{"marks", "\u200e\u200f\u061c", "⟦U+200E⟧⟦U+200F⟧⟦U+061C⟧", true},
		{"C0 controls, newline and tab", "a\x00b\nc\td\re", "a⟦U+0000⟧b⟦U+000A⟧c⟦U+0009⟧d⟦U+000D⟧e", true},
		{"DEL and C1", "\x7f\u0085\u009b", "⟦U+007F⟧⟦U+0085⟧⟦U+009B⟧", true},
		{"zero width and BOM", "1\u200b0\u200d0\ufeff", "1⟦U+200B⟧0⟦U+200D⟧0⟦U+FEFF⟧", true},
		{"soft hyphen", "refund\u00ad", "refund⟦U+00AD⟧", true},
		{"line and paragraph separators", "a\u2028b\u2029", "a⟦U+2028⟧b⟦U+2029⟧", true},
		{"tag characters", "x\U000E0041\U000E007F", "x⟦U+E0041⟧⟦U+E007F⟧", true},
		{"variation selector", "\ufe0f", "⟦U+FE0F⟧", true},
		{"Hangul filler", "\u3164", "⟦U+3164⟧", true},
		{"private use", "\ue000", "⟦U+E000⟧", true},
		{"a faked marker is marked", "⟦U+202E⟧", "⟦U+27E6⟧U+202E⟦U+27E7⟧", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, marked := confirm.Neutralise(tc.in)
			if got != tc.want || marked != tc.marked {
				t.Fatalf("Neutralise(%q) = %q, %v; want %q, %v", tc.in, got, marked, tc.want, tc.marked)
			}
		})
	}
}

func TestPromptFieldsMoney(t *testing.T) {
	cmd := refund(t)
	cases := []struct {
		name, amount, currency   string
		wantValue, wantRaw, want string // want: a problem substring, "" for none
	}{
		{"EUR", `"2500"`, "EUR", "25.00 EUR", "2500 minor units", ""},
		{"EUR as a JSON number", `2500`, "EUR", "25.00 EUR", "2500 minor units", ""},
		{"hostile amount", `"999999"`, "EUR", "9,999.99 EUR", "999999 minor units", ""},
		{"cents only", `"5"`, "EUR", "0.05 EUR", "5 minor units", ""},
		{"zero", `"0"`, "EUR", "0.00 EUR", "0 minor units", ""},
		{"leading zeros", `"0002500"`, "EUR", "25.00 EUR", "0002500 minor units", ""},
		{"negative", `"-123456"`, "EUR", "-1,234.56 EUR", "-123456 minor units", ""},
		{"negative zero", `"-0"`, "EUR", "0.00 EUR", "-0 minor units", ""},
		{"int64 max", `"9223372036854775807"`, "EUR", "92,233,720,368,547,758.07 EUR", "9223372036854775807 minor units", ""},
		{"int64 min", `"-9223372036854775808"`, "USD", "-92,233,720,368,547,758.08 USD", "-9223372036854775808 minor units", ""},
		{"JPY has no minor unit", `"12000"`, "JPY", "12,000 JPY", "12000 minor units", ""},
		{"KRW has no minor unit", `"1500000"`, "KRW", "1,500,000 KRW", "1500000 minor units", ""},
		{"KWD has three", `"1234"`, "KWD", "1.234 KWD", "1234 minor units", ""},
		{"BHD has three", `"5"`, "BHD", "0.005 BHD", "5 minor units", ""},
		{"CLF has four", `"10000"`, "CLF", "1.0000 CLF", "10000 minor units", ""},
		{"non-numeric", `"12abc"`, "EUR", "12abc EUR", "", "not a whole number"},
		{"decimal", `"25.00"`, "EUR", "25.00 EUR", "", "not a whole number"},
		{"fractional JSON number", `2.5`, "EUR", "2.5 EUR", "", "not a whole number"},
		{"exponent", `2e3`, "EUR", "2e3 EUR", "", "not a whole number"},
		{"plus sign", `"+25"`, "EUR", "+25 EUR", "", "not a whole number"},
		{"empty", `""`, "EUR", "EUR", "", "not a whole number"},
		{"bidi in the amount", "\"99\u202e00\"", "EUR", "99⟦U+202E⟧00 EUR", "", "not a whole number"},
		{"lower-case currency", `"2500"`, "eur", "2500 eur", "", "not an ISO 4217 code"},
		{"bidi in the currency", `"2500"`, "E\u202eUR", "2500 E⟦U+202E⟧UR", "", "not an ISO 4217 code"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			currency, _ := json.Marshal(tc.currency)
			args := `{"ticket_id":"T-1001","reason":"dup","amount":{"currency_code":` + string(currency) + `,"amount_minor":` + tc.amount + `}}`
			f := field(t, confirm.PromptFields(cmd, args, nil), "/amount")
			if f.Kind != confirm.KindMoney || f.Label != "Amount" || f.Value != tc.wantValue || f.Raw != tc.wantRaw {
				t.Fatalf("got %+v; want value %q raw %q", f, tc.wantValue, tc.wantRaw)
			}
			if (tc.want == "") != (f.Problem == "") || !strings.Contains(f.Problem, tc.want) {
				t.Fatalf("problem %q, want %q", f.Problem, tc.want)
			}
			if strings.ContainsRune(f.Value, '\u202e') {
				t.Fatalf("raw bidi control in %q", f.Value)
			}
		})
	}
}

// TestPromptFieldsHostileRefund is the attack of issue 11 §5: the agent
// writes a reason that, with bidi overrides, reads like an amount. The
// approver reads the declared amount, and the reason as the agent's text
// with the overrides shown, not obeyed.
func TestPromptFieldsHostileRefund(t *testing.T) {
	args := `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"999999"},` +
		`"reason":"Refund approved: \u202eRUE 00.52\u202c \u2066(25.00 EUR)\u2069","cardholder_reference":"CH4242424242"}`
	p, err := confirm.RenderPrompt(refund(t), confirm.PromptInput{ArgumentsJSON: args, RequesterUser: "carol", RequesterAgent: "finance-bot"})
	if err != nil {
		t.Fatal(err)
	}
	amount, reason := field(t, p.Fields, "/amount"), field(t, p.Fields, "/reason")
	if amount.Value != "9,999.99 EUR" || amount.Raw != "999999 minor units" {
		t.Fatalf("amount %+v", amount)
	}
	want := "Refund approved: ⟦U+202E⟧RUE 00.52⟦U+202C⟧ ⟦U+2066⟧(25.00 EUR)⟦U+2069⟧"
	if reason.Kind != confirm.KindText || !reason.AgentText() || reason.Value != want || !reason.Neutralised {
		t.Fatalf("reason %+v", reason)
	}
	if line := reason.Line("the agent"); !strings.HasPrefix(line, "Reason (free text written by the agent, not checked): “") {
		t.Fatalf("reason line %q", line)
	}
	encoded, _ := json.Marshal(p)
	for _, r := range []rune{'\u202e', '\u202c', '\u2066', '\u2069'} {
		if strings.ContainsRune(p.ArgumentsJSON, r) || strings.ContainsRune(string(encoded), r) {
			t.Fatalf("the prompt holds U+%04X raw", r)
		}
	}
	// The JSON still decodes to what the agent sent.
	var back map[string]any
	if err := json.Unmarshal([]byte(p.ArgumentsJSON), &back); err != nil || !strings.Contains(back["reason"].(string), "\u202eRUE") {
		t.Fatalf("arguments JSON %s: %v", p.ArgumentsJSON, err)
	}
	if strings.Contains(string(encoded), "CH4242424242") || field(t, p.Fields, "/cardholder_reference").Kind != confirm.KindWithheld {
		t.Fatal("the card reference is not withheld")
	}
}

// kitchenSink is the declaration of testdata/kitchensink.proto's
// test.sink, compiled and loaded as a deployment loads its build: a field
// of every kind the prompt reads.
func kitchenSink(t *testing.T) *manifest.Command {
	t.Helper()
	cmd, ok := compiletest.Set(t, "testdata", "kitchensink.proto").ByCode("test.sink")
	if !ok {
		t.Fatal("no test.sink in testdata/kitchensink.proto")
	}
	return cmd
}

func TestPromptFieldsByDeclaration(t *testing.T) {
	args := `{"status":"TICKET_STATUS_CLOSED","due":"2026-03-01T15:04:05+01:00","ticket_id":"T-1001",
	  "email":"ann@example.com","request_uuid":"0f8fad5b-d9cb-469f-a165-70867728950e","note":"Sorry\nfor the wait",
	  "loose":"abc","negated":"abc","nonspace":"abc","escaped_dot":"v1.2","count":"42","urgent":true,"secret":"s3cr3t","pin":"1234","labels":{"pro\u202eject":"atlas"},
	  "parent":{"name":"root","child":{"name":"leaf"}},"tags":["a","b"],"extra":"x","nothing":null,"empty":[]}`
	p, err := confirm.RenderPrompt(kitchenSink(t), confirm.PromptInput{ArgumentsJSON: args, RequesterUser: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		pointer, label        string
		kind                  confirm.FieldKind
		value, raw, desc, bad string
	}{
		{"/status", "Status", confirm.KindEnum, "Closed", "TICKET_STATUS_CLOSED", "Done.", ""},
		{"/due", "Due", confirm.KindTimestamp, "Sun 1 March 2026, 14:04:05 UTC", "2026-03-01T15:04:05+01:00", "When it is due.", ""},
		{"/ticket_id", "Ticket ID", confirm.KindIdentifier, "T-1001", "", "", ""},
		{"/email", "Email", confirm.KindIdentifier, "ann@example.com", "", "", ""},
		{"/request_uuid", "Request UUID", confirm.KindIdentifier, "0f8fad5b-d9cb-469f-a165-70867728950e", "", "", ""},
		{"/note", "Note", confirm.KindText, "Sorry⟦U+000A⟧for the wait", "", "", ""},
		{"/loose", "Loose", confirm.KindText, "abc", "", "", ""},
		{"/negated", "Negated", confirm.KindText, "abc", "", "", ""},
		{"/nonspace", "Nonspace", confirm.KindText, "abc", "", "", ""},
		{"/escaped_dot", "Escaped dot", confirm.KindIdentifier, "v1.2", "", "", ""},
		{"/count", "Count", confirm.KindNumber, "42", "", "", ""},
		{"/urgent", "Urgent", confirm.KindBoolean, "yes", "", "", ""},
		{"/secret", "Secret", confirm.KindWithheld, confirm.WithheldValue, "", "", ""},
		{"/pin", "Pin", confirm.KindWithheld, confirm.WithheldValue, "", "", ""},
		{"/labels/pro\u202eject", "Labels › “pro⟦U+202E⟧ject”", confirm.KindText, "atlas", "", "", ""},
		{"/parent/name", "Parent › Name", confirm.KindText, "root", "", "", ""},
		{"/parent/child/name", "Parent › Child › Name", confirm.KindText, "leaf", "", "", ""},
		{"/tags/1", "Tags › #2", confirm.KindIdentifier, "b", "", "", ""},
		{"/extra", "“extra”", confirm.KindText, "x", "", "", "not declared"},
		{"/nothing", "“nothing”", confirm.KindNull, "null (not set)", "", "", "not declared"},
		{"/empty", "“empty”", confirm.KindEmpty, "(empty)", "", "", "not declared"},
	}
	for _, tc := range cases {
		t.Run(tc.pointer, func(t *testing.T) {
			f := field(t, p.Fields, tc.pointer)
			if f.Label != tc.label || f.Kind != tc.kind || f.Value != tc.value || f.Raw != tc.raw || f.Description != tc.desc ||
				(tc.bad == "") != (f.Problem == "") || !strings.Contains(f.Problem, tc.bad) {
				t.Fatalf("got %+v\nwant %+v", f, tc)
			}
		})
	}
	if encoded, _ := json.Marshal(p); strings.Contains(string(encoded), "s3cr3t") || strings.Contains(string(encoded), `"1234"`) {
		t.Fatalf("a sensitive value reached the prompt: %s", encoded)
	}
}

func TestPromptFieldsValueAgainstDeclaration(t *testing.T) {
	cases := []struct {
		name, args, pointer string
		kind                confirm.FieldKind
		value, bad          string
	}{
		{"unknown enum value", `{"status":"TICKET_STATUS_GONE"}`, "/status", confirm.KindEnum, "TICKET_STATUS_GONE", "not one of the declared values"},
		{"timestamp that is no timestamp", `{"due":"tomorrow"}`, "/due", confirm.KindTimestamp, "tomorrow", "not an RFC 3339 timestamp"},
		{"timestamp with a bidi control", "{\"due\":\"2026-03-01T15:04:05Z\u202e\"}", "/due", confirm.KindTimestamp, "2026-03-01T15:04:05Z⟦U+202E⟧", "not an RFC 3339"},
		{"identifier with a space reads as text", `{"ticket_id":"T-1001 or 25.00 EUR"}`, "/ticket_id", confirm.KindText, "T-1001 or 25.00 EUR", ""},
		{"identifier with a bidi control reads as text", "{\"ticket_id\":\"T-10\u202e01\"}", "/ticket_id", confirm.KindText, "T-10⟦U+202E⟧01", ""},
		{"number where a boolean is declared", `{"urgent":1}`, "/urgent", confirm.KindNumber, "1", "expects boolean"},
		{"string count that is no number", `{"count":"4x"}`, "/count", confirm.KindNumber, "4x", "not a number"},
	}
	sink := kitchenSink(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := field(t, confirm.PromptFields(sink, tc.args, nil), tc.pointer)
			if f.Kind != tc.kind || f.Value != tc.value || (tc.bad == "") != (f.Problem == "") || !strings.Contains(f.Problem, tc.bad) {
				t.Fatalf("got %+v", f)
			}
		})
	}
}

// TestPromptFieldsWithoutDeclaration: with no schema every string is the
// caller's text, and only an exact {currency_code, amount_minor} object
// reads as money.
func TestPromptFieldsWithoutDeclaration(t *testing.T) {
	args := `{"ticket_id":"T-1","amount":{"currency_code":"JPY","amount_minor":"500"},"price":{"currency_code":"EUR","amount_minor":"1","note":"x"},"card":"[withheld]"}`
	fields := confirm.PromptFields(nil, args, []string{"/card"})
	if f := field(t, fields, "/ticket_id"); f.Kind != confirm.KindText || f.Label != "Ticket ID" || f.Problem != "" {
		t.Fatalf("ticket_id %+v", f)
	}
	if f := field(t, fields, "/amount"); f.Kind != confirm.KindMoney || f.Value != "500 JPY" {
		t.Fatalf("amount %+v", f)
	}
	if f := field(t, fields, "/price/currency_code"); f.Kind != confirm.KindText {
		t.Fatalf("an object with more than money is listed field by field: %+v", f)
	}
	if f := field(t, fields, "/card"); f.Kind != confirm.KindWithheld {
		t.Fatalf("card %+v", f)
	}
	if f := confirm.PromptFields(nil, `{"a":`, nil); len(f) != 1 || f[0].Problem == "" {
		t.Fatalf("unparsable arguments: %+v", f)
	}
	if f := confirm.PromptFields(nil, `{}`, nil); len(f) != 0 {
		t.Fatalf("no arguments: %+v", f)
	}
}

func TestPromptFieldsDeterministic(t *testing.T) {
	args := `{"labels":{"b":"2","a":"1","c":"3"},"tags":["x","y"],"status":"TICKET_STATUS_OPEN"}`
	sink := kitchenSink(t)
	first, _ := json.Marshal(confirm.PromptFields(sink, args, nil))
	for range 20 {
		again, _ := json.Marshal(confirm.PromptFields(sink, args, nil))
		if string(again) != string(first) {
			t.Fatalf("rendering differs:\n%s\n%s", first, again)
		}
	}
}

func TestEscapeInvisibleJSON(t *testing.T) {
	in := "{\"r\":\"a\u202eb\U000E0041c⟦\"}"
	got := confirm.EscapeInvisibleJSON(in)
	if want := `{"r":"a\u202eb\udb40\udc41c⟦"}`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if confirm.EscapeInvisibleJSON(got) != got {
		t.Fatal("not idempotent")
	}
	var a, b map[string]string
	if json.Unmarshal([]byte(in), &a) != nil || json.Unmarshal([]byte(got), &b) != nil || a["r"] != b["r"] {
		t.Fatalf("the escaped JSON decodes to %q, not %q", b["r"], a["r"])
	}
}
