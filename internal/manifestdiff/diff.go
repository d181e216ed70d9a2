package manifestdiff

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/mandate-dev/mandate/internal/manifest"
)

// Finding is one governance-significant change.
type Finding struct {
	Rule     string   `json:"rule"`
	Severity Severity `json:"severity"`
	// Command is the command's code.
	Command string `json:"command"`
	// Path is a JSON pointer into the command's manifest entry; list
	// members that have an identity are named by it (/permissions/x,
	// /conditions/<id>), not by their index.
	Path string `json:"path"`
	// Old and New are the values at Path (nil: absent).
	Old     any    `json:"old"`
	New     any    `json:"new"`
	Message string `json:"message"`
	// Override is set when the overrides file changed the severity.
	Override *Applied `json:"override,omitempty"`
}

// Applied records an override applied to a finding.
type Applied struct {
	// Default is the rule's own severity.
	Default Severity `json:"default"`
	Reason  string   `json:"reason"`
}

// Diff returns every governance-significant change from old to new, in a
// stable order (command, path, rule), each with its rule's default
// severity.
func Diff(old, new *Manifest) []Finding {
	d := &differ{}
	codes := map[string]bool{}
	for c := range old.commands {
		codes[c] = true
	}
	for c := range new.commands {
		codes[c] = true
	}
	for _, code := range sortedKeys(codes) {
		o, n := old.commands[code], new.commands[code]
		d.code = code
		switch {
		case o == nil:
			d.add(RuleCommandAdded, "", nil, code, "new command: %s", summary(n))
		case n == nil:
			d.add(RuleCommandRemoved, "", code, nil, "command removed (it was %s)", summary(o))
		default:
			d.command(o, n)
		}
	}
	sort.SliceStable(d.out, func(i, j int) bool {
		a, b := d.out[i], d.out[j]
		return cmp.Or(cmp.Compare(a.Command, b.Command), cmp.Compare(a.Path, b.Path), cmp.Compare(a.Rule, b.Rule)) < 0
	})
	return d.out
}

type differ struct {
	code string
	out  []Finding
}

func (d *differ) add(rule, path string, old, new any, format string, args ...any) {
	r, ok := ruleByID(rule)
	if !ok {
		panic("manifestdiff: unknown rule " + rule)
	}
	d.out = append(d.out, Finding{Rule: rule, Severity: r.Severity, Command: d.code, Path: path, Old: old, New: new, Message: fmt.Sprintf(format, args...)})
}

// summary describes a command in a few words.
func summary(c map[string]any) string {
	conf := "no confirmation"
	if effectiveConfirmation(c) == confirmAlways {
		conf = "confirmation required"
	} else if effectiveConfirmation(c) == confirmConditional {
		conf = "confirmation under conditions"
	}
	perms := strings.Join(strs(c["permissions"]), ", ")
	if perms == "" {
		perms = "none"
	}
	return fmt.Sprintf("risk %s, %s, side effects [%s], permissions %s", str(c["risk"]), conf, strings.Join(strs(c["side_effects"]), ", "), perms)
}

// handled are the command keys compared by their own rules; any other key
// that differs is command.changed.
var handled = map[string]bool{
	"code": true, "display_name": true, "agent_hint": true, "approver_hint": true, "description": true, "examples": true,
	"risk": true, "idempotent": true, "reversible": true, "recall": true, "side_effects": true,
	"permissions": true, "required_feature": true, "confirmation": true, "confirmation_required": true,
	"approver": true, "separation_of_duties": true, "subject_field": true, "lifecycle": true,
	"deadline": true, "rpc": true, "sensitive_fields": true, "input_schema": true, "output_schema": true,
	"conditions": true, "limits": true,
}

