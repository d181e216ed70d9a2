package outbox

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/mandate-dev/mandate/services/executor"
)

// CloudEvents attributes of the events the relay publishes.
const (
	// SpecVersion is the CloudEvents version of the envelope.
	SpecVersion = "1.0"
	// TypeExecuted is the type of the event of a command that executed.
	TypeExecuted = "dev.mandate.command.executed.v1"
	// ContentType is the content type of a structured-mode message.
	ContentType = "application/cloudevents+json"
	// OutcomeExecuted is the outcome the outbox holds events for: only executed commands
	// publish one.
	OutcomeExecuted = "executed"
)

// CloudEvent is the structured-mode JSON of one domain event. The mandate* members are
// CloudEvents extension attributes, so that routers can filter without reading data.
type CloudEvent struct {
	SpecVersion     string    `json:"specversion"`
	ID              string    `json:"id"`
	Source          string    `json:"source"`
	Type            string    `json:"type"`
	Subject         string    `json:"subject,omitempty"`
	Time            time.Time `json:"time"`
	DataContentType string    `json:"datacontenttype"`
	Tenant          string    `json:"mandatetenant"`
	Command         string    `json:"mandatecommand"`
	Seq             int64     `json:"mandateseq"`
	Data            Data      `json:"data"`
}

// Data is the event's payload: who did what, through which agent, and the result's
// non-sensitive fields (the executor withholds sensitive ones before the event is stored).
type Data struct {
	Tenant       string `json:"tenant"`
	Command      string `json:"command"`
	Subject      string `json:"subject,omitempty"`
	InvocationID string `json:"invocation_id"`
	Seq          int64  `json:"seq"`
	User         string `json:"user"`
	Agent        string `json:"agent,omitempty"`
	Outcome      string `json:"outcome"`
	// Result is the command's output as JSON, sensitive fields withheld; absent when the
	// stored result is not JSON.
	Result json.RawMessage `json:"result,omitempty"`
}

// Envelope returns e as a CloudEvent.
func Envelope(e executor.Event) CloudEvent {
	var result json.RawMessage
	if len(e.Result) > 0 && json.Valid(e.Result) {
		result = json.RawMessage(e.Result)
	}
	return CloudEvent{
		SpecVersion: SpecVersion, ID: e.InvocationID, Source: Source(e.Tenant), Type: TypeExecuted,
		Subject: e.Subject, Time: e.Time.UTC(), DataContentType: "application/json",
		Tenant: e.Tenant, Command: e.Command, Seq: e.Seq,
		Data: Data{Tenant: e.Tenant, Command: e.Command, Subject: e.Subject, InvocationID: e.InvocationID, Seq: e.Seq,
			User: e.UserID, Agent: e.AgentID, Outcome: OutcomeExecuted, Result: result},
	}
}

// Source is the CloudEvents source of tenant's executor events.
func Source(tenant string) string { return "mandate://" + url.PathEscape(tenant) + "/executor" }

// Subject is the NATS subject of command's events in tenant under prefix:
// prefix.tenant.command-tokens.
func Subject(prefix, tenant, command string) string {
	parts := []string{prefix, Token(tenant)}
	for c := range strings.SplitSeq(command, ".") {
		parts = append(parts, Token(c))
	}
	return strings.Join(parts, ".")
}

// TenantFilter is the subject filter of every event of tenant under prefix.
func TenantFilter(prefix, tenant string) string { return prefix + "." + Token(tenant) + ".>" }

// Token makes s one NATS subject token: '.', '*', '>', '%', whitespace, controls and
// non-ASCII bytes are percent-encoded, so distinct inputs stay distinct. An empty s (which
// the store never holds) becomes "_", so the subject keeps its shape.
func Token(s string) string {
	if s == "" {
		return "_"
	}
	var b strings.Builder
	for i := range len(s) {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '.' || c == '*' || c == '>' || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
