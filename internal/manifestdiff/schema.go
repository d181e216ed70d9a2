package manifestdiff

import (
	"slices"
	"strconv"
	"strings"
)

// Schema keywords by how a change of theirs is ranked.
var (
	// ignoredKeywords say nothing about what the input accepts (sensitive
	// fields are compared through sensitive_fields).
	ignoredKeywords = map[string]bool{
		"$schema": true, "$id": true, "$comment": true, "title": true, "description": true, "examples": true,
		"default": true, "deprecated": true, "readOnly": true, "writeOnly": true, "x-mandate-sensitive": true,
	}
	upperBounds = map[string]bool{"maxLength": true, "maximum": true, "exclusiveMaximum": true, "maxItems": true, "maxProperties": true, "maxContains": true}
	lowerBounds = map[string]bool{"minLength": true, "minimum": true, "exclusiveMinimum": true, "minItems": true, "minProperties": true, "minContains": true}
	patterns    = map[string]bool{"pattern": true, "format": true, "contentEncoding": true, "contentMediaType": true}
	// subschemas whose absence means "anything".
	subschemas = map[string]bool{
		"items": true, "additionalProperties": true, "propertyNames": true, "contains": true,
		"unevaluatedProperties": true, "unevaluatedItems": true, "additionalItems": true,
	}
	schemaMaps = map[string]bool{"properties": true, "patternProperties": true, "$defs": true, "definitions": true, "dependentSchemas": true}
)

// schema compares two JSON Schemas of an input at path: what the new one
// accepts that the old one did not (widened: warn) and what it no longer
// accepts (narrowed: info).
func (d *differ) schema(path string, o, n any) {
	// Compared strictly: in a schema, false and absent differ
	// (additionalProperties).
	if encode(o) == encode(n) {
		return
	}
	// Boolean schemas and absence: true or absent accepts anything, false
	// nothing.
	ob, oIsBool := o.(bool)
	nb, nIsBool := n.(bool)
	om, _ := o.(map[string]any)
	nm, _ := n.(map[string]any)
	switch {
	case o == nil && n != nil, oIsBool && ob && (!nIsBool || !nb):
		d.add(RuleSchemaNarrowed, path, o, n, "a schema now constrains what was free")
		return
	case n == nil, nIsBool && nb:
		d.add(RuleSchemaConstraintGone, path, o, n, "the schema is gone: anything is accepted")
		return
	case oIsBool && !ob:
		d.add(RuleSchemaConstraintGone, path, o, n, "what was refused (false) is accepted")
		return
	case nIsBool && !nb:
		d.add(RuleSchemaNarrowed, path, o, n, "nothing is accepted (false)")
		return
	case om == nil || nm == nil:
		d.add(RuleSchemaChanged, path, o, n, "the schema is not an object")
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
		ov, inOld := om[k]
		nv, inNew := nm[k]
		if ignoredKeywords[k] || (inOld == inNew && encode(ov) == encode(nv)) {
			continue
		}
		p := path + "/" + pointerEscape(k)
		switch {
		case schemaMaps[k]:
			d.schemaMap(p, k, obj(ov), obj(nv))
		case subschemas[k]:
			d.schema(p, ov, nv)
		case k == "anyOf" || k == "oneOf":
			d.branches(p, ov, nv, RuleSchemaTypeWidened, "%s gained a branch", RuleSchemaNarrowed, "%s lost a branch")
		case k == "allOf" || k == "prefixItems":
			d.branches(p, ov, nv, RuleSchemaNarrowed, "%s gained a member", RuleSchemaConstraintGone, "%s lost a member")
		case k == "required":
			d.set(p, strs(ov), strs(nv), RuleSchemaRequiredRemoved, RuleSchemaNarrowed, "%s is no longer required", "%s is now required")
		case k == "enum":
			d.enum(p, ov, nv)
		case k == "const":
			if !inNew {
				d.add(RuleSchemaEnumWidened, p, ov, nil, "the const is gone")
			} else if !inOld {
				d.add(RuleSchemaNarrowed, p, nil, nv, "a const is added")
			} else {
				d.add(RuleSchemaEnumWidened, p, ov, nv, "the const changed")
			}
		case k == "type":
			d.types(p, ov, nv)
		case upperBounds[k] || lowerBounds[k]:
			d.bound(p, k, ov, nv, inOld, inNew)
		case patterns[k]:
			if !inOld {
				d.add(RuleSchemaNarrowed, p, nil, nv, "a %s is added", k)
			} else {
				d.add(RuleSchemaPatternChanged, p, ov, nv, "the %s changed or is gone", k)
			}
		case k == "uniqueItems":
			if ov == true {
				d.add(RuleSchemaConstraintGone, p, ov, nv, "items need no longer be unique")
			} else {
				d.add(RuleSchemaNarrowed, p, ov, nv, "items must be unique")
			}
		case k == "multipleOf" && !inNew:
			d.add(RuleSchemaBoundRelaxed, p, ov, nil, "multipleOf is gone")
		case k == "multipleOf" && !inOld:
			d.add(RuleSchemaNarrowed, p, nil, nv, "multipleOf is added")
		default:
			d.add(RuleSchemaChanged, p, ov, nv, "%s changed", k)
		}
	}
}

