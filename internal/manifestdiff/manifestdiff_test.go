package manifestdiff_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	genmanifest "github.com/mandate-dev/mandate/gen/manifest"
	"github.com/mandate-dev/mandate/internal/manifestdiff"
)

// doc is a manifest as JSON values, for crafting before and after.
type doc map[string]any

func sample(t *testing.T) doc {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(genmanifest.Manifest))
	dec.UseNumber()
	var d doc
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	// The crafted cases start from a refund that always asks a human and
	// declares no conditions and no limits (the sample's refund now asks
	// only when its conditions say so): each case adds what it tests.
	r := d.cmd(refund)
	r["confirmation"], r["confirmation_required"], r["conditions"] = "DEFAULT", true, []any{}
	delete(r, "limits")
	return d
}

// cmd returns the command's object (to change in place).
func (d doc) cmd(code string) map[string]any {
	for _, c := range d["commands"].([]any) {
		if m := c.(map[string]any); m["code"] == code {
			return m
		}
	}
	panic("no command " + code)
}

func (d doc) remove(code string) {
	list := d["commands"].([]any)
	d["commands"] = slices.DeleteFunc(list, func(c any) bool { return c.(map[string]any)["code"] == code })
}

func (d doc) addCopy(of, code string) {
	var c map[string]any
	b, _ := json.Marshal(d.cmd(of))
	_ = json.Unmarshal(b, &c)
	c["code"] = code
	d["commands"] = append(d["commands"].([]any), c)
}

// at walks nested objects: at(c, "input_schema", "properties", "reason").
func at(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		m = m[k].(map[string]any)
	}
	return m
}

func num(n int) json.Number { return json.Number(fmt.Sprint(n)) }

