package tests

import (
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/telemetry/telemetrytest"
)

// TestScenarioOneTraceAcrossServices: every process exports its spans to
// an in-process OTLP collector. One tools/call of finance-bot's refund,
// carrying a W3C traceparent in `_meta`, is confirmed by carol through MCP
// elicitation inside the call and runs: the bridge, the executor, confirm,
// audit and the helpdesk backend all report spans of that one trace, and
// the audit rows record its id.
func TestScenarioOneTraceAcrossServices(t *testing.T) {
	var collector telemetrytest.Collector
	collector.Start(t)
	tp := newTopology(t, topologyOptions{env: append(collector.Env(), "OTEL_BSP_SCHEDULE_DELAY=100")})

	traceID, parent := randomHex(t, 16), randomHex(t, 8)
	var form approveForm
	cs := tp.mcpSession(tp.token("acme", "carol", "finance-bot"), &mcp.ClientOptions{ElicitationHandler: form.handler})
	res := callTool(t, cs, "ticket.refund", refundInput, mcp.Meta{"traceparent": "00-" + traceID + "-" + parent + "-01"})
	if res.IsError {
		t.Fatalf("refund confirmed through elicitation was refused: %s", jsonOf(res.Content))
	}
	if len(form.shown) != 1 || !strings.Contains(form.shown[0], "ticket.refund") && !strings.Contains(form.shown[0], "Refund") {
		t.Fatalf("confirmation forms shown: %q", form.shown)
	}
	if strings.Contains(strings.Join(form.shown, ""), cardholderReference) {
		t.Fatal("the confirmation form shows the sensitive cardholder reference")
	}
	tp.wantRefunds(1, 2500)

	// The audit rows of the call record the trace and carol's approval.
	inv, _ := res.Meta["mandate.dev/invocation_id"].(string)
	rows := tp.invocationRows(inv, 2)
	outcome(t, rows, "executed", "", "")
	for _, r := range rows {
		if r.GetTraceId() != traceID || r.GetApproval().GetApprover() != "carol" || r.GetApproval().GetChannel() != "mcp_elicitation" {
			t.Fatalf("audit row %v; want trace %s approved by carol over mcp_elicitation", r, traceID)
		}
	}
	// The refusal that opened the challenge, inside the same call, too.
	required := tp.query(&mandatev1.QueryRequest{Command: "ticket.refund", Outcomes: []string{"refused"}})
	if len(required) != 1 || required[0].GetCode() != "confirmation.required" || required[0].GetTraceId() != traceID {
		t.Fatalf("confirmation.required rows: %v", required)
	}

	// Every process flushes its spans when it stops.
	tp.stop()
	spans := collector.Trace(traceID)
	want := []string{"mandate-audit", "mandate-confirm", "mandate-executor", "mandate-helpdesk", "mandate-mcpbridge"}
	if got := telemetrytest.Services(spans); !isSubset(want, got) {
		t.Fatalf("services in trace %s: %v, want at least %v (all services seen: %v)", traceID, got, want, telemetrytest.Services(collector.Spans()))
	}
	// The bridge's span is the child of the client's span, and the
	// backend's own RPC is in the trace.
	var rootChild, backend bool
	for _, s := range spans {
		rootChild = rootChild || (s.Service == "mandate-mcpbridge" && s.ParentSpanID == parent)
		backend = backend || (s.Service == "mandate-helpdesk" && s.Kind == "server" && strings.Contains(s.Name, "IssueRefund"))
	}
	if !rootChild || !backend {
		t.Fatalf("trace %s: bridge span child of the client's %v, helpdesk IssueRefund server span %v", traceID, rootChild, backend)
	}

	// … and its metrics: the executor counted the call that opened the
	// challenge and the confirmed one.
	metrics := collector.Metrics()
	for _, attrs := range []map[string]string{
		{"command": "ticket.refund", "channel": "mcp", "outcome": "refused", "stage": "confirmation_check", "code": "confirmation.required"},
		{"command": "ticket.refund", "channel": "mcp", "outcome": "executed"},
	} {
		if m, ok := telemetrytest.Last(metrics, "mandate-executor", "mandate.executor.calls", attrs); !ok || m.Value != 1 {
			t.Errorf("mandate.executor.calls%v from mandate-executor: %+v (found %v)", attrs, m, ok)
		}
	}
	// The audit service counted at least the refusal, intent and outcome rows it committed.
	if m, ok := telemetrytest.Last(metrics, "mandate-audit", "mandate.audit.records", map[string]string{"result": "committed"}); !ok || m.Value < 3 {
		t.Errorf("mandate.audit.records{result=committed} from mandate-audit: %+v (found %v)", m, ok)
	}
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func isSubset(want, got []string) bool {
	for _, w := range want {
		if !slices.Contains(got, w) {
			return false
		}
	}
	return true
}

// TestScenarioTraceWithoutACollector: with no OTLP endpoint anywhere, the
// services trace nothing (the no-op tracer provider) yet still carry a
// caller's trace through every hop: a tools/call whose `_meta` carries a
// W3C traceparent leaves intent and outcome rows, written by the executor
// through the audit service, that record the caller's trace id.
func TestScenarioTraceWithoutACollector(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	traceID, parent := randomHex(t, 16), randomHex(t, 8)
	cs := tp.mcpSession(tp.token("acme", "carol", "finance-bot"), nil)
	res := callTool(t, cs, "ticket.search", `{"query":"charged twice"}`, mcp.Meta{"traceparent": "00-" + traceID + "-" + parent + "-01"})
	if res.IsError {
		t.Fatalf("ticket.search refused: %s", jsonOf(res.Content))
	}
	inv, _ := res.Meta["mandate.dev/invocation_id"].(string)
	rows := tp.invocationRows(inv, 2)
	outcome(t, rows, "executed", "", "")
	for _, r := range rows {
		if r.GetTraceId() != traceID {
			t.Fatalf("%s row records trace %q, want the caller's %s", r.GetPhase(), r.GetTraceId(), traceID)
		}
	}
}