func (d *differ) command(o, n map[string]any) {
	d.lifecycle(str(o["lifecycle"]), str(n["lifecycle"]))
	d.risk(str(o["risk"]), str(n["risk"]))
	d.confirmation(o, n)
	d.approver(obj(o["approver"]), obj(n["approver"]))
	d.set("/permissions", strs(o["permissions"]), strs(n["permissions"]), RulePermissionRemoved, RulePermissionAdded, "permission %s is no longer required", "permission %s is now required")
	if of, nf := str(o["required_feature"]), str(n["required_feature"]); of != nf {
		if of == "" {
			d.add(RuleFeatureAdded, "/required_feature", of, nf, "the command now requires the tenant feature %s", nf)
		} else {
			d.add(RuleFeatureRemoved, "/required_feature", of, nf, "the tenant feature %s is no longer required", of)
		}
	}
	d.set("/sensitive_fields", strs(o["sensitive_fields"]), strs(n["sensitive_fields"]), RuleSensitiveRemoved, RuleSensitiveAdded, "input field %s is no longer sensitive: it will be logged and audited", "input field %s is now sensitive")
	d.sod(obj(o["separation_of_duties"]), obj(n["separation_of_duties"]))
	d.boolean("/reversible", o["reversible"], n["reversible"], RuleReversibleChanged)
	d.scalar("/recall", o["recall"], n["recall"], RuleRecallChanged, "the command that undoes this one changed")
	d.boolean("/idempotent", o["idempotent"], n["idempotent"], RuleIdempotentChanged)
	if os, ns := strs(o["side_effects"]), strs(n["side_effects"]); !sameSet(os, ns) {
		d.add(RuleSideEffectsChanged, "/side_effects", os, ns, "side effects %s", setChange(os, ns))
	}
	d.scalar("/subject_field", o["subject_field"], n["subject_field"], RuleSubjectChanged, "the subject field changed")
	d.scalar("/deadline", o["deadline"], n["deadline"], RuleDeadlineChanged, "the deadline changed")
	d.leaves("/rpc", o["rpc"], n["rpc"], RuleRPCChanged, "the binding changed")
	for _, k := range []string{"display_name", "agent_hint", "approver_hint", "description", "examples"} {
		if !equal(o[k], n[k]) {
			d.add(RuleTextChanged, "/"+k, o[k], n[k], "%s changed", strings.ReplaceAll(k, "_", " "))
		}
	}
	d.conditions(o["conditions"], n["conditions"])
	d.limits(o["limits"], n["limits"])
	d.schema("/input_schema", o["input_schema"], n["input_schema"])
	if !equal(o["output_schema"], n["output_schema"]) {
		d.add(RuleOutputSchemaChanged, "/output_schema", nil, nil, "the output schema changed")
	}
	keys := map[string]bool{}
	for k := range o {
		keys[k] = true
	}
	for k := range n {
		keys[k] = true
	}
	for _, k := range sortedKeys(keys) {
		if !handled[k] && !equal(o[k], n[k]) {
			d.add(RuleCommandChanged, "/"+pointerEscape(k), o[k], n[k], "%s changed; this version of the diff does not know the key: review it", k)
		}
	}
}

func (d *differ) lifecycle(o, n string) {
	if o == n {
		return
	}
	callable := func(l string) bool { return l == "PUBLISHED" || l == "DEPRECATED" }
	if !callable(o) && callable(n) {
		d.add(RuleLifecyclePublished, "/lifecycle", o, n, "the command becomes callable")
		return
	}
	d.add(RuleLifecycleChanged, "/lifecycle", o, n, "the lifecycle changed")
}

func (d *differ) risk(o, n string) {
	if o == n {
		return
	}
	if manifest.RiskLevel(n) < manifest.RiskLevel(o) {
		d.add(RuleRiskLowered, "/risk", o, n, "the risk is lower")
		return
	}
	d.add(RuleRiskRaised, "/risk", o, n, "the risk is higher")
}

// Who is asked: never, under a condition, always.
const (
	confirmNever = iota
	confirmConditional
	confirmAlways
)

// effectiveConfirmation is who the declaration asks, from the declared
// value and the confirmation it demands (confirmation_required). A
// CONDITIONAL confirmation asks only when a condition holds, whatever
// confirmation_required says.
func effectiveConfirmation(c map[string]any) int {
	switch {
	case str(c["confirmation"]) == "CONDITIONAL":
		return confirmConditional
	case c["confirmation_required"] == true:
		return confirmAlways
	default:
		return confirmNever
	}
}

func (d *differ) confirmation(o, n map[string]any) {
	oe, ne := effectiveConfirmation(o), effectiveConfirmation(n)
	oc, nc := str(o["confirmation"]), str(n["confirmation"])
	switch {
	case ne == confirmNever && oe != confirmNever:
		if oe == confirmAlways {
			msg := "a human was asked and no longer is"
			if oc != nc {
				msg += fmt.Sprintf(" (confirmation %s → %s)", oc, nc)
			}
			d.add(RuleConfirmationDropped, "/confirmation_required", true, false, "%s", msg)
		} else {
			d.add(RuleConfirmationDropped, "/confirmation", oc, nc, "a human was asked under conditions and no longer is")
		}
	case ne < oe:
		d.add(RuleConfirmationLoosened, "/confirmation", oc, nc, "a human was always asked and now only under a condition")
	case ne > oe:
		d.add(RuleConfirmationTightened, "/confirmation", oc, nc, "a human is asked more often")
	case oc != nc:
		d.add(RuleConfirmationChanged, "/confirmation", oc, nc, "the declared confirmation changed; who is asked did not (yet)")
	}
}

