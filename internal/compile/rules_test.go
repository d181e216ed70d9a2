package compile_test

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/compile"
	"github.com/mandate-dev/mandate/internal/manifest"
)

const fixtureHeader = `syntax = "proto3";
package fixture.v1;
import "buf/validate/validate.proto";
import "mandate/v1/options.proto";
message Req { string id = 1 [(buf.validate.field).string.min_len = 1]; string note = 2; string secret = 3 [(mandate.v1.field).sensitive = true]; }
message Resp { string id = 1; }
service S {
`

// ok is a complete, valid declaration body to build fixtures from.
const ok = `agent_hint: "Do it." risk: RISK_L1`

func rpc(name, decl string) string {
	return "  rpc " + name + "(Req) returns (Resp) { option (mandate.v1.command) = {" + decl + "}; }\n"
}

// ruleCases fire every rule of compile.Rules (TestEveryRuleIsInTheTable
// checks that none is left out), each on a fixture that breaks only it.
var ruleCases = []struct {
	name      string
	rpcs      string
	wantRule  string
	wantCodes []string
}{
	{"NEVER on L3", rpc("A", `code: "x.refund" agent_hint: "h" risk: RISK_L3 confirmation: CONFIRMATION_NEVER`),
		"MANDATE1001", []string{"x.refund"}},
	{"NEVER with side effects", rpc("A", `code: "x.mail" agent_hint: "h" risk: RISK_L1 side_effects: "email" permissions: "x.mail" confirmation: CONFIRMATION_NEVER`),
		"MANDATE1001", []string{"x.mail"}},
	{"reversible without recall", rpc("A", `code: "x.submit" reversible: true `+ok),
		"MANDATE1002", []string{"x.submit"}},
	{"recall names no command", rpc("A", `code: "x.submit" reversible: true recall: "x.nowhere" `+ok),
		"MANDATE1002", []string{"x.submit"}},
	{"recall without reversible", rpc("A", `code: "x.submit" recall: "x.undo" `+ok) + rpc("B", `code: "x.undo" `+ok),
		"MANDATE1002", []string{"x.submit"}},
	{"missing code", rpc("A", ok), "MANDATE1003", []string{""}},
	{"missing risk", rpc("A", `code: "x.a" agent_hint: "h"`), "MANDATE1003", []string{"x.a"}},
	{"missing agent hint", rpc("A", `code: "x.a" risk: RISK_L0`), "MANDATE1003", []string{"x.a"}},
	{"malformed code: upper case", rpc("A", `code: "Ticket.Refund" `+ok), "MANDATE1004", []string{"Ticket.Refund"}},
	{"malformed code: one segment", rpc("A", `code: "refund" `+ok), "MANDATE1004", []string{"refund"}},
	{"malformed code: too long", rpc("A", `code: "x.`+strings.Repeat("a", 130)+`" `+ok), "MANDATE1004", []string{"x." + strings.Repeat("a", 130)}},
	{"duplicate code", rpc("A", `code: "x.a" `+ok) + rpc("B", `code: "x.a" `+ok), "MANDATE1005", []string{"x.a"}},
	{"malformed side effect", rpc("A", `code: "x.a" side_effects: "Payment_Gateway" permissions: "x.a" `+ok), "MANDATE1006", []string{"x.a"}},
	{"malformed permission", rpc("A", `code: "x.a" permissions: "Pay Refund" `+ok), "MANDATE1006", []string{"x.a"}},
	{"L4 without approver", rpc("A", `code: "x.close" agent_hint: "h" risk: RISK_L4 permissions: "x.close"`), "MANDATE1007", []string{"x.close"}},
	{"side effects without permission", rpc("A", `code: "x.mail" side_effects: "email" `+ok), "MANDATE1008", []string{"x.mail"}},
	{"subject_field missing", rpc("A", `code: "x.a" subject_field: "ticket_id" `+ok), "MANDATE1009", []string{"x.a"}},
	{"sod field missing here", rpc("A", `code: "x.a" separation_of_duties: {conflicts_with: "x.b" field: "report_id"} `+ok) + rpc("B", `code: "x.b" `+ok),
		"MANDATE1009", []string{"x.a"}},
	{"sod names no command", rpc("A", `code: "x.a" separation_of_duties: {conflicts_with: "x.nowhere" field: "id"} `+ok), "MANDATE1010", []string{"x.a"}},
	{"sod without field", rpc("A", `code: "x.a" separation_of_duties: {conflicts_with: "x.b"} `+ok) + rpc("B", `code: "x.b" `+ok), "MANDATE1010", []string{"x.a"}},
	{"streaming", "  rpc A(Req) returns (stream Resp) { option (mandate.v1.command) = {code: \"x.a\" " + ok + "}; }\n", "MANDATE1011", []string{"x.a"}},
	{"permission holder without permission", rpc("A", `code: "x.a" approver: {kind: APPROVER_KIND_PERMISSION_HOLDER} `+ok), "MANDATE1012", []string{"x.a"}},
	{"example breaks a rule", rpc("A", `code: "x.a" examples: {description: "empty id" input: "{\"id\": \"\"}"} `+ok), "MANDATE1013", []string{"x.a"}},
	{"example has an unknown field", rpc("A", `code: "x.a" examples: {input: "{\"idd\": \"1\"}"} `+ok), "MANDATE1013", []string{"x.a"}},
	{"example is not JSON", rpc("A", `code: "x.a" examples: {input: "id=1"} `+ok), "MANDATE1013", []string{"x.a"}},
	{"deadline too long", rpc("A", `code: "x.a" deadline: {seconds: 7200} `+ok), "MANDATE1014", []string{"x.a"}},
	{"L0 with side effects", rpc("A", `code: "x.a" agent_hint: "h" risk: RISK_L0 side_effects: "email" permissions: "x.a"`), "MANDATE1015", []string{"x.a"}},
	{"subject_field is sensitive", rpc("A", `code: "x.a" subject_field: "secret" `+ok), "MANDATE1016", []string{"x.a"}},
	{"recall is L3", rpc("A", `code: "x.submit" reversible: true recall: "x.undo" `+ok) + rpc("B", `code: "x.undo" agent_hint: "h" risk: RISK_L3`),
		"MANDATE1017", []string{"x.submit"}},
	{"recall is L4", rpc("A", `code: "x.submit" reversible: true recall: "x.undo" `+ok) +
		rpc("B", `code: "x.undo" agent_hint: "h" risk: RISK_L4 approver: {kind: APPROVER_KIND_PERMISSION_HOLDER permission: "x.approve"}`),
		"MANDATE1017", []string{"x.submit"}},
	{"recall with side effects is not idempotent", rpc("A", `code: "x.submit" reversible: true recall: "x.undo" permissions: "x.write" `+ok) +
		rpc("B", `code: "x.undo" side_effects: "email" permissions: "x.write" `+ok),
		"MANDATE1017", []string{"x.submit"}},
	{"recall needs a permission the original does not", rpc("A", `code: "x.submit" reversible: true recall: "x.undo" permissions: "x.submit" `+ok) +
		rpc("B", `code: "x.undo" permissions: "x.submit" permissions: "x.admin" `+ok),
		"MANDATE1018", []string{"x.submit"}},
	{"condition reads no such field", rpc("A", `code: "x.a" conditions: {id: "big" expression: "request.amount > 10" effect: CONDITION_EFFECT_DENY description: "d"} `+ok),
		"MANDATE1019", []string{"x.a"}},
	{"condition is not a boolean", rpc("A", `code: "x.a" conditions: {id: "big" expression: "request.note.size()" effect: CONDITION_EFFECT_DENY description: "d"} `+ok),
		"MANDATE1019", []string{"x.a"}},
	{"condition does not parse", rpc("A", `code: "x.a" conditions: {id: "big" expression: "request.note ==" effect: CONDITION_EFFECT_DENY description: "d"} `+ok),
		"MANDATE1019", []string{"x.a"}},
	{"condition is empty", rpc("A", `code: "x.a" conditions: {id: "big" effect: CONDITION_EFFECT_DENY description: "d"} `+ok),
		"MANDATE1019", []string{"x.a"}},
	{"condition principal field unknown", rpc("A", `code: "x.a" conditions: {id: "bot" expression: "principal.robot" effect: CONDITION_EFFECT_DENY description: "d"} `+ok),
		"MANDATE1019", []string{"x.a"}},
	{"duplicate condition id", rpc("A", `code: "x.a" conditions: {id: "c" expression: "true" effect: CONDITION_EFFECT_DENY description: "d"} conditions: {id: "c" expression: "false" effect: CONDITION_EFFECT_DENY description: "d"} `+ok),
		"MANDATE1020", []string{"x.a"}},
	{"condition without id", rpc("A", `code: "x.a" conditions: {expression: "true" effect: CONDITION_EFFECT_DENY description: "d"} `+ok),
		"MANDATE1020", []string{"x.a"}},
	{"condition id malformed", rpc("A", `code: "x.a" conditions: {id: "Big Refund" expression: "true" effect: CONDITION_EFFECT_DENY description: "d"} `+ok),
		"MANDATE1020", []string{"x.a"}},
	{"condition without effect", rpc("A", `code: "x.a" conditions: {id: "c" expression: "true" description: "d"} `+ok),
		"MANDATE1020", []string{"x.a"}},
	{"condition without description", rpc("A", `code: "x.a" conditions: {id: "c" expression: "true" effect: CONDITION_EFFECT_DENY} `+ok),
		"MANDATE1020", []string{"x.a"}},
	{"CONDITIONAL without a confirmation condition", rpc("A", `code: "x.a" confirmation: CONFIRMATION_CONDITIONAL conditions: {id: "c" expression: "true" effect: CONDITION_EFFECT_DENY description: "d"} `+ok),
		"MANDATE1021", []string{"x.a"}},
	{"CONDITIONAL on L4", rpc("A", `code: "x.a" agent_hint: "h" risk: RISK_L4 approver: {kind: APPROVER_KIND_REQUESTING_USER} confirmation: CONFIRMATION_CONDITIONAL conditions: {id: "c" expression: "true" effect: CONDITION_EFFECT_REQUIRE_CONFIRMATION description: "d"}`),
		"MANDATE1021", []string{"x.a"}},
	{"approver hint with backticks", rpc("A", `code: "x.a" approver_hint: "Runs `+"`x.a`"+` now" `+ok),
		"MANDATE1022", []string{"x.a"}},
	{"approver hint with a tag", rpc("A", `code: "x.a" approver_hint: "Runs <b>now</b>" `+ok),
		"MANDATE1022", []string{"x.a"}},
	{"approver hint on two lines", rpc("A", `code: "x.a" approver_hint: "Runs.\nNow." `+ok),
		"MANDATE1022", []string{"x.a"}},
	{"limit without id", rpc("A", `code: "x.a" limits: {per: LIMIT_SCOPE_AGENT window: {seconds: 60} max: 5 when_exhausted: LIMIT_EXHAUSTED_REFUSE description: "d"} `+ok),
		"MANDATE1023", []string{"x.a"}},
	{"limit id shared with a condition", rpc("A", `code: "x.a" conditions: {id: "l" expression: "true" effect: CONDITION_EFFECT_DENY description: "d"} limits: {id: "l" per: LIMIT_SCOPE_AGENT window: {seconds: 60} max: 5 when_exhausted: LIMIT_EXHAUSTED_REFUSE description: "d"} `+ok),
		"MANDATE1023", []string{"x.a"}},
	{"limit without scope", rpc("A", `code: "x.a" limits: {id: "l" window: {seconds: 60} max: 5 when_exhausted: LIMIT_EXHAUSTED_REFUSE description: "d"} `+ok),
		"MANDATE1023", []string{"x.a"}},
	{"limit window too long", rpc("A", `code: "x.a" limits: {id: "l" per: LIMIT_SCOPE_USER window: {seconds: 2764800} max: 5 when_exhausted: LIMIT_EXHAUSTED_REFUSE description: "d"} `+ok),
		"MANDATE1023", []string{"x.a"}},
	{"limit without window", rpc("A", `code: "x.a" limits: {id: "l" per: LIMIT_SCOPE_USER max: 5 when_exhausted: LIMIT_EXHAUSTED_REFUSE description: "d"} `+ok),
		"MANDATE1023", []string{"x.a"}},
	{"limit max zero", rpc("A", `code: "x.a" limits: {id: "l" per: LIMIT_SCOPE_TENANT window: {seconds: 60} when_exhausted: LIMIT_EXHAUSTED_REFUSE description: "d"} `+ok),
		"MANDATE1023", []string{"x.a"}},
	{"limit sums a string", rpc("A", `code: "x.a" limits: {id: "l" per: LIMIT_SCOPE_AGENT window: {seconds: 60} max: 5 when_exhausted: LIMIT_EXHAUSTED_REFUSE description: "d" sum_field: "note"} `+ok),
		"MANDATE1023", []string{"x.a"}},
	{"limit sums no such field", rpc("A", `code: "x.a" limits: {id: "l" per: LIMIT_SCOPE_AGENT window: {seconds: 60} max: 5 when_exhausted: LIMIT_EXHAUSTED_REFUSE description: "d" sum_field: "amount.amount_minor"} `+ok),
		"MANDATE1023", []string{"x.a"}},
	{"limit groups by no such field", rpc("A", `code: "x.a" limits: {id: "l" per: LIMIT_SCOPE_AGENT window: {seconds: 60} max: 5 when_exhausted: LIMIT_EXHAUSTED_REFUSE description: "d" group_field: "currency"} `+ok),
		"MANDATE1023", []string{"x.a"}},
	{"limit without when_exhausted", rpc("A", `code: "x.a" limits: {id: "l" per: LIMIT_SCOPE_AGENT window: {seconds: 60} max: 5 description: "d"} `+ok),
		"MANDATE1023", []string{"x.a"}},
	{"limit without description", rpc("A", `code: "x.a" limits: {id: "l" per: LIMIT_SCOPE_AGENT window: {seconds: 60} max: 5 when_exhausted: LIMIT_EXHAUSTED_REFUSE} `+ok),
		"MANDATE1023", []string{"x.a"}},
}

