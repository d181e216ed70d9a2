// Package telemetry installs OpenTelemetry for a Mandate process: a global
// TracerProvider exporting spans over OTLP (gRPC or HTTP/protobuf) through a
// batch span processor, a global MeterProvider exporting metrics over the
// same protocol through a periodic reader, and the W3C tracecontext +
// baggage propagator, so one trace id crosses every service a call touches.
// The gRPC and HTTP instrumentation every server and client carries
// (GRPCServer and GRPCClient here, otelhttp) records its RPC metrics with
// the global provider;
// packages such as the executor add their own.
//
// Export is configured by the --otlp-endpoint flag or the standard
// variables (OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT,
// OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_[{TRACES,METRICS}_]PROTOCOL,
// OTEL_SERVICE_NAME, OTEL_SDK_DISABLED, OTEL_{TRACES,METRICS}_EXPORTER=none,
// OTEL_METRIC_EXPORT_INTERVAL, OTEL_METRIC_EXPORT_TIMEOUT); the SDK and the
// exporters read the others themselves (OTEL_TRACES_SAMPLER[_ARG],
// OTEL_BSP_*, OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_[SIGNAL_]HEADERS,
// _TIMEOUT, _COMPRESSION, _CERTIFICATE). With no endpoint nothing is
// exported and no goroutine is started, but the propagator is still
// installed: a process without an exporter passes the caller's trace
// context on unchanged.
//
// Install can also serve the metrics for Prometheus to scrape
// (Config.Prometheus): the same MeterProvider then has a second reader, the
// OpenTelemetry Prometheus exporter, so /metrics shows exactly the
// instruments the OTLP export carries (mandate.executor.calls as
// mandate_executor_calls_total, and so on), with or without a collector.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Protocols an OTLP exporter speaks.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// ServicePrefix prefixes service.name: service "executor" reports as
// "mandate-executor".
const ServicePrefix = "mandate-"

// Default metric export interval and timeout (OpenTelemetry SDK defaults).
const (
	defaultMetricInterval = 60 * time.Second
	defaultMetricTimeout  = 30 * time.Second
)

// Config selects the exporters. Every field is optional.
type Config struct {
	// Endpoint is the OTLP endpoint URL of both signals, e.g.
	// http://jaeger:4317 (gRPC) or http://jaeger:4318/v1/traces (HTTP:
	// traces go to the URL as given, metrics to it with a trailing
	// /v1/traces replaced by /v1/metrics, or /v1/metrics appended). The
	// scheme decides TLS: https uses it, http does not.
	//
	// Traces: Endpoint, then OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then
	// OTEL_EXPORTER_OTLP_ENDPOINT (for HTTP, /v1/traces is appended to it).
	// Metrics: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT (so metrics can go
	// elsewhere), then Endpoint, then OTEL_EXPORTER_OTLP_ENDPOINT (for
	// HTTP, /v1/metrics appended). None of them: that signal is not
	// exported.
	Endpoint string
	// Protocol is grpc or http/protobuf. Empty:
	// OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL,
	// then grpc.
	Protocol string
	// Version is reported as service.version (default: the binary's module
	// version or VCS revision).
	Version string
	// Env looks up variables (default os.LookupEnv).
	Env func(string) (string, bool)
	// Logger receives export errors (default slog.Default()).
	Logger *slog.Logger
	// Prometheus makes Install return a handler serving every metric in
	// the Prometheus exposition format (plus the Go runtime and process
	// collectors), whether or not an OTLP endpoint is configured.
	// OTEL_SDK_DISABLED=true and OTEL_METRICS_EXPORTER=none switch the
	// OTLP export off, not this: /metrics is switched by its own flag.
	Prometheus bool
}

// Installed is what Install set up.
type Installed struct {
	// Shutdown flushes buffered spans and metrics and stops the exporters;
	// call it once, on exit, with a context bounding how long the flush
	// may take.
	Shutdown func(context.Context) error
	// Metrics serves the metrics for Prometheus (GET /metrics); nil unless
	// Config.Prometheus.
	Metrics http.Handler
}

