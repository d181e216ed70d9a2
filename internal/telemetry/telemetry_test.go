package telemetry_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mandate-dev/mandate/internal/telemetry"
	"github.com/mandate-dev/mandate/internal/telemetry/telemetrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is a fixed environment, so the tests do not depend on the runner's.
func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// setup runs Setup and restores no-op global providers after the test.
func setup(t *testing.T, service string, cfg telemetry.Config) func(context.Context) error {
	t.Helper()
	shutdown, err := telemetry.Setup(t.Context(), service, cfg)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	t.Cleanup(func() {
		_ = shutdown(context.Background())
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
	})
	return shutdown
}

// count adds n to the counter telemetry_test.calls{command} and records
// one observation of telemetry_test.duration with the global provider.
func count(t *testing.T, n int64, command string) {
	t.Helper()
	m := otel.Meter("telemetry_test")
	calls, err := m.Int64Counter("telemetry_test.calls")
	if err != nil {
		t.Fatal(err)
	}
	dur, err := m.Float64Histogram("telemetry_test.duration", metric.WithUnit("s"))
	if err != nil {
		t.Fatal(err)
	}
	attrs := metric.WithAttributes(attribute.String("command", command))
	calls.Add(t.Context(), n, attrs)
	dur.Record(t.Context(), 0.25, attrs)
}

// parentAndChild records a root span and a child span with the global
// provider.
func parentAndChild(ctx context.Context) (root, child trace.SpanContext) {
	tr := otel.Tracer("telemetry_test")
	ctx, r := tr.Start(ctx, "root")
	_, c := tr.Start(ctx, "child")
	c.End()
	r.End()
	return r.SpanContext(), c.SpanContext()
}

func TestSetupExportsOverGRPCOnShutdown(t *testing.T) {
	var col telemetrytest.Collector
	endpoint := col.Start(t)
	shutdown := setup(t, "executor", telemetry.Config{Endpoint: endpoint, Version: "1.2.3", Env: env()})

	root, child := parentAndChild(t.Context())
	if !root.IsSampled() {
		t.Fatal("root span not sampled with the default sampler")
	}
	count(t, 3, "ticket.refund")
	// The batch processor holds the spans and the periodic reader the
	// metrics (its first export is a minute away); shutdown must flush
	// both.
	if err := shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	spans := col.Spans()
	if len(spans) != 2 {
		t.Fatalf("collector received %d spans, want 2: %+v", len(spans), spans)
	}
	byName := map[string]telemetrytest.Span{}
	for _, s := range spans {
		byName[s.Name] = s
		if s.Service != "mandate-executor" || s.Resource["service.version"] != "1.2.3" || s.Protocol != telemetrytest.ProtocolGRPC {
			t.Errorf("span %q: service %q version %q protocol %q", s.Name, s.Service, s.Resource["service.version"], s.Protocol)
		}
		if s.TraceID != root.TraceID().String() {
			t.Errorf("span %q in trace %s, want %s", s.Name, s.TraceID, root.TraceID())
		}
	}
	if r := byName["root"]; r.SpanID != root.SpanID().String() || r.ParentSpanID != "" {
		t.Errorf("root span %+v", r)
	}
	if c := byName["child"]; c.SpanID != child.SpanID().String() || c.ParentSpanID != root.SpanID().String() {
		t.Errorf("child span %+v, want parent %s", c, root.SpanID())
	}
	wantMetrics(t, &col, "mandate-executor", telemetrytest.ProtocolGRPC, "ticket.refund", 3)
	if m, _ := telemetrytest.Last(col.Metrics(), "", "telemetry_test.calls", nil); m.Resource["service.version"] != "1.2.3" || m.Scope != "telemetry_test" {
		t.Errorf("metric resource %v, scope %q", m.Resource, m.Scope)
	}
}

