// Package tooldesc projects manifest commands into MCP tool descriptors. The
// projection is a pure function of the command: the same manifest always
// gives the same tools, whoever asks; filtering per principal happens
// elsewhere (the catalog).
package tooldesc

import (
	"encoding/json"
	"strings"

	"github.com/mandate-dev/mandate/internal/manifest"
)

// MetaPrefix prefixes every Mandate key in a tool's `_meta`, as it does
// every other `_meta` key Mandate defines.
const MetaPrefix = "mandate.dev/"

// The keys of a tool's `_meta`. Keys whose value would be empty (a command
// without recall or required feature) are left out rather than set to "".
const (
	// MetaRisk is the declared risk, "L0" … "L4".
	MetaRisk = MetaPrefix + "risk"
	// MetaIdempotent is the declaration's idempotent.
	MetaIdempotent = MetaPrefix + "idempotent"
	// MetaReversible is the declaration's reversible.
	MetaReversible = MetaPrefix + "reversible"
	// MetaRecall is the code of the command that undoes this one; absent
	// when none is declared.
	MetaRecall = MetaPrefix + "recall"
	// MetaSideEffects lists the declared side effects ([] for none).
	MetaSideEffects = MetaPrefix + "side_effects"
	// MetaPermissions lists the permissions a caller needs ([] for any
	// authenticated principal of the tenant).
	MetaPermissions = MetaPrefix + "permissions"
	// MetaConfirmationRequired says whether a human must confirm a call in
	// this deployment: the declaration's own requirement, or declared side
	// effects under Options.ConfirmSideEffects.
	MetaConfirmationRequired = MetaPrefix + "confirmation_required"
	// MetaRequiredFeature is the tenant feature that gates the command;
	// absent when none is required.
	MetaRequiredFeature = MetaPrefix + "required_feature"
	// MetaSensitiveFields lists the JSON pointers of the sensitive input
	// fields ([] for none).
	MetaSensitiveFields = MetaPrefix + "sensitive_fields"
	// MetaConditions lists the declared conditions, each as {id, effect,
	// description}; absent when none is declared. The expressions stay in
	// the manifest: an agent reads when a human is asked, in words.
	MetaConditions = MetaPrefix + "conditions"
	// MetaLimits lists the declared limits, each as {id, per, window,
	// max, sum_field, group_field, when_exhausted, description}; absent
	// when none is declared.
	MetaLimits = MetaPrefix + "limits"
)

// Condition is one declared condition as a tool's `_meta` lists it.
type Condition struct {
	ID          string `json:"id"`
	Effect      string `json:"effect"`
	Description string `json:"description"`
}

// conditionWords says, in words, when the declared conditions ask a human
// or refuse, and the declared limits, for the tool's description; "" with
// neither.
func conditionWords(c *manifest.Command) string {
	var ask, deny []string
	for _, cd := range c.Conditions {
		switch cd.Effect {
		case "REQUIRE_CONFIRMATION":
			ask = append(ask, cd.Description)
		case "DENY":
			deny = append(deny, cd.Description)
		}
	}
	var b strings.Builder
	if len(ask) > 0 {
		b.WriteString(" When a human is asked: " + strings.Join(ask, "; ") + ".")
	}
	if len(deny) > 0 {
		b.WriteString(" Refused: " + strings.Join(deny, "; ") + ".")
	}
	if len(c.Limits) > 0 {
		limits := make([]string, len(c.Limits))
		for i, l := range c.Limits {
			limits[i] = l.Describe()
		}
		b.WriteString(" Limits: " + strings.Join(limits, "; ") + ".")
	}
	return b.String()
}

// Options are the deployment's settings a descriptor states. They must be
// the executor's: a descriptor that promised less confirmation than the
// executor demands would mislead the agent and its user.
type Options struct {
	// ConfirmSideEffects is the deployment's --confirm-side-effects (the
	// executor's Config.ConfirmSideEffects): every command with declared
	// side effects requires confirmation.
	ConfirmSideEffects bool
}