// Propagator is the W3C tracecontext + baggage propagator Setup installs.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Enabled reports whether cfg names an endpoint (flag or variable) for
// traces or metrics and export is not switched off, i.e. whether Setup
// would export anything.
func Enabled(cfg Config) bool {
	r, err := cfg.resolve()
	return err == nil && (r.traces.endpoint != "" || r.metrics.endpoint != "")
}

// Setup installs the global propagator and, when an endpoint is
// configured, a global TracerProvider and a global MeterProvider exporting
// the spans and metrics of service (e.g. "executor", reported as
// service.name "mandate-executor"). The returned shutdown flushes buffered
// spans and metrics and stops the exporters; call it once, on exit, with a
// context bounding how long the flush may take. An invalid setting is an
// error naming it; an unreachable collector is not (data is dropped and the
// failure logged).
//
// Without a trace endpoint it installs the no-op TracerProvider: a call's
// trace context still passes through every hop unchanged (a traceparent
// that came in goes out, and into the audit row), but a span started under
// it costs nothing, where OpenTelemetry's default global provider
// allocates a span and a context for each.
//
// Instrumentation takes its tracer and meter from the global providers:
// what is created before Setup is bound to the first providers Setup
// installs in the process, what is created after to the current ones.
func Setup(ctx context.Context, service string, cfg Config) (shutdown func(context.Context) error, err error) {
	cfg.Prometheus = false
	in, err := Install(ctx, service, cfg)
	return in.Shutdown, err
}

// Install is Setup that can also serve the metrics for Prometheus
// (Config.Prometheus): the global MeterProvider then exists even without
// an OTLP endpoint, read on each scrape (no goroutine of its own).
func Install(ctx context.Context, service string, cfg Config) (Installed, error) {
	otel.SetTextMapPropagator(Propagator())
	noop := Installed{Shutdown: func(context.Context) error { return nil }}
	r, err := cfg.resolve()
	if err != nil {
		return noop, err
	}
	if r.traces.endpoint == "" && r.metrics.endpoint == "" && !cfg.Prometheus {
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
		return noop, nil
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	// Build every exporter before installing anything, so an error leaves
	// the process as it was.
	var spanExp sdktrace.SpanExporter
	// A signal without an endpoint gets no exporter: one given none would
	// send to localhost:4317.
	switch {
	case r.traces.endpoint == "":
	case r.traces.protocol == ProtocolGRPC:
		spanExp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(r.traces.endpoint))
	case r.traces.protocol == ProtocolHTTP:
		spanExp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(r.traces.endpoint))
	}
	if err != nil {
		return noop, fmt.Errorf("telemetry: OTLP trace exporter: %w", err)
	}
	var (
		promReader  sdkmetric.Reader
		promHandler http.Handler
	)
	if cfg.Prometheus {
		// A registry of its own, not prometheus.DefaultRegisterer: two
		// Installs in one process (tests) do not collide.
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		if promReader, err = otelprom.New(otelprom.WithRegisterer(reg)); err != nil {
			if spanExp != nil {
				_ = spanExp.Shutdown(ctx)
			}
			return noop, fmt.Errorf("telemetry: Prometheus exporter: %w", err)
		}
		promHandler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	}
	var metricExp sdkmetric.Exporter
	switch {
	case r.metrics.endpoint == "":
	case r.metrics.protocol == ProtocolGRPC:
		metricExp, err = otlpmetricgrpc.New(ctx, otlpmetricgrpc.WithEndpointURL(r.metrics.endpoint))
	case r.metrics.protocol == ProtocolHTTP:
		metricExp, err = otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpointURL(r.metrics.endpoint))
	}
	if err != nil {
		if spanExp != nil {
			_ = spanExp.Shutdown(ctx)
		}
		if promReader != nil {
			_ = promReader.Shutdown(ctx)
		}
		return noop, fmt.Errorf("telemetry: OTLP metric exporter: %w", err)
	}
	res, name := cfg.resource(service)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry", "err", err)
	}))
	var stops []func(context.Context) error
	if spanExp != nil {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(spanExp), sdktrace.WithResource(res))
		otel.SetTracerProvider(tp)
		stops = append(stops, tp.Shutdown)
		log.Info("exporting traces", "endpoint", redactURL(r.traces.endpoint), "protocol", r.traces.protocol, "service_name", name)
	} else {
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
	}
	if metricExp != nil || promReader != nil {
		// One provider, one or two readers: every instrument reaches both
		// the collector and /metrics.
		opts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithView(views()...)}
		if metricExp != nil {
			opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(metricExp,
				sdkmetric.WithInterval(r.interval), sdkmetric.WithTimeout(r.timeout))))
			log.Info("exporting metrics", "endpoint", redactURL(r.metrics.endpoint), "protocol", r.metrics.protocol,
				"service_name", name, "interval", r.interval)
		}
		if promReader != nil {
			opts = append(opts, sdkmetric.WithReader(promReader))
		}
		mp := sdkmetric.NewMeterProvider(opts...)
		otel.SetMeterProvider(mp)
		stops = append(stops, mp.Shutdown)
	}
	return Installed{Metrics: promHandler, Shutdown: func(ctx context.Context) error {
		// Both flush at once: a slow trace collector does not eat the
		// metrics' share of the deadline.
		errs := make([]error, len(stops))
		var wg sync.WaitGroup
		for i, stop := range stops {
			wg.Go(func() { errs[i] = stop(ctx) })
		}
		wg.Wait()
		return errors.Join(errs...)
	}}, nil
}

