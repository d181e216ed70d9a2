package manifestdiff

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Counts are the findings per severity.
type Counts struct {
	High int `json:"high"`
	Warn int `json:"warn"`
	Info int `json:"info"`
}

// Count counts findings by severity.
func Count(findings []Finding) Counts {
	var c Counts
	for _, f := range findings {
		switch f.Severity {
		case High:
			c.High++
		case Warn:
			c.Warn++
		case Info:
			c.Info++
		}
	}
	return c
}

// Failing counts the findings at or above threshold (0: none fail).
func Failing(findings []Finding, threshold Severity) int {
	n := 0
	for _, f := range findings {
		if threshold != 0 && f.Severity >= threshold {
			n++
		}
	}
	return n
}

// WriteText writes one line per finding:
//
//	high  risk.lowered  ticket.refund  /risk  "L3" → "L2"  the risk is lower
//
// Values are compact JSON ("-" when absent), long ones shortened; an
// overridden finding ends with its default severity and the reason.
func WriteText(w io.Writer, findings []Finding) error {
	for _, f := range findings {
		line := fmt.Sprintf("%-4s  %s  %s  %s  %s → %s  %s", f.Severity, f.Rule, f.Command, pathOrDash(f.Path), short(f.Old), short(f.New), f.Message)
		if f.Override != nil {
			line += fmt.Sprintf(" [overridden from %s: %s]", f.Override.Default, f.Override.Reason)
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

func pathOrDash(p string) string {
	if p == "" {
		return "/"
	}
	return p
}

const maxValue = 80

func short(v any) string {
	if v == nil {
		return "-"
	}
	s := encode(v)
	if r := []rune(s); len(r) > maxValue {
		s = string(r[:maxValue-1]) + "…"
	}
	return strings.ReplaceAll(s, "\n", " ")
}

// Report is the --json output.
type Report struct {
	Old      string    `json:"old"`
	New      string    `json:"new"`
	FailOn   string    `json:"fail_on"`
	Failed   bool      `json:"failed"`
	Counts   Counts    `json:"counts"`
	Findings []Finding `json:"findings"`
	// UnusedOverrides are override entries that matched no finding.
	UnusedOverrides []Override `json:"unused_overrides,omitempty"`
}

// WriteJSON writes the report, indented.
func WriteJSON(w io.Writer, r Report) error {
	if r.Findings == nil {
		r.Findings = []Finding{}
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
