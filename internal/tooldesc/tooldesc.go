// Package tooldesc projects manifest commands into MCP tool descriptors. The
// projection is a pure function of the command: the same manifest always
// gives the same tools, whoever asks; filtering per principal happens
// elsewhere (the catalog).
package tooldesc

import (
	"encoding/json"

	"github.com/mandate-dev/mandate/internal/manifest"
)

// MetaPrefix prefixes every Mandate key in a tool's `_meta`.
const MetaPrefix = "mandate/"

// Tool is an MCP tool descriptor (the `Tool` object of tools/list).
type Tool struct {
	Name         string          `json:"name"`
	Title        string          `json:"title"`
	Description  string          `json:"description"`
	InputSchema  json.RawMessage `json:"inputSchema"`
	OutputSchema json.RawMessage `json:"outputSchema"`
	Annotations  Annotations     `json:"annotations"`
	// Meta carries the declaration under `mandate/…` keys: risk, idempotent,
	// reversible, recall, side_effects, permissions, confirmation_required,
	// required_feature, sensitive_fields.
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

// FromCommand returns the MCP tool descriptor of a command.
//
//   - readOnlyHint: risk L0 and no side effects;
//   - destructiveHint: not read-only, not reversible, and either side
//     effects or risk L3+ (an irreversible change);
//   - idempotentHint: the declaration's idempotent;
//   - openWorldHint: the command reaches systems outside its own records
//     (declared side effects).
func FromCommand(c *manifest.Command) Tool {
	readOnly := c.ReadOnly()
	destructive := !readOnly && !c.Reversible && (len(c.SideEffects) > 0 || manifest.RiskLevel(c.Risk) >= 3)
	title := c.DisplayName
	if title == "" {
		title = c.Code
	}
	return Tool{
		Name:         c.Code,
		Title:        title,
		Description:  title + " — " + c.AgentHint,
		InputSchema:  c.InputSchema,
		OutputSchema: c.OutputSchema,
		Annotations: Annotations{
			Title:           title,
			ReadOnlyHint:    readOnly,
			DestructiveHint: destructive,
			IdempotentHint:  c.Idempotent,
			OpenWorldHint:   len(c.SideEffects) > 0,
		},
		Meta: map[string]any{
			MetaPrefix + "risk":                  c.Risk,
			MetaPrefix + "idempotent":            c.Idempotent,
			MetaPrefix + "reversible":            c.Reversible,
			MetaPrefix + "recall":                c.Recall,
			MetaPrefix + "side_effects":          orEmpty(c.SideEffects),
			MetaPrefix + "permissions":           orEmpty(c.Permissions),
			MetaPrefix + "confirmation_required": c.ConfirmationRequired,
			MetaPrefix + "required_feature":      c.RequiredFeature,
			MetaPrefix + "sensitive_fields":      orEmpty(c.SensitiveFields),
		},
	}
}

// FromSet returns the descriptors of every published command of s, sorted
// by name.
func FromSet(s *manifest.Set) []Tool {
	cmds := s.Commands()
	out := make([]Tool, 0, len(cmds))
	for _, c := range cmds {
		if c.Published() {
			out = append(out, FromCommand(c))
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