// resource describes the process: service.name (OTEL_SERVICE_NAME or
// mandate-<service>), service.version and service.namespace.
func (c Config) resource(service string) (*resource.Resource, string) {
	name := ServicePrefix + service
	if v, ok := c.lookup("OTEL_SERVICE_NAME"); ok && v != "" {
		name = v
	}
	version := c.Version
	if version == "" {
		version = Version()
	}
	// Attributes given here win over OTEL_RESOURCE_ATTRIBUTES, so the
	// service name always matches the process.
	attrs := []attribute.KeyValue{semconv.ServiceName(name), semconv.ServiceVersion(version), semconv.ServiceNamespace("mandate")}
	res, err := resource.Merge(resource.Default(), resource.NewWithAttributes(semconv.SchemaURL, attrs...))
	if err != nil {
		// A schema URL conflict between the SDK's detectors and this
		// package: keep the attributes, drop the schema.
		res = resource.NewSchemaless(attrs...)
	}
	return res, name
}

// target is where one signal is exported; endpoint "" means nowhere.
type target struct{ endpoint, protocol string }

// resolved is the export configuration of both signals.
type resolved struct {
	traces, metrics   target
	interval, timeout time.Duration
}

// signal describes how one signal's settings are named.
type signal struct {
	// env is the infix of its variables: TRACES or METRICS.
	env string
	// path is the OTLP/HTTP path appended to a base URL.
	path string
	// specificFirst puts OTEL_EXPORTER_OTLP_<env>_ENDPOINT before the flag.
	specificFirst bool
}

var (
	tracesSignal  = signal{env: "TRACES", path: "/v1/traces"}
	metricsSignal = signal{env: "METRICS", path: "/v1/metrics", specificFirst: true}
)