// wantMetrics asserts that the collector holds the counter count() moved
// by n and one observation of its histogram, from service, by protocol.
func wantMetrics(t *testing.T, col *telemetrytest.Collector, service, protocol, command string, n float64) {
	t.Helper()
	ms := col.Metrics()
	attrs := map[string]string{"command": command}
	calls, ok := telemetrytest.Last(ms, service, "telemetry_test.calls", attrs)
	if !ok || calls.Kind != "sum" || calls.Value != n || calls.Protocol != protocol {
		t.Errorf("telemetry_test.calls%v from %s: %+v (found %v), want a sum of %v by %s; received %+v", attrs, service, calls, ok, n, protocol, ms)
	}
	dur, ok := telemetrytest.Last(ms, service, "telemetry_test.duration", attrs)
	if !ok || dur.Kind != "histogram" || dur.Count != 1 || dur.Value != 0.25 || dur.Unit != "s" {
		t.Errorf("telemetry_test.duration%v from %s: %+v (found %v), want one observation of 0.25s", attrs, service, dur, ok)
	}
}

func TestSetupExportsOverHTTPFromTheStandardVariables(t *testing.T) {
	var col telemetrytest.Collector
	col.Start(t)
	// OTEL_EXPORTER_OTLP_ENDPOINT is a base URL: /v1/traces is appended.
	shutdown := setup(t, "audit", telemetry.Config{Env: env(
		"OTEL_EXPORTER_OTLP_ENDPOINT", col.HTTPEndpoint(),
		"OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf",
		"OTEL_SERVICE_NAME", "audit-eu-1",
	)})
	root, _ := parentAndChild(t.Context())
	count(t, 2, "audit.append")
	if err := shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	spans := col.Trace(root.TraceID().String())
	if len(spans) != 2 {
		t.Fatalf("collector received %d spans of the trace, want 2: %+v", len(spans), col.Spans())
	}
	for _, s := range spans {
		if s.Protocol != telemetrytest.ProtocolHTTP || s.Service != "audit-eu-1" {
			t.Errorf("span %q arrived by %q from %q", s.Name, s.Protocol, s.Service)
		}
	}
	// … and /v1/metrics.
	wantMetrics(t, &col, "audit-eu-1", telemetrytest.ProtocolHTTP, "audit.append", 2)
}

// TestHTTPFlagSendsMetricsNextToTraces: over HTTP the flag names the
// traces URL as given; metrics go to the same collector's /v1/metrics.
func TestHTTPFlagSendsMetricsNextToTraces(t *testing.T) {
	var col telemetrytest.Collector
	col.Start(t)
	shutdown := setup(t, "catalog", telemetry.Config{Endpoint: col.HTTPEndpoint() + "/v1/traces", Protocol: telemetry.ProtocolHTTP, Env: env()})
	parentAndChild(t.Context())
	count(t, 1, "ticket.search")
	if err := shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if n := len(col.Spans()); n != 2 {
		t.Fatalf("collector received %d spans, want 2", n)
	}
	wantMetrics(t, &col, "mandate-catalog", telemetrytest.ProtocolHTTP, "ticket.search", 1)
}

// TestMetricsEndpointVariableSendsMetricsElsewhere: the metrics-specific
// variable wins over the flag, for metrics only.
func TestMetricsEndpointVariableSendsMetricsElsewhere(t *testing.T) {
	var traces, metrics telemetrytest.Collector
	traces.Start(t)
	metrics.Start(t)
	shutdown := setup(t, "executor", telemetry.Config{Endpoint: traces.Endpoint(), Env: env(
		"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", metrics.Endpoint(),
	)})
	parentAndChild(t.Context())
	count(t, 1, "ticket.search")
	if err := shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if n, m := len(traces.Spans()), len(metrics.Spans()); n != 2 || m != 0 {
		t.Fatalf("flag's collector received %d spans, metrics collector %d; want 2 and 0", n, m)
	}
	if n := len(traces.Metrics()); n != 0 {
		t.Fatalf("flag's collector received %d metric points, want none", n)
	}
	wantMetrics(t, &metrics, "mandate-executor", telemetrytest.ProtocolGRPC, "ticket.search", 1)
}

