package catalog

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/tooldesc"
)

// Severity grades a finding.
type Severity int

// Severities, least serious first.
const (
	// SeverityInfo is worth knowing; nothing is unsafe.
	SeverityInfo Severity = iota + 1
	// SeverityWarning weakens a guarantee: fix it or accept it knowingly.
	SeverityWarning
	// SeverityCritical breaks a guarantee users rely on: fix it.
	SeverityCritical
)

// String returns "info", "warning" or "critical".
func (s Severity) String() string {
	switch s {
	case SeverityInfo:
		return "info"
	case SeverityWarning:
		return "warning"
	case SeverityCritical:
		return "critical"
	}
	return "unknown"
}

// Finding is one observation of the review about one command.
type Finding struct {
	// Rule is the stable rule id, e.g. REVIEW001.
	Rule string
	// Severity is the rule's severity.
	Severity Severity
	// Command is the code of the command the finding is about.
	Command string
	// Explanation says in one sentence what is wrong and why it matters.
	Explanation string
}

// Rule describes one review rule.
type Rule struct {
	// ID is the stable rule id.
	ID string
	// Severity of every finding of the rule.
	Severity Severity
	// Summary says what the rule flags.
	Summary string
}

// Rule ids. They are stable: dashboards and suppressions key on them. Rules
// holds each one's severity and summary.
const (
	// RuleSensitiveArgument: an agent-visible tool takes a sensitive argument.
	RuleSensitiveArgument = "REVIEW001"
	// RuleOpenSideEffects: side effects callable without any permission.
	RuleOpenSideEffects = "REVIEW002"
	// RuleRecallNarrower: the recall needs more than the command it undoes.
	RuleRecallNarrower = "REVIEW003"
	// RuleIrreversibleLowRisk: irreversible side effects graded below L3.
	RuleIrreversibleLowRisk = "REVIEW004"
	// RuleSelfApprovedL4: an L4 confirmation the requester approves alone.
	RuleSelfApprovedL4 = "REVIEW005"
	// RuleRecallUncallable: the recall is missing or not published.
	RuleRecallUncallable = "REVIEW006"
	// RuleOpenWrite: a state change callable without any permission.
	RuleOpenWrite = "REVIEW007"
	// RuleDeprecatedListed: a deprecated command is still listed.
	RuleDeprecatedListed = "REVIEW008"
	// RuleUngatedHighRisk: an L3+ command without a required feature.
	RuleUngatedHighRisk = "REVIEW009"
	// RuleNoExamples: a command without example inputs.
	RuleNoExamples = "REVIEW010"
	// RuleHintOmitsRecall: the agent hint does not name the recall.
	RuleHintOmitsRecall = "REVIEW011"
)

// Rules lists every review rule, by id. Only published (and deprecated)
// commands are reviewed: drafts are neither listed nor callable.
var Rules = []Rule{
	{RuleSensitiveArgument, SeverityWarning, "an agent-visible tool takes a sensitive argument, so its value passes through the model's context"},
	{RuleOpenSideEffects, SeverityCritical, "a command with side effects declares no permission, so any authenticated principal can cause them"},
	{RuleRecallNarrower, SeverityWarning, "a reversible command's recall needs a permission or feature the command does not, so not every caller can undo it"},
	{RuleIrreversibleLowRisk, SeverityWarning, "an irreversible command with side effects is graded below L3"},
	{RuleSelfApprovedL4, SeverityWarning, "an L4 command needing confirmation lets the requesting user approve their own call"},
	{RuleRecallUncallable, SeverityCritical, "a reversible command's recall is missing from the manifest or not published, so nothing can undo it"},
	{RuleOpenWrite, SeverityWarning, "a command that changes state declares no permission, so any authenticated principal can call it"},
	{RuleDeprecatedListed, SeverityInfo, "a deprecated command is still listed and callable"},
	{RuleUngatedHighRisk, SeverityInfo, "an L3 or L4 command has no required feature, so it cannot be withheld from a tenant"},
	{RuleNoExamples, SeverityInfo, "a command declares no example input"},
	{RuleHintOmitsRecall, SeverityInfo, "a reversible command's agent hint does not name its recall command"},
}

func severityOf(rule string) Severity {
	for _, r := range Rules {
		if r.ID == rule {
			return r.Severity
		}
	}
	return SeverityInfo
}