// resolve returns where each signal goes.
func (c Config) resolve() (resolved, error) {
	r := resolved{interval: defaultMetricInterval, timeout: defaultMetricTimeout}
	if v, _ := c.lookup("OTEL_SDK_DISABLED"); strings.EqualFold(strings.TrimSpace(v), "true") {
		return r, nil
	}
	var err error
	if r.traces, err = c.resolveSignal(tracesSignal); err != nil {
		return resolved{}, err
	}
	if r.metrics, err = c.resolveSignal(metricsSignal); err != nil {
		return resolved{}, err
	}
	if r.metrics.endpoint == "" {
		return r, nil
	}
	if r.interval, err = c.millis("OTEL_METRIC_EXPORT_INTERVAL", defaultMetricInterval); err != nil {
		return resolved{}, err
	}
	if r.timeout, err = c.millis("OTEL_METRIC_EXPORT_TIMEOUT", defaultMetricTimeout); err != nil {
		return resolved{}, err
	}
	return r, nil
}

// resolveSignal returns the endpoint ("" when the signal is not exported)
// and protocol of one signal.
func (c Config) resolveSignal(sig signal) (target, error) {
	exporterVar := "OTEL_" + sig.env + "_EXPORTER"
	if v, _ := c.lookup(exporterVar); strings.EqualFold(strings.TrimSpace(v), "none") {
		return target{}, nil
	}
	protocol := c.Protocol
	for _, k := range []string{"OTEL_EXPORTER_OTLP_" + sig.env + "_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if protocol != "" {
			break
		}
		protocol, _ = c.lookup(k)
	}
	switch protocol = strings.TrimSpace(protocol); protocol {
	case "":
		protocol = ProtocolGRPC
	case ProtocolGRPC, ProtocolHTTP:
	default:
		return target{}, fmt.Errorf("telemetry: OTLP protocol %q is not supported (grpc or http/protobuf)", protocol)
	}

	// Candidates in order of precedence, and how an HTTP path is derived
	// from each: used as given (signal-specific variable), the traces path
	// swapped for this signal's (flag), or this signal's path appended to
	// a base URL (generic variable).
	type source struct {
		name, value string
		derive      func(path string) string
	}
	asGiven := func(p string) string { return p }
	fromFlag := func(p string) string {
		if sig == tracesSignal {
			return p
		}
		return strings.TrimSuffix(strings.TrimSuffix(p, "/"), tracesSignal.path) + sig.path
	}
	appendPath := func(p string) string { return strings.TrimSuffix(p, "/") + sig.path }
	specificVar := "OTEL_EXPORTER_OTLP_" + sig.env + "_ENDPOINT"
	specific, _ := c.lookup(specificVar)
	generic, _ := c.lookup("OTEL_EXPORTER_OTLP_ENDPOINT")
	sources := []source{{"--otlp-endpoint", c.Endpoint, fromFlag}, {specificVar, specific, asGiven}}
	if sig.specificFirst {
		sources[0], sources[1] = sources[1], sources[0]
	}
	sources = append(sources, source{"OTEL_EXPORTER_OTLP_ENDPOINT", generic, appendPath})
	for _, s := range sources {
		endpoint := strings.TrimSpace(s.value)
		if endpoint == "" {
			continue
		}
		u, err := url.Parse(endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return target{}, fmt.Errorf("telemetry: %s must be a URL such as http://collector:4317, not %q", s.name, redactURL(endpoint))
		}
		if protocol == ProtocolHTTP {
			if p := s.derive(u.Path); p != u.Path {
				u.Path = p
				endpoint = u.String()
			}
		}
		return target{endpoint: endpoint, protocol: protocol}, nil
	}
	return target{protocol: protocol}, nil
}

// millis reads a variable holding a positive number of milliseconds.
func (c Config) millis(k string, def time.Duration) (time.Duration, error) {
	v, ok := c.lookup(k)
	if v = strings.TrimSpace(v); !ok || v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("telemetry: %s must be a positive number of milliseconds, not %q", k, v)
	}
	return time.Duration(n) * time.Millisecond, nil
}

func (c Config) lookup(k string) (string, bool) {
	if c.Env == nil {
		return os.LookupEnv(k)
	}
	return c.Env(k)
}

// redactURL drops credentials a URL may carry before it is logged.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// Version is the running binary's version: its module version when built
// from a tagged module, else its VCS revision, else "devel".
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}