func (d *differ) approver(o, n map[string]any) {
	const holder = manifest.ApproverPermissionHolder
	ok, nk := str(o["kind"]), str(n["kind"])
	switch {
	case ok == holder && nk != holder:
		d.add(RuleApproverWeakened, "/approver/kind", ok, nk, "four eyes dropped: the requesting user may approve their own call")
	case ok != holder && nk == holder:
		d.add(RuleApproverStrengthened, "/approver/kind", ok, nk, "four eyes: another user holding %s approves", str(n["permission"]))
	case ok != nk:
		d.add(RuleApproverChanged, "/approver/kind", ok, nk, "the approver kind changed")
	}
	keys := map[string]bool{}
	for k := range o {
		keys[k] = true
	}
	for k := range n {
		keys[k] = true
	}
	for _, k := range sortedKeys(keys) {
		if k == "kind" || equal(o[k], n[k]) {
			continue
		}
		if ok != nk && (k == "permission" || k == "declared") {
			continue // part of the kind's change, reported above
		}
		path := "/approver/" + pointerEscape(k)
		if ov, nv, ok := numbers(o[k], n[k]); ok {
			if nv.Cmp(ov) < 0 {
				d.add(RuleApproverWeakened, path, o[k], n[k], "%s is lower", k)
			} else {
				d.add(RuleApproverStrengthened, path, o[k], n[k], "%s is higher", k)
			}
			continue
		}
		d.add(RuleApproverChanged, path, o[k], n[k], "the approver's %s changed", k)
	}
}

func (d *differ) sod(o, n map[string]any) {
	switch {
	case o == nil && n == nil:
		return
	case n == nil:
		d.add(RuleSoDRemoved, "/separation_of_duties", o, nil, "the separation of duties is gone: the same user may now also %s", strings.Join(strs(o["conflicts_with"]), ", "))
		return
	case o == nil:
		d.add(RuleSoDAdded, "/separation_of_duties", nil, n, "a separation of duties is declared")
		return
	}
	d.set("/separation_of_duties/conflicts_with", strs(o["conflicts_with"]), strs(n["conflicts_with"]), RuleSoDRemoved, RuleSoDAdded,
		"the same user may now also %s the same subject", "the same user may no longer also %s the same subject")
	d.scalar("/separation_of_duties/field", o["field"], n["field"], RuleSoDChanged, "the separation of duties keys on another field")
	for k := range n {
		if k != "conflicts_with" && k != "field" && !equal(o[k], n[k]) {
			d.add(RuleSoDChanged, "/separation_of_duties/"+pointerEscape(k), o[k], n[k], "the separation of duties' %s changed", k)
		}
	}
	for k := range o {
		if _, inNew := n[k]; !inNew && k != "conflicts_with" && k != "field" && !isZero(o[k]) {
			d.add(RuleSoDChanged, "/separation_of_duties/"+pointerEscape(k), o[k], nil, "the separation of duties' %s is gone", k)
		}
	}
}

// byID indexes a list of objects that have an identity (conditions,
// limits) by their id, by position ("#0", "#1", …) for a member without
// one.
func byID(v any) map[string]map[string]any {
	out := map[string]map[string]any{}
	list, _ := v.([]any)
	for i, e := range list {
		m, _ := e.(map[string]any)
		id := str(m["id"])
		if id == "" {
			id = fmt.Sprintf("#%d", i)
		}
		out[id] = m
	}
	return out
}

// unionKeys returns the keys of a and b, sorted.
func unionKeys[V any](a, b map[string]V) []string {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	return sortedKeys(keys)
}

// conditions compares the conditions lists member by member, by id (by
// position for a member without one).
func (d *differ) conditions(o, n any) {
	om, nm := byID(o), byID(n)
	for _, id := range unionKeys(om, nm) {
		path := "/conditions/" + pointerEscape(id)
		oc, nc := om[id], nm[id]
		switch {
		case nc == nil:
			d.add(RuleConditionRemoved, path, oc, nil, "condition %s is gone (%s)", id, str(oc["expression"]))
		case oc == nil:
			d.add(RuleConditionAdded, path, nil, nc, "condition %s is added", id)
		default:
			for _, k := range unionKeys(oc, nc) {
				if equal(oc[k], nc[k]) {
					continue
				}
				if k == "description" {
					d.add(RuleTextChanged, path+"/description", oc[k], nc[k], "condition %s's description changed", id)
					continue
				}
				d.add(RuleConditionChanged, path+"/"+pointerEscape(k), oc[k], nc[k], "condition %s's %s changed", id, k)
			}
		}
	}
}

