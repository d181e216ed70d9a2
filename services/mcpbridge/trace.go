package mcpbridge

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/mandate-dev/mandate/internal/manifest"
)

var tracer = otel.Tracer("mandate/mcpbridge")

// callSpanOptions start a tools/call span; one slice for all, as a
// variadic slice built per call would be allocated per call.
var callSpanOptions = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}

// W3C trace context keys a tools/call's `_meta` may carry, as an MCP client
// propagates its own trace to the server.
const (
	// MetaTraceparent is the W3C traceparent of the client's span.
	MetaTraceparent = "traceparent"
	// MetaTracestate is the W3C tracestate that goes with it.
	MetaTracestate = "tracestate"
)

// traceContext returns ctx with the remote span context that meta's
// traceparent (and tracestate) name, read with the W3C TraceContext
// propagator. A missing or malformed traceparent leaves ctx as it is.
func traceContext(ctx context.Context, meta mcp.Meta) context.Context {
	if metaString(meta, MetaTraceparent) == "" {
		return ctx
	}
	carrier := propagation.MapCarrier{}
	for _, k := range []string{MetaTraceparent, MetaTracestate} {
		if v := metaString(meta, k); v != "" {
			carrier[k] = v
		}
	}
	return propagation.TraceContext{}.Extract(ctx, carrier)
}

// startCallSpan starts the server span of one tools/call, a child of the
// traceparent in its `_meta` when there is one. The executor's spans (and
// so its audit rows' trace id) descend from it. Its attributes are set
// only on a span that records: without a tracer provider, or unsampled,
// a call builds none.
func (b *Bridge) startCallSpan(ctx context.Context, req *mcp.CallToolRequest) (context.Context, trace.Span) {
	ctx = traceContext(ctx, req.Params.Meta)
	ctx, span := tracer.Start(ctx, b.spanName(req.Params.Name), callSpanOptions...)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("mcp.method.name", "tools/call"),
			attribute.String("gen_ai.tool.name", req.Params.Name),
		)
		if req.Session != nil {
			span.SetAttributes(attribute.String("mcp.session.id", req.Session.ID()))
		}
	}
	return ctx, span
}

// spanName is the name of a tools/call span: "tools/call <tool>", built
// once per command of the manifest (callSpans) rather than per call.
func (b *Bridge) spanName(tool string) string {
	if name, ok := b.callSpans[tool]; ok {
		return name
	}
	return "tools/call " + tool
}

// callSpanNames are the tools/call span names of the manifest's commands.
func callSpanNames(m *manifest.Set) map[string]string {
	names := make(map[string]string)
	for _, c := range m.Commands() {
		names[c.Code] = "tools/call " + c.Code
	}
	return names
}

// markRefused records a refusal's code on the call's span.
func markRefused(ctx context.Context, code string) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.String("mandate.code", code))
	span.SetStatus(otelcodes.Error, code)
}
