package executor_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/mandate-dev/mandate/services/executor"
)

// TestStartStage checks that a stage gets a span of its own wherever one
// could be traced — under a recording span, and under one its sampler
// dropped, whose child still gets its own span ID to propagate — and that
// it is skipped only under a span with no trace at all.
func TestStartStage(t *testing.T) {
	ctx := context.Background()
	if got, span := executor.StartStage(ctx, "dispatch"); got != ctx || span.SpanContext().IsValid() {
		t.Error("without a trace: a span was started")
	}

	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	sampled := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	otel.SetTracerProvider(sampled)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	parentCtx, parent := sampled.Tracer("test").Start(ctx, "mandate.execute")
	_, span := executor.StartStage(parentCtx, "dispatch")
	span.End()
	parent.End()
	if ended := rec.Ended(); len(ended) != 2 || ended[0].Name() != "dispatch" || ended[0].Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("under a recording span: %d spans ended, want the stage's under the call's", len(ended))
	}

	dropped := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	otel.SetTracerProvider(dropped)
	parentCtx, parent = dropped.Tracer("test").Start(ctx, "mandate.execute")
	stageCtx, _ := executor.StartStage(parentCtx, "dispatch")
	if got := trace.SpanContextFromContext(stageCtx); !got.IsValid() || got.SpanID() == parent.SpanContext().SpanID() {
		t.Error("under a dropped span: the stage has no span of its own")
	}
}