// limitScopes are the values of a limit's per, from the party counted
// narrowest (each agent apart: the most calls in all) to the widest (the
// whole tenant).
var limitScopes = []string{manifest.LimitPerAgent, manifest.LimitPerUser, manifest.LimitPerTenant}

// limits compares the limits lists member by member, by id (by position
// for a member without one).
func (d *differ) limits(o, n any) {
	om, nm := byID(o), byID(n)
	for _, id := range unionKeys(om, nm) {
		path := "/limits/" + pointerEscape(id)
		ol, nl := om[id], nm[id]
		switch {
		case nl == nil:
			d.add(RuleLimitRemoved, path, ol, nil, "limit %s is gone (%s)", id, limitSummary(ol))
		case ol == nil:
			d.add(RuleLimitAdded, path, nil, nl, "limit %s is added (%s)", id, limitSummary(nl))
		default:
			d.limit(path, id, ol, nl)
		}
	}
}

// limit compares two versions of one limit key by key: what lets more
// calls (or more of what a call spends) through is limit.loosened, less
// limit.tightened, what cannot be ranked limit.changed.
func (d *differ) limit(path, id string, o, n map[string]any) {
	// A rate (no sum_field) counts calls, a budget adds up a field: when
	// what is counted changes, max is in another unit and cannot be ranked.
	sumChanged := !equal(o["sum_field"], n["sum_field"])
	for _, k := range unionKeys(o, n) {
		ov, nv := o[k], n[k]
		if equal(ov, nv) {
			continue
		}
		p := path + "/" + pointerEscape(k)
		report := func(rule, format string, args ...any) {
			d.add(rule, p, ov, nv, format, args...)
		}
		switch k {
		case "description":
			report(RuleTextChanged, "limit %s's description changed", id)
		case "max":
			on, nn, ok := numbers(ov, nv)
			switch {
			case sumChanged:
				report(RuleLimitChanged, "limit %s's max changed with what it counts", id)
			case !ok:
				report(RuleLimitChanged, "limit %s's max changed", id)
			case nn.Cmp(on) > 0:
				report(RuleLimitLoosened, "limit %s's max is higher: more passes per window", id)
			default:
				report(RuleLimitTightened, "limit %s's max is lower", id)
			}
		case "window":
			ow, oerr := time.ParseDuration(str(ov))
			nw, nerr := time.ParseDuration(str(nv))
			switch {
			case oerr != nil || nerr != nil:
				report(RuleLimitChanged, "limit %s's window changed", id)
			case nw < ow:
				report(RuleLimitLoosened, "limit %s's window is shorter (%s → %s): calls leave the count sooner, more pass over time", id, ow, nw)
			case nw > ow:
				report(RuleLimitTightened, "limit %s's window is longer (%s → %s)", id, ow, nw)
			}
		case "per":
			oi, ni := slices.Index(limitScopes, str(ov)), slices.Index(limitScopes, str(nv))
			switch {
			case oi < 0 || ni < 0:
				report(RuleLimitChanged, "limit %s is counted per %s, no longer per %s", id, str(nv), str(ov))
			case ni < oi:
				report(RuleLimitLoosened, "limit %s is counted per %s, no longer per %s: more passes in all", id, str(nv), str(ov))
			default:
				report(RuleLimitTightened, "limit %s is counted per %s, no longer per %s", id, str(nv), str(ov))
			}
		case "group_field":
			switch {
			case isZero(ov):
				report(RuleLimitLoosened, "limit %s is counted apart per value of %s where it was one ceiling", id, str(nv))
			case isZero(nv):
				report(RuleLimitTightened, "limit %s is one ceiling, no longer one per value of %s", id, str(ov))
			default:
				report(RuleLimitChanged, "limit %s is counted per value of %s, no longer of %s", id, str(nv), str(ov))
			}
		case "sum_field":
			switch {
			case isZero(ov):
				report(RuleLimitChanged, "limit %s adds up %s where it counted calls", id, str(nv))
			case isZero(nv):
				report(RuleLimitChanged, "limit %s counts calls where it added up %s", id, str(ov))
			default:
				report(RuleLimitChanged, "limit %s adds up %s, no longer %s", id, str(nv), str(ov))
			}
		case "when_exhausted":
			const refuse, escalate = manifest.LimitExhaustRefuse, manifest.LimitExhaustEscalate
			switch {
			case str(ov) == refuse && str(nv) == escalate:
				report(RuleLimitLoosened, "past limit %s a human is asked where the call was refused: calls pass the ceiling with an approval", id)
			case str(ov) == escalate && str(nv) == refuse:
				report(RuleLimitTightened, "past limit %s the call is refused where a human was asked", id)
			default:
				report(RuleLimitChanged, "limit %s's when_exhausted changed", id)
			}
		default:
			report(RuleLimitChanged, "limit %s's %s changed", id, k)
		}
	}
}