// ConfirmationRequired reports whether a call of c waits for a human in a
// deployment with options o. It is the executor's rule.
// A command whose declared conditions ask a human only for some calls
// (CONFIRMATION_CONDITIONAL) reports false: the description and
// MetaConditions say when.
func (o Options) ConfirmationRequired(c *manifest.Command) bool {
	return c.ConfirmationRequired || (o.ConfirmSideEffects && len(c.SideEffects) > 0)
}

// Tool is an MCP tool descriptor (the `Tool` object of tools/list).
type Tool struct {
	Name         string          `json:"name"`
	Title        string          `json:"title"`
	Description  string          `json:"description"`
	InputSchema  json.RawMessage `json:"inputSchema"`
	OutputSchema json.RawMessage `json:"outputSchema"`
	Annotations  Annotations     `json:"annotations"`
	// Meta carries the declaration under the Meta* keys (`mandate.dev/…`):
	// risk, idempotent, reversible, recall, side_effects, permissions,
	// confirmation_required, required_feature, sensitive_fields.
	Meta map[string]any `json:"_meta"`
}

// Annotations are the standard MCP behaviour hints. Every hint is set
// explicitly: the MCP defaults (destructive and open-world when unset) must
// never decide what a client shows.
type Annotations struct {
	Title           string `json:"title"`
	ReadOnlyHint    bool   `json:"readOnlyHint"`
	DestructiveHint bool   `json:"destructiveHint"`
	IdempotentHint  bool   `json:"idempotentHint"`
	OpenWorldHint   bool   `json:"openWorldHint"`
}

// FromCommand returns the MCP tool descriptor of a command in a deployment
// with options o.
//
//   - readOnlyHint: risk L0 and no side effects;
//   - destructiveHint: not read-only, not reversible, and either side
//     effects or risk L3+ (an irreversible change);
//   - idempotentHint: the declaration's idempotent;
//   - openWorldHint: the command reaches systems outside its own records
//     (declared side effects).
func FromCommand(c *manifest.Command, o Options) Tool {
	readOnly := c.ReadOnly()
	destructive := !readOnly && !c.Reversible && (len(c.SideEffects) > 0 || manifest.RiskLevel(c.Risk) >= 3)
	title := c.DisplayName
	if title == "" {
		title = c.Code
	}
	meta := map[string]any{
		MetaRisk:                 c.Risk,
		MetaIdempotent:           c.Idempotent,
		MetaReversible:           c.Reversible,
		MetaSideEffects:          orEmpty(c.SideEffects),
		MetaPermissions:          orEmpty(c.Permissions),
		MetaConfirmationRequired: o.ConfirmationRequired(c),
		MetaSensitiveFields:      orEmpty(c.SensitiveFields),
	}
	if c.Recall != "" {
		meta[MetaRecall] = c.Recall
	}
	if c.RequiredFeature != "" {
		meta[MetaRequiredFeature] = c.RequiredFeature
	}
	if len(c.Conditions) > 0 {
		conds := make([]Condition, len(c.Conditions))
		for i, cd := range c.Conditions {
			conds[i] = Condition{ID: cd.ID, Effect: cd.Effect, Description: cd.Description}
		}
		meta[MetaConditions] = conds
	}
	if len(c.Limits) > 0 {
		meta[MetaLimits] = c.Limits
	}
	return Tool{
		Name:         c.Code,
		Title:        title,
		Description:  title + " — " + c.AgentHint + conditionWords(c),
		InputSchema:  c.InputSchema,
		OutputSchema: c.OutputSchema,
		Annotations: Annotations{
			Title:           title,
			ReadOnlyHint:    readOnly,
			DestructiveHint: destructive,
			IdempotentHint:  c.Idempotent,
			OpenWorldHint:   len(c.SideEffects) > 0,
		},
		Meta: meta,
	}
}

// FromSet returns the descriptors of every published command of s in a
// deployment with options o, sorted by name.
func FromSet(s *manifest.Set, o Options) []Tool {
	cmds := s.Commands()
	out := make([]Tool, 0, len(cmds))
	for _, c := range cmds {
		if c.Published() {
			out = append(out, FromCommand(c, o))
		}
	}
	return out
}

func orEmpty(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}
