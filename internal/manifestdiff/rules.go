package manifestdiff

import (
	"fmt"
	"slices"
)

// Severity ranks a finding. The zero value is not a severity.
type Severity int

// Severities, lowest first.
const (
	Info Severity = iota + 1
	Warn
	High
)

var severityNames = map[Severity]string{Info: "info", Warn: "warn", High: "high"}

// String returns "info", "warn" or "high".
func (s Severity) String() string {
	if n, ok := severityNames[s]; ok {
		return n
	}
	return fmt.Sprintf("severity(%d)", int(s))
}

// MarshalText writes the severity's name.
func (s Severity) MarshalText() ([]byte, error) {
	if _, ok := severityNames[s]; !ok {
		return nil, fmt.Errorf("manifestdiff: no severity %d", int(s))
	}
	return []byte(s.String()), nil
}

// UnmarshalText reads a severity's name.
func (s *Severity) UnmarshalText(b []byte) error {
	v, err := ParseSeverity(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// ParseSeverity reads "info", "warn" or "high".
func ParseSeverity(name string) (Severity, error) {
	for s, n := range severityNames {
		if n == name {
			return s, nil
		}
	}
	return 0, fmt.Errorf("unknown severity %q (want high, warn or info)", name)
}

// Rule is one kind of finding with its default severity.
type Rule struct {
	ID       string
	Severity Severity
	// When says, in words, when the rule reports (the docs' rules table).
	When string
}

// Rule ids.
const (
	RuleCommandAdded          = "command.added"
	RuleCommandRemoved        = "command.removed"
	RuleLifecyclePublished    = "lifecycle.published"
	RuleLifecycleChanged      = "lifecycle.changed"
	RuleRiskLowered           = "risk.lowered"
	RuleRiskRaised            = "risk.raised"
	RuleConfirmationDropped   = "confirmation.dropped"
	RuleConfirmationLoosened  = "confirmation.loosened"
	RuleConfirmationChanged   = "confirmation.changed"
	RuleConfirmationTightened = "confirmation.tightened"
	RuleApproverWeakened      = "approver.weakened"
	RuleApproverChanged       = "approver.changed"
	RuleApproverStrengthened  = "approver.strengthened"
	RulePermissionRemoved     = "permission.removed"
	RulePermissionAdded       = "permission.added"
	RuleFeatureRemoved        = "feature.removed"
	RuleFeatureAdded          = "feature.added"
	RuleSensitiveRemoved      = "sensitive.removed"
	RuleSensitiveAdded        = "sensitive.added"
	RuleSoDRemoved            = "sod.removed"
	RuleSoDChanged            = "sod.changed"
	RuleSoDAdded              = "sod.added"
	RuleReversibleChanged     = "reversible.changed"
	RuleRecallChanged         = "recall.changed"
	RuleIdempotentChanged     = "idempotent.changed"
	RuleSideEffectsChanged    = "side_effects.changed"
	RuleSubjectChanged        = "subject.changed"
	RuleConditionRemoved      = "condition.removed"
	RuleConditionChanged      = "condition.changed"
	RuleConditionAdded        = "condition.added"
	RuleLimitRemoved          = "limit.removed"
	RuleLimitLoosened         = "limit.loosened"
	RuleLimitChanged          = "limit.changed"
	RuleLimitTightened        = "limit.tightened"
	RuleLimitAdded            = "limit.added"
	RuleSchemaFieldAdded      = "schema.field_added"
	RuleSchemaRequiredRemoved = "schema.required_removed"
	RuleSchemaBoundRelaxed    = "schema.bound_relaxed"
	RuleSchemaPatternChanged  = "schema.pattern_changed"
	RuleSchemaEnumWidened     = "schema.enum_widened"
	RuleSchemaTypeWidened     = "schema.type_widened"
	RuleSchemaConstraintGone  = "schema.constraint_removed"
	RuleSchemaChanged         = "schema.changed"
	RuleSchemaNarrowed        = "schema.narrowed"
	RuleOutputSchemaChanged   = "output_schema.changed"
	RuleDeadlineChanged       = "deadline.changed"
	RuleRPCChanged            = "rpc.changed"
	RuleTextChanged           = "text.changed"
	RuleCommandChanged        = "command.changed"
)

// rules is the table docs/governance-diff.md lists (a test keeps them
// equal), in the order the doc shows them.
var rules = []Rule{
	{RuleCommandAdded, Warn, "a command is in NEW and not in OLD: new power for agents, review its declaration"},
	{RuleCommandRemoved, Info, "a command is in OLD and not in NEW"},
	{RuleLifecyclePublished, Warn, "a DRAFT command becomes callable (PUBLISHED or DEPRECATED)"},
	{RuleLifecycleChanged, Info, "any other lifecycle change (deprecated, back to draft)"},
	{RuleRiskLowered, High, "the risk level is lower (L3 → L2)"},
	{RuleRiskRaised, Info, "the risk level is higher"},
	{RuleConfirmationDropped, High, "a human was asked (always or under a condition) and no longer is: `confirmation_required` true → false, or `confirmation` CONDITIONAL → no confirmation"},
	{RuleConfirmationLoosened, High, "a human was always asked and now only under a condition (`confirmation` → CONDITIONAL)"},
	{RuleConfirmationChanged, Warn, "the declared `confirmation` changes but who is asked does not (REQUIRED → DEFAULT on an L3: the promise now rests on the risk)"},
	{RuleConfirmationTightened, Info, "a human is asked where none was, or always where only under a condition"},
	{RuleApproverWeakened, High, "four eyes dropped (`approver.kind` PERMISSION_HOLDER → REQUESTING_USER), or a number in the approver policy (e.g. an approver count) is lower"},
	{RuleApproverChanged, Warn, "any other change of the approver policy: its permission, whether it is declared, a field this version does not know"},
	{RuleApproverStrengthened, Info, "four eyes added, or a number in the approver policy is higher"},
	{RulePermissionRemoved, High, "a permission the caller needed is no longer required (a changed permission is one removed and one added)"},
	{RulePermissionAdded, Info, "a permission is required that was not"},
	{RuleFeatureRemoved, Warn, "the tenant feature the command required is gone or another"},
	{RuleFeatureAdded, Info, "the command now requires a tenant feature"},
	{RuleSensitiveRemoved, High, "an input field is no longer declared sensitive (it would be logged and audited)"},
	{RuleSensitiveAdded, Info, "an input field is newly declared sensitive"},
	{RuleSoDRemoved, High, "the separation of duties is gone, or a command it conflicted with no longer does"},
	{RuleSoDChanged, Warn, "the separation of duties reads another subject field"},
	{RuleSoDAdded, Info, "a separation of duties, or a conflicting command, is added"},
	{RuleReversibleChanged, Warn, "`reversible` changes (either way)"},
	{RuleRecallChanged, Warn, "the command that undoes this one (`recall`) changes"},
	{RuleIdempotentChanged, Warn, "`idempotent` changes (either way): retries behave differently"},
	{RuleSideEffectsChanged, Warn, "the declared side effects differ (added or removed)"},
	{RuleSubjectChanged, Warn, "the subject field (what SoD and the audit trail key on) changes"},
	{RuleConditionRemoved, High, "a condition (by id) is gone"},
	{RuleConditionChanged, Warn, "a condition's expression, effect or any other part changes"},
	{RuleConditionAdded, Info, "a condition is added"},
	{RuleLimitRemoved, High, "a limit (by id) is gone: what it counted is no longer capped"},
	{RuleLimitLoosened, Warn, "a limit lets more through: `max` higher, `window` shorter, counted per a narrower party (`per` TENANT → USER → AGENT), or per value of a `group_field` where it was one ceiling; or past it a human is asked where the call was refused (`when_exhausted` REFUSE → ESCALATE)"},
	{RuleLimitChanged, Warn, "a limit counts something else, or changed in a way this version cannot rank: its `sum_field` (and with it what `max` counts), another `group_field`, a value or key this version does not know"},
	{RuleLimitTightened, Info, "a limit lets less through: `max` lower, `window` longer, counted per a wider party, as one ceiling where it was per group, or refused where a human was asked (ESCALATE → REFUSE)"},
	{RuleLimitAdded, Info, "a limit is added"},
	{RuleSchemaFieldAdded, Warn, "the input accepts a field it did not (`properties` gained a key)"},
	{RuleSchemaRequiredRemoved, Warn, "an input field is no longer required"},
	{RuleSchemaBoundRelaxed, Warn, "a bound is looser or gone: maxLength, maximum, exclusiveMaximum, maxItems, maxProperties higher; minLength, minimum, exclusiveMinimum, minItems, minProperties lower; multipleOf gone"},
	{RuleSchemaPatternChanged, Warn, "a pattern or format changed or is gone (whether it is wider cannot be told)"},
	{RuleSchemaEnumWidened, Warn, "an enum gained values or is gone, a const changed or is gone"},
	{RuleSchemaTypeWidened, Warn, "a type gained a member or is gone, an anyOf/oneOf gained a branch"},
	{RuleSchemaConstraintGone, Warn, "another constraint is gone: additionalProperties false, uniqueItems, an allOf branch, a subschema (items, propertyNames, …)"},
	{RuleSchemaChanged, Warn, "a schema keyword this version cannot rank changed (not, if/then/else, multipleOf changed, an unknown keyword)"},
	{RuleSchemaNarrowed, Info, "the input accepts less: a field removed, a field required, a bound tighter, a pattern, enum value or constraint added"},
	{RuleOutputSchemaChanged, Info, "the output schema differs"},
	{RuleDeadlineChanged, Info, "the declared deadline differs"},
	{RuleRPCChanged, Info, "the gRPC method or REST route the command binds to differs"},
	{RuleTextChanged, Info, "display name, agent or approver hint, description or examples differ (what agents and approvers read)"},
	{RuleCommandChanged, Warn, "a key of the command this version does not know differs: review it by hand"},
}

// Rules returns every rule, in the documented order.
func Rules() []Rule { return slices.Clone(rules) }

// ruleByID finds a rule.
func ruleByID(id string) (Rule, bool) {
	for _, r := range rules {
		if r.ID == id {
			return r, true
		}
	}
	return Rule{}, false
}

func ruleIDs() []string {
	ids := make([]string, len(rules))
	for i, r := range rules {
		ids[i] = r.ID
	}
	return ids
}