// Review returns the findings over m's published commands in a deployment
// with options o, sorted most severe first, then by rule id, then by
// command code. It is a pure, deterministic function of m and o.
func Review(m *manifest.Manifest, o tooldesc.Options) []Finding {
	byCode := map[string]*manifest.Command{}
	for _, c := range m.Commands {
		byCode[c.Code] = c
	}
	var out []Finding
	add := func(rule string, c *manifest.Command, format string, args ...any) {
		out = append(out, Finding{Rule: rule, Severity: severityOf(rule), Command: c.Code, Explanation: fmt.Sprintf(format, args...)})
	}
	for _, c := range m.Commands {
		if !c.Published() {
			continue
		}
		level := manifest.RiskLevel(c.Risk)
		if len(c.SensitiveFields) > 0 {
			add(RuleSensitiveArgument, c, "%s takes the sensitive argument%s %s as an agent-visible tool, so the value passes through the model's context; prefer a reference the backend resolves.",
				c.Code, plural(len(c.SensitiveFields)), strings.Join(c.SensitiveFields, ", "))
		}
		switch {
		case len(c.Permissions) == 0 && len(c.SideEffects) > 0:
			add(RuleOpenSideEffects, c, "%s has side effects (%s) but declares no permission, so any authenticated principal of the tenant, or its agent, can cause them.",
				c.Code, strings.Join(c.SideEffects, ", "))
		case len(c.Permissions) == 0 && level >= 1:
			add(RuleOpenWrite, c, "%s changes state (risk %s) but declares no permission, so any authenticated principal of the tenant, or its agent, can call it.", c.Code, c.Risk)
		}
		if c.Reversible {
			reviewRecall(c, byCode[c.Recall], add)
		}
		if !c.Reversible && len(c.SideEffects) > 0 && level >= 0 && level < 3 {
			add(RuleIrreversibleLowRisk, c, "%s cannot be undone and has side effects (%s) but is graded %s, while irreversible effects outside its own records usually warrant L3 or higher.",
				c.Code, strings.Join(c.SideEffects, ", "), c.Risk)
		}
		if level == 4 && o.ConfirmationRequired(c) && c.Approver.Kind != "PERMISSION_HOLDER" {
			add(RuleSelfApprovedL4, c, "%s is L4 and needs confirmation, but its approver policy lets the requesting user approve their own call, so no second person checks it.", c.Code)
		}
		if c.Lifecycle == "DEPRECATED" {
			add(RuleDeprecatedListed, c, "%s is deprecated but still listed and callable; remove it once its callers have moved.", c.Code)
		}
		if level >= 3 && c.RequiredFeature == "" {
			add(RuleUngatedHighRisk, c, "%s is %s but has no required feature, so every tenant has it and it cannot be withheld from one without a new build.", c.Code, c.Risk)
		}
		if len(c.Examples) == 0 {
			add(RuleNoExamples, c, "%s declares no example input, so agents and reviewers have no validated call to start from.", c.Code)
		}
	}
	slices.SortFunc(out, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(b.Severity, a.Severity), cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Command, b.Command))
	})
	return out
}

