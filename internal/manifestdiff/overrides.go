package manifestdiff

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"

	"github.com/mandate-dev/mandate/internal/suggest"
)

// Overrides change the severity of findings, as an overrides file says:
//
//	overrides:
//	  - rule: confirmation.loosened      # a rule id (required)
//	    command: ticket.refund           # only this command (optional)
//	    severity: info                   # high, warn, info or ignore
//	    reason: the refund asks a human above 20.00 EUR (issue 29)
//
// An entry naming a command wins over one for the rule alone.
type Overrides struct {
	entries []Override
}

// Override is one entry of an overrides file.
type Override struct {
	Rule    string `yaml:"rule" json:"rule"`
	Command string `yaml:"command" json:"command,omitempty"`
	// Severity is "high", "warn", "info" or "ignore".
	Severity string `yaml:"severity" json:"severity"`
	Reason   string `yaml:"reason" json:"reason"`
	// Line is where the entry starts in the file.
	Line int `yaml:"-" json:"line"`
}

// Ignore is the override severity that drops a finding.
const Ignore = "ignore"

// ParseOverrides reads an overrides file (YAML). Unknown keys, unknown
// rule ids, a severity other than high, warn, info or ignore, an entry
// without a reason and two entries for the same rule and command are
// refused, naming the line.
func ParseOverrides(name string, src []byte) (*Overrides, error) {
	fail := func(line int, format string, args ...any) (*Overrides, error) {
		return nil, fmt.Errorf("%w: %s:%d: %s", ErrInput, name, line, fmt.Sprintf(format, args...))
	}
	var doc struct {
		Overrides []yaml.Node `yaml:"overrides"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %s: %w", ErrInput, name, err)
	}
	o := &Overrides{}
	seen := map[[2]string]int{}
	for _, n := range doc.Overrides {
		if n.Kind != yaml.MappingNode {
			return fail(n.Line, "an override is a mapping with rule, command, severity and reason")
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i].Value; k != "rule" && k != "command" && k != "severity" && k != "reason" {
				return fail(n.Content[i].Line, "unknown key %q (want rule, command, severity, reason)", k)
			}
		}
		var e Override
		if err := n.Decode(&e); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInput, name, err)
		}
		e.Line = n.Line
		if _, ok := ruleByID(e.Rule); !ok {
			hint := ""
			if s := suggest.Nearest(e.Rule, ruleIDs(), 3); s != "" {
				hint = fmt.Sprintf(" (did you mean %q?)", s)
			}
			return fail(n.Line, "unknown rule %q%s", e.Rule, hint)
		}
		if e.Severity != Ignore {
			if _, err := ParseSeverity(e.Severity); err != nil {
				return fail(n.Line, "severity %q: want high, warn, info or ignore", e.Severity)
			}
		}
		if e.Reason == "" {
			return fail(n.Line, "the override of %s has no reason: say why the change is accepted", e.Rule)
		}
		key := [2]string{e.Rule, e.Command}
		if first, dup := seen[key]; dup {
			return fail(n.Line, "%s%s is overridden twice (first at line %d)", e.Rule, forCommand(e.Command), first)
		}
		seen[key] = n.Line
		o.entries = append(o.entries, e)
	}
	return o, nil
}

func forCommand(c string) string {
	if c == "" {
		return ""
	}
	return " for " + c
}

// Apply returns the findings with their severities overridden (ignored
// ones dropped), and the entries that matched no finding, so that an
// accepted change that is no longer there can be removed from the file.
func (o *Overrides) Apply(findings []Finding) (kept []Finding, unused []Override) {
	if o == nil {
		return findings, nil
	}
	used := make([]bool, len(o.entries))
	for _, f := range findings {
		i := o.match(f)
		if i < 0 {
			kept = append(kept, f)
			continue
		}
		used[i] = true
		e := o.entries[i]
		if e.Severity == Ignore {
			continue
		}
		s, _ := ParseSeverity(e.Severity)
		f.Override = &Applied{Default: f.Severity, Reason: e.Reason}
		f.Severity = s
		kept = append(kept, f)
	}
	for i, e := range o.entries {
		if !used[i] {
			unused = append(unused, e)
		}
	}
	return kept, unused
}

// match returns the entry that applies to f: the one for its rule and
// command, else the one for its rule alone; -1 for none.
func (o *Overrides) match(f Finding) int {
	ruleOnly := -1
	for i, e := range o.entries {
		if e.Rule != f.Rule {
			continue
		}
		if e.Command == f.Command {
			return i
		}
		if e.Command == "" {
			ruleOnly = i
		}
	}
	return ruleOnly
}
