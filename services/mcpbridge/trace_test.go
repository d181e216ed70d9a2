package mcpbridge_test

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

var (
	recorderOnce sync.Once
	recorder     *tracetest.SpanRecorder
	recording    atomic.Bool
)

// recordingSampler samples every span while a test records and none
// otherwise, so that the tests and benchmarks that run later in the binary
// do not pay for (or fill memory with) recorded spans.
type recordingSampler struct{}

func (recordingSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if recording.Load() {
		return sdktrace.AlwaysSample().ShouldSample(p)
	}
	return sdktrace.NeverSample().ShouldSample(p)
}

func (recordingSampler) Description() string { return "recording while a test asks" }

// spans records every span in memory until the test ends. The provider is
// installed once per test binary: the packages' tracers (otel.Tracer at
// init) delegate to the first provider set globally.
func spans(t *testing.T) *tracetest.SpanRecorder {
	recorderOnce.Do(func() {
		recorder = tracetest.NewSpanRecorder()
		otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSampler(recordingSampler{}), sdktrace.WithSpanProcessor(recorder)))
	})
	recording.Store(true)
	t.Cleanup(func() { recording.Store(false) })
	return recorder
}

// TestTraceparentFromMeta: a tools/call's `_meta` traceparent (and
// tracestate) parents the bridge's tools/call span, whose child is the
// executor's; the audit rows carry the client's trace id.
func TestTraceparentFromMeta(t *testing.T) {
	rec := spans(t)
	st := newHelpdeskStack(t)
	cs, _ := st.client(t, token(t, "acme", "alice", "support-bot"), clientOptions{})
	const (
		traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
		parentID = "00f067aa0ba902b7"
	)
	res, err := call(t, cs, "ticket.search", `{"query":"refund"}`, mcp.Meta{
		mcpbridge.MetaTraceparent: "00-" + traceID + "-" + parentID + "-01",
		mcpbridge.MetaTracestate:  "vendor=opaque",
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("refused: %+v", refusalOf(t, res))
	}
	inv := invocationOf(t, res)
	rows := st.rows(t, "acme", inv, 2)
	for _, r := range rows {
		if r.TraceID != traceID {
			t.Fatalf("%s row trace id %q, want %s", r.Phase, r.TraceID, traceID)
		}
	}

	var toolsCall, execute sdktrace.ReadOnlySpan
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID().String() != traceID {
			continue
		}
		byID[s.SpanContext().SpanID()] = s
		switch s.Name() {
		case "tools/call ticket.search":
			toolsCall = s
		case "mandate.execute":
			execute = s
		}
	}
	if toolsCall == nil || execute == nil {
		t.Fatalf("spans of trace %s: tools/call %v, mandate.execute %v", traceID, toolsCall != nil, execute != nil)
	}
	if !toolsCall.Parent().IsRemote() || toolsCall.Parent().SpanID().String() != parentID || toolsCall.SpanContext().TraceState().Get("vendor") != "opaque" {
		t.Fatalf("tools/call span parent %v, tracestate %q", toolsCall.Parent(), toolsCall.SpanContext().TraceState().String())
	}
	// The bridge calls ExecutorService.Execute: the RPC's client span is
	// the tools/call span's child, its server span the client span's, and
	// mandate.execute the server span's.
	const rpc = "mandate.v1.ExecutorService/Execute"
	server, client := byID[execute.Parent().SpanID()], sdktrace.ReadOnlySpan(nil)
	if server != nil {
		client = byID[server.Parent().SpanID()]
	}
	if server == nil || server.Name() != rpc || server.SpanKind() != trace.SpanKindServer ||
		client == nil || client.Name() != rpc || client.SpanKind() != trace.SpanKindClient ||
		client.Parent().SpanID() != toolsCall.SpanContext().SpanID() {
		t.Fatalf("mandate.execute does not descend from the tools/call span %s through the Execute RPC (parent %s)",
			toolsCall.SpanContext().SpanID(), execute.Parent().SpanID())
	}

	// A malformed traceparent is refused at request_check, and the
	// refusal is audited with the value marked: nothing runs.
	res, err = call(t, cs, "ticket.search", `{"query":"refund"}`, mcp.Meta{mcpbridge.MetaTraceparent: "00-not-a-trace-01"})
	if err != nil || !res.IsError {
		t.Fatalf("malformed traceparent: %v %+v", err, res)
	}
	r := refusalOf(t, res)
	if r.Stage != "request_check" || r.Code != "request.invalid_metadata" || len(r.Violations) != 1 || r.Violations[0].Pointer != "/traceparent" {
		t.Fatalf("malformed traceparent refused with %+v", r)
	}
	out := st.outcome(t, "acme", r.InvocationID)
	if out.Outcome != audit.OutcomeRefused || out.Code != "request.invalid_metadata" || !strings.Contains(out.Message, "[invalid] 00-not-a-trace-01") {
		t.Fatalf("row of the malformed traceparent: %+v", out.Record)
	}
}