// TestConditionsLandInTheManifest: declared conditions that type-check
// are recorded in the manifest as declared (id, expression, effect,
// description), in declaration order, and CONFIRMATION_CONDITIONAL on an
// L3 command with side effects is accepted where a condition asks a human.
// A command without conditions records an empty list.
func TestConditionsLandInTheManifest(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "fixture.proto"), fixtureHeader+
		rpc("A", `code: "x.pay" agent_hint: "h" risk: RISK_L3 side_effects: "ledger" permissions: "x.pay" confirmation: CONFIRMATION_CONDITIONAL `+
			`conditions: {id: "long-note" expression: "request.note.size() > 20" effect: CONDITION_EFFECT_REQUIRE_CONFIRMATION description: "a human is asked for a long note"} `+
			`conditions: {id: "agents.no-secret" expression: "principal.agent != '' && request.secret != ''" effect: CONDITION_EFFECT_DENY description: "agents may not send a secret"}`)+
		rpc("B", `code: "x.b" `+ok)+"}\n")
	out, err := compile.Compile(compileProtos(t, dir, "fixture.proto"), []string{"fixture.proto"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := manifest.Load(out.Manifest, out.DescriptorSet)
	if err != nil {
		t.Fatal(err)
	}
	pay, _ := s.ByCode("x.pay")
	want := []manifest.Condition{
		{ID: "long-note", Expression: "request.note.size() > 20", Effect: "REQUIRE_CONFIRMATION", Description: "a human is asked for a long note"},
		{ID: "agents.no-secret", Expression: "principal.agent != '' && request.secret != ''", Effect: "DENY", Description: "agents may not send a secret"},
	}
	if len(pay.Conditions) != len(want) || pay.Conditions[0] != want[0] || pay.Conditions[1] != want[1] {
		t.Fatalf("conditions = %+v, want %+v", pay.Conditions, want)
	}
	if pay.Confirmation != "CONDITIONAL" || pay.ConfirmationRequired {
		t.Errorf("confirmation = %q required=%v, want CONDITIONAL, not required by the declaration alone", pay.Confirmation, pay.ConfirmationRequired)
	}
	if !strings.Contains(string(out.Manifest), `"conditions": [`) {
		t.Error("the manifest JSON has no conditions key")
	}
	if b, _ := s.ByCode("x.b"); b.Conditions == nil || len(b.Conditions) != 0 {
		t.Errorf("a command without conditions: %#v, want an empty list", b.Conditions)
	}
}

func TestRulesFire(t *testing.T) {
	for _, tc := range ruleCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "fixture.proto"), fixtureHeader+tc.rpcs+"}\n")
			set := compileProtos(t, dir, "fixture.proto")
			out, err := compile.Compile(set, []string{"fixture.proto"})
			// An error rule refuses the build; a warning rule lets it
			// through and reports its findings with the output.
			var findings []compile.Finding
			var cerr *compile.Error
			switch severity := ruleSeverity(t, tc.wantRule); {
			case severity == compile.SeverityError && errors.As(err, &cerr):
				findings = cerr.Findings
			case severity == compile.SeverityWarning && err == nil:
				findings = out.Warnings
			default:
				t.Fatalf("Compile() = %v, %v; want %s (%s)", out != nil, err, tc.wantRule, severity)
			}
			var got []string
			for _, f := range findings {
				if f.Rule != tc.wantRule {
					t.Errorf("unexpected finding %s", f)
					continue
				}
				got = append(got, f.Code)
				if !strings.Contains(f.String(), tc.wantRule) || f.Message == "" {
					t.Errorf("finding %q does not name its rule and fix", f)
				}
				if f.Severity != ruleSeverity(t, tc.wantRule) {
					t.Errorf("finding %q has severity %s, the table says %s", f, f.Severity, ruleSeverity(t, tc.wantRule))
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.wantCodes, ",") {
				t.Errorf("%s fired for %q, want %q\n%v", tc.wantRule, got, tc.wantCodes, cerr)
			}
		})
	}
}