// reviewRecall checks that whoever may run c may also undo it with its
// recall, and that the agent is told how.
func reviewRecall(c, recall *manifest.Command, add func(rule string, c *manifest.Command, format string, args ...any)) {
	if recall == nil || !recall.Published() {
		state := "is not in the manifest"
		if recall != nil {
			state = "is a draft"
		}
		name := c.Recall
		if name == "" {
			name = "(none declared)"
		}
		add(RuleRecallUncallable, c, "%s is declared reversible, but its recall %s %s, so nothing can undo it.", c.Code, name, state)
		return
	}
	var extra []string
	for _, p := range recall.Permissions {
		if !slices.Contains(c.Permissions, p) {
			extra = append(extra, "permission "+p)
		}
	}
	if recall.RequiredFeature != "" && recall.RequiredFeature != c.RequiredFeature {
		extra = append(extra, "feature "+recall.RequiredFeature)
	}
	if len(extra) > 0 {
		add(RuleRecallNarrower, c, "%s is undone by %s, which also needs %s, so some callers of %s cannot undo it.",
			c.Code, recall.Code, strings.Join(extra, " and "), c.Code)
	}
	if !strings.Contains(c.AgentHint, recall.Code) {
		add(RuleHintOmitsRecall, c, "%s is reversible through %s, but its agent hint does not say so, so an agent may not offer the undo.", c.Code, recall.Code)
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// ToPrompt renders the review of m in a deployment with options o as a
// prompt a model can narrate for an operator. It is a pure function of m
// and o: the same manifest and options always give the same bytes. Only structured declarations (codes, risks, side effects,
// permissions, features, recall) and the findings go in; free text written
// in the protos (hints, descriptions, display names) stays out, so the
// narration cannot be steered by it.
func ToPrompt(m *manifest.Manifest, o tooldesc.Options) string {
	findings := Review(m, o)
	var b strings.Builder
	b.WriteString(`You are narrating a governance review of the command catalog of a Mandate deployment for its operators.
Mandate turns gRPC methods into tools that AI agents call on behalf of users. Every command declares its risk (L0 read-only, L1 low-impact write, L2 recoverable business change, L3 money or customer-visible effect, L4 irreversible and high impact), its side effects outside its own records, the permissions a caller needs, the tenant feature that gates it, and whether a recall command can undo it.

Instructions:
- Narrate the findings below in plain language, most severe first.
- For each finding, name the command, say why it matters, and say which declaration change would address it.
- Use only the facts in this prompt. Do not invent findings, commands, permissions or fixes, and do not soften critical findings.
- If there are no findings, say so in one sentence.

`)
	var published, drafts, deprecated int
	for _, c := range m.Commands {
		switch {
		case c.Lifecycle == "DEPRECATED":
			deprecated++
		case c.Published():
			published++
		default:
			drafts++
		}
	}
	fmt.Fprintf(&b, "Manifest: %s\n", orNone(m.Digest))
	fmt.Fprintf(&b, "Commands: %d (%d published, %d deprecated, %d draft)\n", len(m.Commands), published, deprecated, drafts)
	if o.ConfirmSideEffects {
		b.WriteString("Deployment: --confirm-side-effects is on, so every command with declared side effects requires confirmation.\n")
	}
	b.WriteString("\n")

	b.WriteString("Declarations:\n")
	cmds := slices.Clone(m.Commands)
	slices.SortFunc(cmds, func(a, b *manifest.Command) int { return cmp.Compare(a.Code, b.Code) })
	if len(cmds) == 0 {
		b.WriteString("- none\n")
	}
	for _, c := range cmds {
		fmt.Fprintf(&b, "- %s: %s, risk %s, side effects %s, permissions %s, feature %s, %s, confirmation %s, approver %s\n",
			c.Code, strings.ToLower(orNone(c.Lifecycle)), orNone(c.Risk), list(c.SideEffects), list(c.Permissions),
			orNone(c.RequiredFeature), reversibility(c), required(o.ConfirmationRequired(c)), approver(c.Approver))
	}

	counts := map[Severity]int{}
	for _, f := range findings {
		counts[f.Severity]++
	}
	fmt.Fprintf(&b, "\nFindings (%d: %d critical, %d warning, %d info):\n",
		len(findings), counts[SeverityCritical], counts[SeverityWarning], counts[SeverityInfo])
	if len(findings) == 0 {
		b.WriteString("- none\n")
	}
	for i, f := range findings {
		fmt.Fprintf(&b, "%d. [%s] %s %s: %s\n", i+1, f.Severity, f.Rule, f.Command, f.Explanation)
	}

	b.WriteString("\nRules:\n")
	for _, r := range Rules {
		fmt.Fprintf(&b, "- %s (%s): %s\n", r.ID, r.Severity, r.Summary)
	}
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func list(v []string) string {
	if len(v) == 0 {
		return "none"
	}
	return strings.Join(v, " + ")
}

func reversibility(c *manifest.Command) string {
	switch {
	case c.ReadOnly():
		return "read-only"
	case c.Reversible:
		return "reversible by " + orNone(c.Recall)
	}
	return "irreversible"
}

func required(b bool) string {
	if b {
		return "required"
	}
	return "not required"
}

func approver(a manifest.Approver) string {
	if a.Kind == "PERMISSION_HOLDER" {
		return "another user holding " + orNone(a.Permission)
	}
	return "the requesting user"
}