// limitSummary describes a limit in a few words: "at most 10 calls per
// 86400s, counted per AGENT; refused past it".
func limitSummary(l map[string]any) string {
	what := "calls"
	if f := str(l["sum_field"]); f != "" {
		what = "of " + f
	}
	per := str(l["per"])
	if g := str(l["group_field"]); g != "" {
		per += " and per value of " + g
	}
	then := "refused past it"
	if str(l["when_exhausted"]) == manifest.LimitExhaustEscalate {
		then = "a human is asked past it"
	}
	return fmt.Sprintf("at most %s %s per %s, counted per %s; %s", encode(l["max"]), what, str(l["window"]), per, then)
}

// set reports members of o missing from n (removed) and of n missing from
// o (added), one finding each.
func (d *differ) set(path string, o, n []string, removed, added, removedMsg, addedMsg string) {
	for _, v := range o {
		if !slices.Contains(n, v) {
			d.add(removed, path+"/"+pointerEscape(v), v, nil, removedMsg, v)
		}
	}
	for _, v := range n {
		if !slices.Contains(o, v) {
			d.add(added, path+"/"+pointerEscape(v), nil, v, addedMsg, v)
		}
	}
}

func (d *differ) boolean(path string, o, n any, rule string) {
	ob, nb := o == true, n == true
	if ob != nb {
		d.add(rule, path, ob, nb, "%s %t → %t", strings.TrimPrefix(path, "/"), ob, nb)
	}
}

func (d *differ) scalar(path string, o, n any, rule, msg string) {
	if !equal(o, n) {
		d.add(rule, path, o, n, "%s", msg)
	}
}

// leaves reports every leaf that differs under path, one finding each.
func (d *differ) leaves(path string, o, n any, rule, msg string) {
	om, oIsMap := o.(map[string]any)
	nm, nIsMap := n.(map[string]any)
	if !oIsMap || !nIsMap {
		d.scalar(path, o, n, rule, msg)
		return
	}
	keys := map[string]bool{}
	for k := range om {
		keys[k] = true
	}
	for k := range nm {
		keys[k] = true
	}
	for _, k := range sortedKeys(keys) {
		d.leaves(path+"/"+pointerEscape(k), om[k], nm[k], rule, msg)
	}
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func obj(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func strs(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, e := range list {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func sameSet(a, b []string) bool {
	for _, v := range a {
		if !slices.Contains(b, v) {
			return false
		}
	}
	for _, v := range b {
		if !slices.Contains(a, v) {
			return false
		}
	}
	return true
}

func setChange(o, n []string) string {
	var parts []string
	for _, v := range n {
		if !slices.Contains(o, v) {
			parts = append(parts, "+"+v)
		}
	}
	for _, v := range o {
		if !slices.Contains(n, v) {
			parts = append(parts, "-"+v)
		}
	}
	return strings.Join(parts, " ")
}

// isZero: absent, null, "", false, 0, [] and {} are the same absence
// (a newer build may write a key an older one left out).
func isZero(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case bool:
		return !x
	case json.Number:
		return x == "0"
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	}
	return false
}

func equal(a, b any) bool {
	if isZero(a) && isZero(b) {
		return true
	}
	return encode(a) == encode(b)
}

// encode is v's compact JSON (keys sorted), for comparing and printing.
func encode(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // expressions and patterns read as written: "a > 1", not "a \u003e 1"
	if err := enc.Encode(v); err != nil {
		return fmt.Sprint(v)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// numbers returns a and b as exact numbers when both are JSON numbers.
func numbers(a, b any) (*big.Rat, *big.Rat, bool) {
	an, ok1 := a.(json.Number)
	bn, ok2 := b.(json.Number)
	if !ok1 || !ok2 {
		return nil, nil, false
	}
	ar, ok1 := new(big.Rat).SetString(string(an))
	br, ok2 := new(big.Rat).SetString(string(bn))
	return ar, br, ok1 && ok2
}

func pointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