func TestCleanFixtureHasNoFindings(t *testing.T) {
	set := compileProtos(t, filepath.Join(repoRoot(t), "internal", "compile", "testdata"), "clean.proto")
	out, err := compile.Compile(set, []string{"clean.proto"})
	if err != nil {
		t.Fatalf("clean fixture refused: %v", err)
	}
	s, err := manifest.Load(out.Manifest, out.DescriptorSet)
	if err != nil {
		t.Fatalf("Load(compiled clean fixture): %v", err)
	}
	var codes []string
	for _, c := range s.Commands() {
		codes = append(codes, c.Code)
	}
	want := "ledger.books.close,ledger.draft,ledger.entry.get,ledger.entry.post,ledger.entry.reverse"
	if strings.Join(codes, ",") != want {
		t.Fatalf("commands = %v, want %s (the undeclared RPC must not be a command)", codes, want)
	}
	checks := []struct {
		code                 string
		confirmationRequired bool
		published            bool
		sensitive            string
	}{
		{"ledger.entry.get", false, true, ""},
		{"ledger.entry.post", false, true, "/card,/parties/*/tax_id"}, // reversible: no confirmation by default
		{"ledger.entry.reverse", true, true, ""},                      // declared REQUIRED
		{"ledger.books.close", true, true, ""},                        // L4
		{"ledger.draft", false, false, ""},
	}
	for _, c := range checks {
		cmd, _ := s.ByCode(c.code)
		if cmd.ConfirmationRequired != c.confirmationRequired || cmd.Published() != c.published || strings.Join(cmd.SensitiveFields, ",") != c.sensitive {
			t.Errorf("%s: confirmation=%v published=%v sensitive=%v; want %v %v %q", c.code, cmd.ConfirmationRequired, cmd.Published(), cmd.SensitiveFields, c.confirmationRequired, c.published, c.sensitive)
		}
	}
	post, _ := s.ByCode("ledger.entry.post")
	if post.Deadline != "5s" || post.RPC.FullMethod != "/fixture.v1.LedgerService/PostEntry" || post.Description != "Posts an entry; undone by ledger.entry.reverse." {
		t.Errorf("post: deadline %q, method %q, description %q", post.Deadline, post.RPC.FullMethod, post.Description)
	}
	var in map[string]any
	if err := json.Unmarshal(post.InputSchema, &in); err != nil {
		t.Fatal(err)
	}
	if _, ok := in["$defs"].(map[string]any)["fixture.v1.Party"]; !ok {
		t.Errorf("recursive Party is not under $defs: %s", post.InputSchema)
	}
}

func TestDeterministic(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "internal", "compile", "testdata")
	a, err := compile.Compile(compileProtos(t, dir, "clean.proto"), []string{"clean.proto"})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		b, err := compile.Compile(compileProtos(t, dir, "clean.proto"), []string{"clean.proto"})
		if err != nil {
			t.Fatal(err)
		}
		if string(a.Manifest) != string(b.Manifest) || string(a.DescriptorSet) != string(b.DescriptorSet) {
			t.Fatal("two compilations of the same protos differ")
		}
	}
}