// schemaMap compares a map of named subschemas: properties gained are
// fields the input accepts (schema.field_added), lost are narrowing; $defs
// members matter only through what refers to them.
func (d *differ) schemaMap(path, keyword string, o, n map[string]any) {
	names := map[string]bool{}
	for k := range o {
		names[k] = true
	}
	for k := range n {
		names[k] = true
	}
	defs := keyword == "$defs" || keyword == "definitions"
	for _, name := range sortedKeys(names) {
		ov, inOld := o[name]
		nv, inNew := n[name]
		p := path + "/" + pointerEscape(name)
		switch {
		case !inOld && defs, !inNew && defs:
		case !inOld:
			d.add(RuleSchemaFieldAdded, p, nil, nv, "the input accepts %s", name)
		case !inNew:
			d.add(RuleSchemaNarrowed, p, ov, nil, "the input no longer accepts %s", name)
		default:
			d.schema(p, ov, nv)
		}
	}
}

// branches compares lists of subschemas by position; members beyond the
// shorter list are gained or lost.
func (d *differ) branches(path string, o, n any, gainedRule, gainedMsg, lostRule, lostMsg string) {
	ol, _ := o.([]any)
	nl, _ := n.([]any)
	kw := path[strings.LastIndex(path, "/")+1:]
	for i := range max(len(ol), len(nl)) {
		p := path + "/" + strconv.Itoa(i)
		switch {
		case i >= len(ol):
			d.add(gainedRule, p, nil, nl[i], gainedMsg, kw)
		case i >= len(nl):
			d.add(lostRule, p, ol[i], nil, lostMsg, kw)
		default:
			d.schema(p, ol[i], nl[i])
		}
	}
}

func (d *differ) enum(path string, o, n any) {
	if n == nil {
		d.add(RuleSchemaEnumWidened, path, o, nil, "the enum is gone: any value of the type is accepted")
		return
	}
	if o == nil {
		d.add(RuleSchemaNarrowed, path, nil, n, "an enum is added")
		return
	}
	ol, _ := o.([]any)
	nl, _ := n.([]any)
	in := func(list []any, v any) bool {
		return slices.ContainsFunc(list, func(e any) bool { return encode(e) == encode(v) })
	}
	for _, v := range nl {
		if !in(ol, v) {
			d.add(RuleSchemaEnumWidened, path, nil, v, "the enum accepts %s", encode(v))
		}
	}
	for _, v := range ol {
		if !in(nl, v) {
			d.add(RuleSchemaNarrowed, path, v, nil, "the enum no longer accepts %s", encode(v))
		}
	}
}

func (d *differ) types(path string, o, n any) {
	set := func(v any) []string {
		if s, ok := v.(string); ok {
			return []string{s}
		}
		return strs(v)
	}
	if n == nil {
		d.add(RuleSchemaTypeWidened, path, o, nil, "the type is gone: any type is accepted")
		return
	}
	if o == nil {
		d.add(RuleSchemaNarrowed, path, nil, n, "a type is added")
		return
	}
	os, ns := set(o), set(n)
	for _, t := range ns {
		if !slices.Contains(os, t) {
			d.add(RuleSchemaTypeWidened, path, o, n, "the type accepts %s", t)
			return
		}
	}
	d.add(RuleSchemaNarrowed, path, o, n, "the type accepts less")
}

func (d *differ) bound(path, k string, o, n any, inOld, inNew bool) {
	switch {
	case !inNew:
		d.add(RuleSchemaBoundRelaxed, path, o, nil, "%s is gone", k)
		return
	case !inOld:
		d.add(RuleSchemaNarrowed, path, nil, n, "%s is added", k)
		return
	}
	ov, nv, ok := numbers(o, n)
	if !ok {
		d.add(RuleSchemaChanged, path, o, n, "%s changed", k)
		return
	}
	c := nv.Cmp(ov)
	if c == 0 {
		return
	}
	if upperBounds[k] == (c > 0) {
		d.add(RuleSchemaBoundRelaxed, path, o, n, "%s is looser", k)
		return
	}
	d.add(RuleSchemaNarrowed, path, o, n, "%s is tighter", k)
}