// TestMetricsAreExportedPeriodically: OTEL_METRIC_EXPORT_INTERVAL sets the
// reader's interval; points arrive while the process runs, not only when
// it stops.
func TestMetricsAreExportedPeriodically(t *testing.T) {
	var col telemetrytest.Collector
	endpoint := col.Start(t)
	setup(t, "executor", telemetry.Config{Endpoint: endpoint, Env: env("OTEL_METRIC_EXPORT_INTERVAL", "20")})
	count(t, 4, "ticket.search")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := col.WaitMetrics(ctx, func(ms []telemetrytest.Metric) bool {
		m, ok := telemetrytest.Last(ms, "mandate-executor", "telemetry_test.calls", nil)
		return ok && m.Value == 4
	}); err != nil {
		t.Fatalf("no periodic export before shutdown: %v", err)
	}
}

func TestSignalSpecificEndpointWinsAndIsUsedAsGiven(t *testing.T) {
	var used, ignored telemetrytest.Collector
	used.Start(t)
	ignored.Start(t)
	shutdown := setup(t, "confirm", telemetry.Config{Env: env(
		"OTEL_EXPORTER_OTLP_ENDPOINT", ignored.HTTPEndpoint(),
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", used.HTTPEndpoint()+"/v1/traces",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf",
		"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf",
	)})
	parentAndChild(t.Context())
	count(t, 1, "ticket.search")
	if err := shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if n, m := len(used.Spans()), len(ignored.Spans()); n != 2 || m != 0 {
		t.Fatalf("traces endpoint received %d spans, generic endpoint %d; want 2 and 0", n, m)
	}
	if s := used.Spans()[0]; s.Service != "mandate-confirm" {
		t.Fatalf("service %q", s.Service)
	}
	// Metrics, with no variable of their own, go to the generic endpoint.
	if n := len(used.Metrics()); n != 0 {
		t.Fatalf("traces endpoint received %d metric points", n)
	}
	wantMetrics(t, &ignored, "mandate-confirm", telemetrytest.ProtocolHTTP, "ticket.search", 1)
}

// TestUnconfiguredExportsNothing: no endpoint anywhere — no exporter, no
// error, spans are not recorded, but the W3C propagator is installed and
// passes an incoming trace context on unchanged.
func TestUnconfiguredExportsNothing(t *testing.T) {
	var col telemetrytest.Collector
	col.Start(t)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator()) // forget earlier tests
	shutdown := setup(t, "catalog", telemetry.Config{Env: env()})
	if telemetry.Enabled(telemetry.Config{Env: env()}) {
		t.Fatal("Enabled with nothing configured")
	}
	if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); ok {
		t.Fatal("an SDK tracer provider was installed without an endpoint")
	}
	if _, ok := otel.GetMeterProvider().(*sdkmetric.MeterProvider); ok {
		t.Fatal("an SDK meter provider was installed without an endpoint")
	}
	root, _ := parentAndChild(t.Context())
	count(t, 1, "ticket.search")
	if root.IsValid() {
		t.Fatalf("a span was recorded without an exporter: %v", root)
	}
	if err := shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if n, m := len(col.Spans()), len(col.Metrics()); n != 0 || m != 0 {
		t.Fatalf("collector received %d spans and %d metric points", n, m)
	}

	prop := otel.GetTextMapPropagator()
	for _, f := range []string{"traceparent", "tracestate", "baggage"} {
		if !slices.Contains(prop.Fields(), f) {
			t.Errorf("propagator fields %v lack %q", prop.Fields(), f)
		}
	}
	const incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := prop.Extract(t.Context(), propagation.MapCarrier{"traceparent": incoming, "baggage": "tenant=acme"})
	ctx, span := otel.Tracer("telemetry_test").Start(ctx, "hop")
	defer span.End()
	out := propagation.MapCarrier{}
	prop.Inject(ctx, out)
	if out["traceparent"] != incoming || out["baggage"] != "tenant=acme" {
		t.Fatalf("context not passed on unchanged: %v", out)
	}
}