func (d doc) parse(t *testing.T, name string) *manifestdiff.Manifest {
	t.Helper()
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifestdiff.Parse(name, b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type want struct {
	rule, command, path string
	severity            manifestdiff.Severity
}

const (
	refund  = "ticket.refund"
	search  = "ticket.search"
	erase   = "customer.erase"
	approve = "expense.report.approve"
	submit  = "expense.report.submit"
	high    = manifestdiff.High
	warn    = manifestdiff.Warn
	info    = manifestdiff.Info
)

func largeRefund() map[string]any {
	return map[string]any{"id": "large-refund", "expression": "request.amount.amount_minor > 2000", "effect": "REQUIRE_CONFIRMATION", "description": "a human is asked above 20.00"}
}

// dailyRefunds is a budget: what an agent refunds a day, per currency;
// past it a human is asked.
func dailyRefunds() map[string]any {
	return map[string]any{
		"id": "agent-daily-refunds", "per": "AGENT", "window": "86400s", "max": num(50000),
		"sum_field": "amount.amount_minor", "group_field": "amount.currency_code", "when_exhausted": "ESCALATE",
		"description": "an agent refunds at most 500.00 a day per currency",
	}
}

// hourlyRefunds is a rate: refunds of the whole tenant an hour; past it
// the call is refused.
func hourlyRefunds() map[string]any {
	return map[string]any{
		"id": "tenant-hourly-refunds", "per": "TENANT", "window": "3600s", "max": num(100),
		"when_exhausted": "REFUSE", "description": "the tenant refunds at most 100 times an hour",
	}
}

// withLimits sets the refund's limits, each changed by change (nil: as is).
func withLimits(d doc, change func(l map[string]any), limits ...map[string]any) {
	list := make([]any, len(limits))
	for i, l := range limits {
		if change != nil {
			change(l)
		}
		list[i] = l
	}
	d.cmd(refund)["limits"] = list
}

// diffCases is the crafted set of before/after manifests: each changes the
// sample and names the findings it must give, with their severities.
var diffCases = []struct {
	name   string
	change func(old, new doc)
	want   []want
}{
	{"command added", func(_, n doc) { n.addCopy("ticket.get", "ticket.close") },
		[]want{{"command.added", "ticket.close", "", warn}}},
	{"command removed", func(_, n doc) { n.remove("ticket.get") },
		[]want{{"command.removed", "ticket.get", "", info}}},
	{"draft published", func(o, _ doc) { o.cmd(refund)["lifecycle"] = "DRAFT" },
		[]want{{"lifecycle.published", refund, "/lifecycle", warn}}},
	{"deprecated", func(_, n doc) { n.cmd(refund)["lifecycle"] = "DEPRECATED" },
		[]want{{"lifecycle.changed", refund, "/lifecycle", info}}},
	{"risk lowered", func(_, n doc) { n.cmd(refund)["risk"] = "L2" },
		[]want{{"risk.lowered", refund, "/risk", high}}},
	{"risk raised", func(_, n doc) { n.cmd(search)["risk"] = "L1" },
		[]want{{"risk.raised", search, "/risk", info}}},
	{"confirmation dropped", func(_, n doc) { n.cmd(refund)["confirmation_required"] = false },
		[]want{{"confirmation.dropped", refund, "/confirmation_required", high}}},
	{"conditional confirmation dropped", func(o, n doc) {
		o.cmd(refund)["confirmation"] = "CONDITIONAL"
		n.cmd(refund)["confirmation_required"] = false
	}, []want{{"confirmation.dropped", refund, "/confirmation", high}}},
	{"confirmation loosened to a condition", func(_, n doc) {
		n.cmd(refund)["confirmation"] = "CONDITIONAL"
		n.cmd(refund)["confirmation_required"] = false
		n.cmd(refund)["conditions"] = []any{largeRefund()}
	}, []want{{"confirmation.loosened", refund, "/confirmation", high}, {"condition.added", refund, "/conditions/large-refund", info}}},
	{"confirmation declared REQUIRED → DEFAULT", func(o, _ doc) { o.cmd(refund)["confirmation"] = "REQUIRED" },
		[]want{{"confirmation.changed", refund, "/confirmation", warn}}},
	{"confirmation tightened", func(_, n doc) {
		n.cmd(search)["confirmation"] = "REQUIRED"
		n.cmd(search)["confirmation_required"] = true
	}, []want{{"confirmation.tightened", search, "/confirmation", info}}},
	{"four eyes dropped", func(_, n doc) {
		n.cmd(erase)["approver"] = map[string]any{"kind": "REQUESTING_USER", "permission": "", "declared": false}
	}, []want{{"approver.weakened", erase, "/approver/kind", high}}},
	{"approver count reduced", func(o, n doc) {
		at(o.cmd(erase), "approver")["approvals"] = num(2)
		at(n.cmd(erase), "approver")["approvals"] = num(1)
	}, []want{{"approver.weakened", erase, "/approver/approvals", high}}},
	{"approver permission changed, client attestation allowed", func(_, n doc) {
		at(n.cmd(erase), "approver")["permission"] = "privacy.admin"
		at(n.cmd(erase), "approver")["allow_client_attested"] = true
	}, []want{{"approver.changed", erase, "/approver/permission", warn}, {"approver.changed", erase, "/approver/allow_client_attested", warn}}},
	{"four eyes added", func(_, n doc) {
		n.cmd(refund)["approver"] = map[string]any{"kind": "PERMISSION_HOLDER", "permission": "payment.approve", "declared": true}
	}, []want{{"approver.strengthened", refund, "/approver/kind", info}}},
	{"permission removed", func(_, n doc) { n.cmd(refund)["permissions"] = []any{} },
		[]want{{"permission.removed", refund, "/permissions/payment.refund", high}}},
	{"permission changed", func(_, n doc) { n.cmd(refund)["permissions"] = []any{"payment.refund.small"} },
		[]want{{"permission.removed", refund, "/permissions/payment.refund", high}, {"permission.added", refund, "/permissions/payment.refund.small", info}}},
	{"feature gate removed", func(_, n doc) { n.cmd(refund)["required_feature"] = "" },
		[]want{{"feature.removed", refund, "/required_feature", warn}}},
	{"feature gate added", func(_, n doc) { n.cmd(search)["required_feature"] = "search" },
		[]want{{"feature.added", search, "/required_feature", info}}},
	{"sensitive flag removed", func(_, n doc) {
		n.cmd(refund)["sensitive_fields"] = []any{}
		delete(at(n.cmd(refund), "input_schema", "properties", "cardholder_reference"), "x-mandate-sensitive")
	}, []want{{"sensitive.removed", refund, "/sensitive_fields/~1cardholder_reference", high}}},
	{"sensitive flag added", func(_, n doc) { n.cmd(refund)["sensitive_fields"] = []any{"/cardholder_reference", "/reason"} },
		[]want{{"sensitive.added", refund, "/sensitive_fields/~1reason", info}}},
	{"separation of duties removed", func(_, n doc) { n.cmd(approve)["separation_of_duties"] = nil },
		[]want{{"sod.removed", approve, "/separation_of_duties", high}}},
	{"separation of duties conflicts reduced", func(o, _ doc) {
		at(o.cmd(approve), "separation_of_duties")["conflicts_with"] = []any{"expense.report.submit", "expense.report.create"}
	}, []want{{"sod.removed", approve, "/separation_of_duties/conflicts_with/expense.report.create", high}}},
	{"separation of duties field changed", func(_, n doc) { at(n.cmd(approve), "separation_of_duties")["field"] = "owner" },
		[]want{{"sod.changed", approve, "/separation_of_duties/field", warn}}},
	{"separation of duties added", func(_, n doc) {
		n.cmd(refund)["separation_of_duties"] = map[string]any{"conflicts_with": []any{"ticket.get"}, "field": "ticket_id"}
	}, []want{{"sod.added", refund, "/separation_of_duties", info}}},
	{"reversible changed", func(_, n doc) { n.cmd(submit)["reversible"] = false },
		[]want{{"reversible.changed", submit, "/reversible", warn}}},
	{"recall changed", func(_, n doc) { n.cmd(submit)["recall"] = "" },
		[]want{{"recall.changed", submit, "/recall", warn}}},
	{"idempotent changed", func(_, n doc) { n.cmd(refund)["idempotent"] = true },
		[]want{{"idempotent.changed", refund, "/idempotent", warn}}},
	{"side effect removed", func(_, n doc) { n.cmd(refund)["side_effects"] = []any{"ledger"} },
		[]want{{"side_effects.changed", refund, "/side_effects", warn}}},
	{"side effect added", func(_, n doc) { n.cmd(search)["side_effects"] = []any{"email"} },
		[]want{{"side_effects.changed", search, "/side_effects", warn}}},
	{"subject field changed", func(_, n doc) { n.cmd(refund)["subject_field"] = "" },
		[]want{{"subject.changed", refund, "/subject_field", warn}}},
	{"condition removed", func(o, _ doc) { o.cmd(refund)["conditions"] = []any{largeRefund()} },
		[]want{{"condition.removed", refund, "/conditions/large-refund", high}}},
	{"condition changed", func(o, n doc) {
		o.cmd(refund)["conditions"] = []any{largeRefund()}
		c := largeRefund()
		c["expression"] = "request.amount.amount_minor > 200000"
		c["effect"] = "DENY"
		c["description"] = "refused above 2,000.00"
		n.cmd(refund)["conditions"] = []any{c}
	}, []want{
		{"condition.changed", refund, "/conditions/large-refund/expression", warn},
		{"condition.changed", refund, "/conditions/large-refund/effect", warn},
		{"text.changed", refund, "/conditions/large-refund/description", info},
	}},
	{"condition added", func(_, n doc) { n.cmd(refund)["conditions"] = []any{largeRefund()} },
		[]want{{"condition.added", refund, "/conditions/large-refund", info}}},
	{"limit removed", func(o, _ doc) { withLimits(o, nil, dailyRefunds()) },
		[]want{{"limit.removed", refund, "/limits/agent-daily-refunds", high}}},
	{"limit added", func(_, n doc) { withLimits(n, nil, dailyRefunds(), hourlyRefunds()) },
		[]want{{"limit.added", refund, "/limits/agent-daily-refunds", info}, {"limit.added", refund, "/limits/tenant-hourly-refunds", info}}},
	{"limit raised", func(o, n doc) {
		withLimits(o, nil, dailyRefunds())
		withLimits(n, func(l map[string]any) { l["max"] = num(500000) }, dailyRefunds())
	}, []want{{"limit.loosened", refund, "/limits/agent-daily-refunds/max", warn}}},
	{"limit window shortened", func(o, n doc) {
		withLimits(o, nil, hourlyRefunds())
		withLimits(n, func(l map[string]any) { l["window"] = "60s" }, hourlyRefunds())
	}, []want{{"limit.loosened", refund, "/limits/tenant-hourly-refunds/window", warn}}},
	{"limit counted per a narrower party", func(o, n doc) {
		withLimits(o, func(l map[string]any) {
			if l["id"] == "agent-daily-refunds" {
				l["per"] = "USER"
			}
		}, dailyRefunds(), hourlyRefunds())
		withLimits(n, func(l map[string]any) {
			if l["id"] == "tenant-hourly-refunds" {
				l["per"] = "USER"
			}
		}, dailyRefunds(), hourlyRefunds())
	}, []want{
		{"limit.loosened", refund, "/limits/agent-daily-refunds/per", warn},
		{"limit.loosened", refund, "/limits/tenant-hourly-refunds/per", warn},
	}},
	{"limit counted per group", func(o, n doc) {
		withLimits(o, nil, hourlyRefunds())
		withLimits(n, func(l map[string]any) { l["group_field"] = "amount.currency_code" }, hourlyRefunds())
	}, []want{{"limit.loosened", refund, "/limits/tenant-hourly-refunds/group_field", warn}}},
	{"limit escalates where it refused", func(o, n doc) {
		withLimits(o, nil, hourlyRefunds())
		withLimits(n, func(l map[string]any) { l["when_exhausted"] = "ESCALATE" }, hourlyRefunds())
	}, []want{{"limit.loosened", refund, "/limits/tenant-hourly-refunds/when_exhausted", warn}}},
	{"limit tightened", func(o, n doc) {
		withLimits(o, func(l map[string]any) { l["per"] = "USER" }, dailyRefunds())
		withLimits(n, func(l map[string]any) {
			l["max"], l["window"], l["per"], l["when_exhausted"] = num(20000), "604800s", "TENANT", "REFUSE"
			delete(l, "group_field")
		}, dailyRefunds())
	}, []want{
		{"limit.tightened", refund, "/limits/agent-daily-refunds/max", info},
		{"limit.tightened", refund, "/limits/agent-daily-refunds/window", info},
		{"limit.tightened", refund, "/limits/agent-daily-refunds/per", info},
		{"limit.tightened", refund, "/limits/agent-daily-refunds/group_field", info},
		{"limit.tightened", refund, "/limits/agent-daily-refunds/when_exhausted", info},
	}},
	{"limit counts another quantity", func(o, n doc) {
		// A rate becomes a budget: max is in another unit, a higher number
		// is no loosening to rank.
		withLimits(o, nil, hourlyRefunds())
		withLimits(n, func(l map[string]any) { l["sum_field"], l["max"] = "amount.amount_minor", num(1000000) }, hourlyRefunds())
	}, []want{
		{"limit.changed", refund, "/limits/tenant-hourly-refunds/sum_field", warn},
		{"limit.changed", refund, "/limits/tenant-hourly-refunds/max", warn},
	}},
	{"limit grouped otherwise, unknown key", func(o, n doc) {
		withLimits(o, nil, dailyRefunds())
		withLimits(n, func(l map[string]any) { l["group_field"], l["burst"] = "reason", num(5) }, dailyRefunds())
	}, []want{
		{"limit.changed", refund, "/limits/agent-daily-refunds/group_field", warn},
		{"limit.changed", refund, "/limits/agent-daily-refunds/burst", warn},
	}},
	{"limit description changed", func(o, n doc) {
		withLimits(o, nil, dailyRefunds())
		withLimits(n, func(l map[string]any) { l["description"] = "an agent refunds at most 500.00 a day" }, dailyRefunds())
	}, []want{{"text.changed", refund, "/limits/agent-daily-refunds/description", info}}},
	{"input field added", func(_, n doc) {
		at(n.cmd(refund), "input_schema", "properties")["note"] = map[string]any{"type": "string"}
	}, []want{{"schema.field_added", refund, "/input_schema/properties/note", warn}}},
	{"nested input field added", func(_, n doc) {
		at(n.cmd(refund), "input_schema", "properties", "amount", "properties")["rate"] = map[string]any{"type": "number"}
	}, []want{{"schema.field_added", refund, "/input_schema/properties/amount/properties/rate", warn}}},
	{"required removed", func(_, n doc) {
		s := at(n.cmd(refund), "input_schema")
		s["required"] = slices.DeleteFunc(s["required"].([]any), func(v any) bool { return v == "reason" })
	}, []want{{"schema.required_removed", refund, "/input_schema/required/reason", warn}}},
	{"bounds relaxed", func(_, n doc) {
		reason := at(n.cmd(refund), "input_schema", "properties", "reason")
		reason["maxLength"] = num(5000)
		delete(reason, "minLength")
		at(n.cmd(refund), "input_schema", "properties", "amount", "properties", "amount_minor")["anyOf"].([]any)[0].(map[string]any)["maximum"] = num(1000000000)
		at(n.cmd(search), "input_schema", "properties", "page_size")["minimum"] = num(0)
		at(n.cmd(search), "input_schema", "properties", "tags")["maxItems"] = num(100)
	}, []want{
		{"schema.bound_relaxed", refund, "/input_schema/properties/reason/maxLength", warn},
		{"schema.bound_relaxed", refund, "/input_schema/properties/reason/minLength", warn},
		{"schema.bound_relaxed", refund, "/input_schema/properties/amount/properties/amount_minor/anyOf/0/maximum", warn},
		{"schema.bound_relaxed", search, "/input_schema/properties/page_size/minimum", warn},
		{"schema.bound_relaxed", search, "/input_schema/properties/tags/maxItems", warn},
	}},
	{"pattern changed or removed", func(_, n doc) {
		at(n.cmd(refund), "input_schema", "properties", "ticket_id")["pattern"] = "^T-[0-9]+$"
		delete(at(n.cmd(refund), "input_schema", "properties", "amount", "properties", "currency_code"), "pattern")
		delete(at(n.cmd(search), "input_schema", "properties", "created_after"), "format")
	}, []want{
		{"schema.pattern_changed", refund, "/input_schema/properties/ticket_id/pattern", warn},
		{"schema.pattern_changed", refund, "/input_schema/properties/amount/properties/currency_code/pattern", warn},
		{"schema.pattern_changed", search, "/input_schema/properties/created_after/format", warn},
	}},
	{"enum widened", func(_, n doc) {
		items := at(n.cmd(search), "input_schema", "properties", "statuses", "items")
		items["enum"] = append(items["enum"].([]any), "TICKET_STATUS_DELETED")
	}, []want{{"schema.enum_widened", search, "/input_schema/properties/statuses/items/enum", warn}}},
	{"enum removed", func(_, n doc) {
		delete(at(n.cmd(search), "input_schema", "properties", "statuses", "items"), "enum")
	}, []want{{"schema.enum_widened", search, "/input_schema/properties/statuses/items/enum", warn}}},
	{"const removed", func(o, _ doc) {
		at(o.cmd(refund), "input_schema", "properties", "reason")["const"] = "duplicate charge"
	}, []want{{"schema.enum_widened", refund, "/input_schema/properties/reason/const", warn}}},
	{"type widened", func(_, n doc) {
		at(n.cmd(refund), "input_schema", "properties", "reason")["type"] = []any{"string", "null"}
		amount := at(n.cmd(refund), "input_schema", "properties", "amount", "properties", "amount_minor")
		amount["anyOf"] = append(amount["anyOf"].([]any), map[string]any{"type": "null"})
	}, []want{
		{"schema.type_widened", refund, "/input_schema/properties/reason/type", warn},
		{"schema.type_widened", refund, "/input_schema/properties/amount/properties/amount_minor/anyOf/2", warn},
	}},
	{"constraints removed", func(_, n doc) {
		delete(at(n.cmd(refund), "input_schema"), "additionalProperties")
		delete(at(n.cmd(search), "input_schema", "properties", "tags"), "uniqueItems")
		delete(at(n.cmd(search), "input_schema", "properties", "tags"), "items")
	}, []want{
		{"schema.constraint_removed", refund, "/input_schema/additionalProperties", warn},
		{"schema.constraint_removed", search, "/input_schema/properties/tags/uniqueItems", warn},
		{"schema.constraint_removed", search, "/input_schema/properties/tags/items", warn},
	}},
	{"unranked keyword changed", func(_, n doc) {
		at(n.cmd(search), "input_schema", "properties", "created_after")["not"] = map[string]any{"pattern": "^0000-"}
	}, []want{{"schema.changed", search, "/input_schema/properties/created_after/not", warn}}},
	{"input narrowed", func(_, n doc) {
		at(n.cmd(refund), "input_schema", "properties", "reason")["maxLength"] = num(200)
		delete(at(n.cmd(search), "input_schema", "properties"), "query")
		s := at(n.cmd(search), "input_schema")
		s["required"] = []any{"page_size"}
	}, []want{
		{"schema.narrowed", refund, "/input_schema/properties/reason/maxLength", info},
		{"schema.narrowed", search, "/input_schema/properties/query", info},
		{"schema.narrowed", search, "/input_schema/required/page_size", info},
	}},
	{"output schema changed", func(_, n doc) { at(n.cmd(refund), "output_schema")["title"] = "Refund" },
		[]want{{"output_schema.changed", refund, "/output_schema", info}}},
	{"deadline changed", func(_, n doc) { n.cmd(refund)["deadline"] = "30s" },
		[]want{{"deadline.changed", refund, "/deadline", info}}},
	{"route changed", func(_, n doc) { at(n.cmd(refund), "rpc", "http")["path"] = "/v2/tickets/{ticket_id}:refund" },
		[]want{{"rpc.changed", refund, "/rpc/http/path", info}}},
	{"agent hint changed", func(_, n doc) { n.cmd(refund)["agent_hint"] = "Refund freely." },
		[]want{{"text.changed", refund, "/agent_hint", info}}},
	{"approver hint changed", func(_, n doc) { n.cmd(refund)["approver_hint"] = "Refunds." },
		[]want{{"text.changed", refund, "/approver_hint", info}}},
	{"unknown key changed", func(_, n doc) { n.cmd(refund)["budget"] = map[string]any{"per_day": num(3)} },
		[]want{{"command.changed", refund, "/budget", warn}}},
}

// TestDiffFindsEveryRule: each crafted change gives the findings it names,
// with their severities, and nothing high it does not name; together the
// cases exercise every rule.
func TestDiffFindsEveryRule(t *testing.T) {
	covered := map[string]bool{}
	for _, tc := range diffCases {
		t.Run(tc.name, func(t *testing.T) {
			o, n := sample(t), sample(t)
			tc.change(o, n)
			got := manifestdiff.Diff(o.parse(t, "old"), n.parse(t, "new"))
			for _, w := range tc.want {
				covered[w.rule] = true
				if !slices.ContainsFunc(got, func(f manifestdiff.Finding) bool {
					return f.Rule == w.rule && f.Command == w.command && f.Path == w.path && f.Severity == w.severity
				}) {
					t.Errorf("missing %s %s %s %s; got:\n%s", w.severity, w.rule, w.command, w.path, text(t, got))
				}
			}
			for _, f := range got {
				if f.Severity == high && !slices.ContainsFunc(tc.want, func(w want) bool { return w.rule == f.Rule && w.path == f.Path }) {
					t.Errorf("unexpected high finding %s %s %s", f.Rule, f.Command, f.Path)
				}
			}
		})
	}
	for _, r := range manifestdiff.Rules() {
		if !covered[r.ID] {
			t.Errorf("rule %s has no case in diffCases", r.ID)
		}
	}
}

func text(t *testing.T, fs []manifestdiff.Finding) string {
	t.Helper()
	var b bytes.Buffer
	if err := manifestdiff.WriteText(&b, fs); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestDiffOfTheSameManifestIsEmpty, also when one side writes keys the
// other leaves out as empty (a newer build's "conditions": []).
func TestDiffOfTheSameManifestIsEmpty(t *testing.T) {
	o, n := sample(t), sample(t)
	for _, c := range n["commands"].([]any) {
		c.(map[string]any)["conditions"] = []any{}
		c.(map[string]any)["limits"] = []any{}
		c.(map[string]any)["rate_limit"] = nil
	}
	if got := manifestdiff.Diff(o.parse(t, "old"), n.parse(t, "new")); len(got) != 0 {
		t.Fatalf("findings:\n%s", text(t, got))
	}
}

// TestTextOutputIsStable: one line per finding, ordered by command, path
// and rule, whatever order the manifests list their commands in.
func TestTextOutputIsStable(t *testing.T) {
	o, n := sample(t), sample(t)
	n.cmd(refund)["risk"] = "L2"
	n.cmd(approve)["separation_of_duties"] = nil
	n.cmd(refund)["permissions"] = []any{}
	list := n["commands"].([]any)
	slices.Reverse(list)
	got := text(t, manifestdiff.Diff(o.parse(t, "old"), n.parse(t, "new")))
	want := `high  sod.removed  expense.report.approve  /separation_of_duties  {"conflicts_with":["expense.report.submit"],"field":"report_id"} → -  the separation of duties is gone: the same user may now also expense.report.submit
high  permission.removed  ticket.refund  /permissions/payment.refund  "payment.refund" → -  permission payment.refund is no longer required
high  risk.lowered  ticket.refund  /risk  "L3" → "L2"  the risk is lower
`
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

func TestParseRefusesWhatIsNotAManifest(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"not json", "{", "not a JSON object"},
		{"other format", `{"format":"x","commands":[]}`, `format is "x"`},
		{"no commands", `{"format":"mandate.manifest/v1"}`, "no commands list"},
		{"no code", `{"format":"mandate.manifest/v1","commands":[{}]}`, "commands[0] has no code"},
		{"twice", `{"format":"mandate.manifest/v1","commands":[{"code":"a"},{"code":"a"}]}`, "listed twice"},
		{"two values", `{"format":"mandate.manifest/v1","commands":[]} {}`, "more than one JSON value"},
	} {
		_, err := manifestdiff.Parse("m.json", []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "m.json") {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestTextShowsExpressionsAsWritten: no HTML escaping of < > & in values.
func TestTextShowsExpressionsAsWritten(t *testing.T) {
	o, n := sample(t), sample(t)
	o.cmd(refund)["conditions"] = []any{largeRefund()}
	c := largeRefund()
	c["expression"] = "a > 1 && b < 2"
	n.cmd(refund)["conditions"] = []any{c}
	got := text(t, manifestdiff.Diff(o.parse(t, "old"), n.parse(t, "new")))
	if want := `"request.amount.amount_minor > 2000" → "a > 1 && b < 2"`; !strings.Contains(got, want) {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// TestLimitsAreMatchedByID: reordering limits is no change; a changed
// limit is reported at its id, and a removed one reads as written.
func TestLimitsAreMatchedByID(t *testing.T) {
	o, n := sample(t), sample(t)
	withLimits(o, nil, dailyRefunds(), hourlyRefunds())
	withLimits(n, nil, hourlyRefunds(), dailyRefunds())
	if got := manifestdiff.Diff(o.parse(t, "old"), n.parse(t, "new")); len(got) != 0 {
		t.Fatalf("reordered limits: findings:\n%s", text(t, got))
	}
	withLimits(n, func(l map[string]any) {
		if l["id"] == "tenant-hourly-refunds" {
			l["max"] = num(1000)
		}
	}, hourlyRefunds())
	got := text(t, manifestdiff.Diff(o.parse(t, "old"), n.parse(t, "new")))
	want := `high  limit.removed  ticket.refund  /limits/agent-daily-refunds  {"description":"an agent refunds at most 500.00 a day per currency","group_fiel… → -  limit agent-daily-refunds is gone (at most 50000 of amount.amount_minor per 86400s, counted per AGENT and per value of amount.currency_code; a human is asked past it)
warn  limit.loosened  ticket.refund  /limits/tenant-hourly-refunds/max  100 → 1000  limit tenant-hourly-refunds's max is higher: more passes per window
`
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}
