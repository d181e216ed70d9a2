package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/mandate-dev/mandate/internal/telemetry"
	"github.com/mandate-dev/mandate/internal/telemetry/telemetrytest"
)

// install runs Install and restores no-op global providers after the test.
func install(t *testing.T, service string, cfg telemetry.Config) telemetry.Installed {
	t.Helper()
	in, err := telemetry.Install(t.Context(), service, cfg)
	if err != nil {
		t.Fatalf("Install: %v", err)
	}
	t.Cleanup(func() {
		_ = in.Shutdown(context.Background())
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
	})
	return in
}

// scrape GETs /metrics from h and returns the exposition text.
func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", rec.Code)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q, want the text exposition format", ct)
	}
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

// wantLines asserts that every line is in the exposition text.
func wantLines(t *testing.T, text string, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !strings.Contains(text, l) {
			t.Errorf("/metrics lacks %q; got:\n%s", l, text)
		}
	}
}

// TestPrometheusWithoutCollector: with no OTLP endpoint the instruments
// still reach /metrics, named as Prometheus names them (unit and _total
// suffixes), with the service's resource as target_info; no span is
// recorded, since no trace exporter was asked for.
func TestPrometheusWithoutCollector(t *testing.T) {
	in := install(t, "executor", telemetry.Config{Env: env(), Version: "1.2.3", Prometheus: true})
	if in.Metrics == nil {
		t.Fatal("Prometheus: true returned no handler")
	}
	if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); ok {
		t.Fatal("a tracer provider was installed without an endpoint")
	}
	count(t, 3, "ticket.search")
	text := scrape(t, in.Metrics)
	wantLines(t, text,
		"# TYPE telemetry_test_calls_total counter",
		`telemetry_test_calls_total{command="ticket.search",otel_scope_name="telemetry_test"`,
		"# TYPE telemetry_test_duration_seconds histogram",
		`telemetry_test_duration_seconds_count{command="ticket.search",otel_scope_name="telemetry_test"`,
		`service_name="mandate-executor"`, `service_version="1.2.3"`,
		"go_goroutines ", "process_cpu_seconds_total ",
	)
	if !strings.Contains(text, "} 3\n") {
		t.Errorf("counter value 3 not found:\n%s", text)
	}
}

// TestPrometheusBesideOTLP: one provider, two readers — the collector and
// /metrics see the same instrument.
func TestPrometheusBesideOTLP(t *testing.T) {
	var col telemetrytest.Collector
	endpoint := col.Start(t)
	in := install(t, "audit", telemetry.Config{Endpoint: endpoint, Env: env(), Prometheus: true})
	count(t, 2, "audit.append")
	wantLines(t, scrape(t, in.Metrics), `telemetry_test_calls_total{command="audit.append"`, `service_name="mandate-audit"`)
	if err := in.Shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	wantMetrics(t, &col, "mandate-audit", telemetrytest.ProtocolGRPC, "audit.append", 2)
}

// TestPrometheusOff: without Prometheus there is no handler, and with no
// endpoint either no provider is installed.
func TestPrometheusOff(t *testing.T) {
	in := install(t, "catalog", telemetry.Config{Env: env()})
	if in.Metrics != nil {
		t.Fatal("a /metrics handler without Prometheus")
	}
	if _, ok := otel.GetMeterProvider().(interface{ ForceFlush(context.Context) error }); ok {
		t.Fatal("an SDK meter provider was installed with nothing to export to")
	}
}

// TestPrometheusSurvivesSwitchedOffExport: OTEL_SDK_DISABLED stops the
// OTLP export, not /metrics, which has its own switch.
func TestPrometheusSurvivesSwitchedOffExport(t *testing.T) {
	in := install(t, "confirm", telemetry.Config{Endpoint: "http://127.0.0.1:1", Env: env("OTEL_SDK_DISABLED", "true"), Prometheus: true})
	if in.Metrics == nil {
		t.Fatal("OTEL_SDK_DISABLED removed /metrics")
	}
	count(t, 1, "ticket.search")
	wantLines(t, scrape(t, in.Metrics), `telemetry_test_calls_total{command="ticket.search"`)
}
