package telemetry_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
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

// setup runs Setup and restores a no-op global provider after the test.
func setup(t *testing.T, service string, cfg telemetry.Config) func(context.Context) error {
	t.Helper()
	shutdown, err := telemetry.Setup(t.Context(), service, cfg)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	t.Cleanup(func() {
		_ = shutdown(context.Background())
		otel.SetTracerProvider(noop.NewTracerProvider())
	})
	return shutdown
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
	// The batch processor holds the spans; shutdown must flush them.
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
}

func TestSignalSpecificEndpointWinsAndIsUsedAsGiven(t *testing.T) {
	var used, ignored telemetrytest.Collector
	used.Start(t)
	ignored.Start(t)
	shutdown := setup(t, "confirm", telemetry.Config{Env: env(
		"OTEL_EXPORTER_OTLP_ENDPOINT", ignored.HTTPEndpoint(),
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", used.HTTPEndpoint()+"/v1/traces",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf",
	)})
	parentAndChild(t.Context())
	if err := shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if n, m := len(used.Spans()), len(ignored.Spans()); n != 2 || m != 0 {
		t.Fatalf("traces endpoint received %d spans, generic endpoint %d; want 2 and 0", n, m)
	}
	if s := used.Spans()[0]; s.Service != "mandate-confirm" {
		t.Fatalf("service %q", s.Service)
	}
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
	root, _ := parentAndChild(t.Context())
	if root.IsValid() {
		t.Fatalf("a span was recorded without an exporter: %v", root)
	}
	if err := shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if n := len(col.Spans()); n != 0 {
		t.Fatalf("collector received %d spans", n)
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

func TestExportSwitchedOff(t *testing.T) {
	var col telemetrytest.Collector
	endpoint := col.Start(t)
	for _, kv := range [][2]string{{"OTEL_SDK_DISABLED", "true"}, {"OTEL_TRACES_EXPORTER", "none"}} {
		t.Run(kv[0], func(t *testing.T) {
			cfg := telemetry.Config{Endpoint: endpoint, Env: env(kv[0], kv[1])}
			if telemetry.Enabled(cfg) {
				t.Fatal("Enabled")
			}
			shutdown := setup(t, "helpdesk", cfg)
			parentAndChild(t.Context())
			if err := shutdown(t.Context()); err != nil {
				t.Fatal(err)
			}
			if n := len(col.Spans()); n != 0 {
				t.Fatalf("collector received %d spans", n)
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

// TestTraceCrossesAGRPCHop: a client connection with GRPCClientOption and
// a server with the otelgrpc server handler (as internal/server installs
// it) put both sides of a call in one trace, the server span a child of the
// client span.
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
	srv := grpc.NewServer(grpc.StatsHandler(otelgrpc.NewServerHandler()), grpc.WaitForHandlers(true))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	stopServer := sync.OnceFunc(func() { srv.GracefulStop(); <-done })
	defer stopServer()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), telemetry.GRPCClientOption())
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
}