// TestUntracedSpansCostNothing: without a trace endpoint — with or without
// /metrics — Install replaces whatever TracerProvider the process had with
// the no-op one, under which a span started inside an incoming trace
// allocates nothing and still carries that trace on. (OpenTelemetry's
// default global provider allocates a span and a context for each: ~40
// allocations of a governed call in mandate dev.)
func TestUntracedSpansCostNothing(t *testing.T) {
	for _, prometheus := range []bool{false, true} {
		otel.SetTracerProvider(sdktrace.NewTracerProvider()) // records, and allocates per span
		in, err := telemetry.Install(t.Context(), "executor", telemetry.Config{Env: env(), Prometheus: prometheus})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = in.Shutdown(context.Background())
			otel.SetMeterProvider(metricnoop.NewMeterProvider())
		})
		const incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		ctx := otel.GetTextMapPropagator().Extract(t.Context(), propagation.MapCarrier{"traceparent": incoming})
		tracer := otel.GetTracerProvider().Tracer("telemetry_test")
		allocs := testing.AllocsPerRun(100, func() {
			_, span := tracer.Start(ctx, "stage")
			span.End()
		})
		if allocs != 0 {
			t.Errorf("Prometheus %v: a span under an incoming trace allocates %.0f times, want 0", prometheus, allocs)
		}
		child, span := tracer.Start(ctx, "stage")
		span.End()
		if got := trace.SpanContextFromContext(child).TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("Prometheus %v: the span is in trace %s, not the incoming one", prometheus, got)
		}
	}
}

// TestExportSwitchedOff: OTEL_SDK_DISABLED stops both signals,
// OTEL_<SIGNAL>_EXPORTER=none its own.
func TestExportSwitchedOff(t *testing.T) {
	cases := []struct {
		env            [2]string
		enabled        bool
		spans, metrics bool
	}{
		{[2]string{"OTEL_SDK_DISABLED", "true"}, false, false, false},
		{[2]string{"OTEL_TRACES_EXPORTER", "none"}, true, false, true},
		{[2]string{"OTEL_METRICS_EXPORTER", "none"}, true, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.env[0], func(t *testing.T) {
			var col telemetrytest.Collector
			endpoint := col.Start(t)
			cfg := telemetry.Config{Endpoint: endpoint, Env: env(tc.env[0], tc.env[1])}
			if telemetry.Enabled(cfg) != tc.enabled {
				t.Fatalf("Enabled = %v, want %v", !tc.enabled, tc.enabled)
			}
			shutdown := setup(t, "helpdesk", cfg)
			parentAndChild(t.Context())
			count(t, 1, "ticket.search")
			if err := shutdown(t.Context()); err != nil {
				t.Fatal(err)
			}
			if n := len(col.Spans()); (n > 0) != tc.spans {
				t.Errorf("collector received %d spans; want some: %v", n, tc.spans)
			}
			if _, ok := telemetrytest.Last(col.Metrics(), "mandate-helpdesk", "telemetry_test.calls", nil); ok != tc.metrics {
				t.Errorf("collector received the counter: %v, want %v", ok, tc.metrics)
			}
		})
	}
}

func TestInvalidSettingsAreNamed(t *testing.T) {
	cases := []struct {
		cfg  telemetry.Config
		want string
	}{
		{telemetry.Config{Endpoint: "jaeger:4317", Env: env()}, "--otlp-endpoint must be a URL such as http://collector:4317"},
		{telemetry.Config{Env: env("OTEL_EXPORTER_OTLP_ENDPOINT", "collector")}, "OTEL_EXPORTER_OTLP_ENDPOINT must be a URL"},
		{telemetry.Config{Endpoint: "http://127.0.0.1:4317", Env: env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")}, `protocol "http/json" is not supported`},
		{telemetry.Config{Endpoint: "http://127.0.0.1:4317", Env: env("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")}, `protocol "http/json" is not supported`},
		{telemetry.Config{Endpoint: "http://127.0.0.1:4317", Env: env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "collector:4317")}, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT must be a URL"},
		{telemetry.Config{Endpoint: "http://127.0.0.1:4317", Env: env("OTEL_METRIC_EXPORT_INTERVAL", "1m")}, `OTEL_METRIC_EXPORT_INTERVAL must be a positive number of milliseconds, not "1m"`},
		{telemetry.Config{Endpoint: "http://127.0.0.1:4317", Env: env("OTEL_METRIC_EXPORT_TIMEOUT", "0")}, "OTEL_METRIC_EXPORT_TIMEOUT must be a positive number of milliseconds"},
	}
	for _, tc := range cases {
		_, err := telemetry.Setup(t.Context(), "executor", tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.cfg.Endpoint, err, tc.want)
		}
	}
	// Credentials in an endpoint never reach the error text.
	_, err := telemetry.Setup(t.Context(), "executor", telemetry.Config{Endpoint: "ftp://user:hunter2@collector:4317", Env: env()})
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error %v", err)
	}
}

// TestTraceCrossesAGRPCHop: a client connection with GRPCClientOptions
// and a server with GRPCServer's interceptors (as internal/server installs
// them) put both sides of a call in one trace, the server span a child of
// the client span.
func TestTraceCrossesAGRPCHop(t *testing.T) {
	var col telemetrytest.Collector
	endpoint := col.Start(t)
	shutdown := setup(t, "executor", telemetry.Config{Endpoint: endpoint, Env: env()})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The server ends its span after the reply is sent; stopping it with
	// WaitForHandlers waits for that before the provider is shut down.
	tel := telemetry.NewGRPCServer(nil, nil)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(tel.Unary), grpc.ChainStreamInterceptor(tel.Stream), grpc.WaitForHandlers(true))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	stopServer := sync.OnceFunc(func() { srv.GracefulStop(); <-done })
	defer stopServer()
	conn, err := grpc.NewClient(lis.Addr().String(), append(telemetry.GRPCClientOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()

	ctx, root := otel.Tracer("telemetry_test").Start(t.Context(), "call")
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	root.End()
	_ = conn.Close()
	stopServer()
	if err := shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	spans := col.Trace(root.SpanContext().TraceID().String())
	var client, server *telemetrytest.Span
	for i, s := range spans {
		switch s.Kind {
		case "client":
			client = &spans[i]
		case "server":
			server = &spans[i]
		}
	}
	if client == nil || server == nil {
		t.Fatalf("trace lacks a client or a server span: %+v", spans)
	}
	if client.ParentSpanID != root.SpanContext().SpanID().String() || server.ParentSpanID != client.SpanID {
		t.Fatalf("parents: client %s (want %s), server %s (want %s)", client.ParentSpanID, root.SpanContext().SpanID(), server.ParentSpanID, client.SpanID)
	}
	if server.Name != "grpc.health.v1.Health/Check" {
		t.Fatalf("server span %q", server.Name)
	}
	// The same handlers, created after Setup, record RPC metrics with the
	// global MeterProvider it installed.
	for _, name := range []string{"rpc.server.call.duration", "rpc.client.call.duration"} {
		if m, ok := telemetrytest.Last(col.Metrics(), "mandate-executor", name, map[string]string{"rpc.method": "grpc.health.v1.Health/Check"}); !ok || m.Count != 1 {
			t.Errorf("%s of Check: %+v (found %v); received %+v", name, m, ok, col.Metrics())
		}
	}
}
