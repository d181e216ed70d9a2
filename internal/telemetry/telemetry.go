// Package telemetry installs OpenTelemetry tracing for a Mandate process: a
// global TracerProvider exporting spans over OTLP (gRPC or HTTP/protobuf)
// through a batch span processor, and the W3C tracecontext + baggage
// propagator, so one trace id crosses every service a call touches.
//
// Export is configured by the --otlp-endpoint flag or the standard
// variables (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL, OTEL_SERVICE_NAME, OTEL_SDK_DISABLED,
// OTEL_TRACES_EXPORTER=none); the SDK and the exporters read the others
// themselves (OTEL_TRACES_SAMPLER[_ARG], OTEL_RESOURCE_ATTRIBUTES,
// OTEL_EXPORTER_OTLP_[TRACES_]HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE).
// With no endpoint nothing is exported and no goroutine is started, but the
// propagator is still installed: a process without an exporter passes the
// caller's trace context on unchanged.
package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"runtime/debug"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"google.golang.org/grpc"
)

// Protocols an OTLP exporter speaks.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// ServicePrefix prefixes service.name: service "executor" reports as
// "mandate-executor".
const ServicePrefix = "mandate-"

// Config selects the exporter. Every field is optional.
type Config struct {
	// Endpoint is the OTLP endpoint URL, e.g. http://jaeger:4317 (gRPC) or
	// http://jaeger:4318/v1/traces (HTTP; the path is used as given). The
	// scheme decides TLS: https uses it, http does not. Empty: the
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT variable, then
	// OTEL_EXPORTER_OTLP_ENDPOINT (for HTTP, /v1/traces is appended to it);
	// none of them: no export.
	Endpoint string
	// Protocol is grpc or http/protobuf. Empty:
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL, then
	// grpc.
	Protocol string
	// Version is reported as service.version (default: the binary's module
	// version or VCS revision).
	Version string
	// Env looks up variables (default os.LookupEnv).
	Env func(string) (string, bool)
	// Logger receives export errors (default slog.Default()).
	Logger *slog.Logger
}

// Propagator is the W3C tracecontext + baggage propagator Setup installs.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// GRPCClientOption instruments an outgoing gRPC connection: a client span
// per call and the trace context sent along. Every connection one Mandate
// service opens to another needs it, or the trace stops there.
func GRPCClientOption() grpc.DialOption {
	return grpc.WithStatsHandler(otelgrpc.NewClientHandler())
}

// Enabled reports whether cfg names an endpoint (flag or variable) and
// export is not switched off, i.e. whether Setup would export.
func Enabled(cfg Config) bool {
	ep, _, err := cfg.resolve()
	return err == nil && ep != ""
}

// Setup installs the global propagator and, when an endpoint is
// configured, a global TracerProvider exporting the spans of service (e.g.
// "executor", reported as service.name "mandate-executor"). The returned
// shutdown flushes buffered spans and stops the exporter; call it once, on
// exit, with a context bounding how long the flush may take. An invalid
// setting is an error naming it; an unreachable collector is not (spans are
// dropped and the failure logged).
func Setup(ctx context.Context, service string, cfg Config) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(Propagator())
	noop := func(context.Context) error { return nil }
	endpoint, protocol, err := cfg.resolve()
	if err != nil || endpoint == "" {
		return noop, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	var exp sdktrace.SpanExporter
	switch protocol {
	case ProtocolGRPC:
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(endpoint))
	case ProtocolHTTP:
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(endpoint))
	}
	if err != nil {
		return noop, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	name := ServicePrefix + service
	if v, ok := cfg.lookup("OTEL_SERVICE_NAME"); ok && v != "" {
		name = v
	}
	version := cfg.Version
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
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry", "err", err)
	}))
	log.Info("exporting traces", "endpoint", redactURL(endpoint), "protocol", protocol, "service_name", name)
	return tp.Shutdown, nil
}

// resolve returns the endpoint ("" when export is off) and protocol.
func (c Config) resolve() (endpoint, protocol string, err error) {
	if v, _ := c.lookup("OTEL_SDK_DISABLED"); strings.EqualFold(strings.TrimSpace(v), "true") {
		return "", "", nil
	}
	if v, _ := c.lookup("OTEL_TRACES_EXPORTER"); strings.EqualFold(strings.TrimSpace(v), "none") {
		return "", "", nil
	}
	protocol = c.Protocol
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
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
		return "", "", fmt.Errorf("telemetry: OTLP protocol %q is not supported (grpc or http/protobuf)", protocol)
	}
	source, signalSpecific := "--otlp-endpoint", true
	endpoint = strings.TrimSpace(c.Endpoint)
	if endpoint == "" {
		if v, ok := c.lookup("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); ok && strings.TrimSpace(v) != "" {
			endpoint, source = strings.TrimSpace(v), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
		} else if v, ok := c.lookup("OTEL_EXPORTER_OTLP_ENDPOINT"); ok && strings.TrimSpace(v) != "" {
			endpoint, source, signalSpecific = strings.TrimSpace(v), "OTEL_EXPORTER_OTLP_ENDPOINT", false
		}
	}
	if endpoint == "" {
		return "", protocol, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", "", fmt.Errorf("telemetry: %s must be a URL such as http://collector:4317, not %q", source, redactURL(endpoint))
	}
	if protocol == ProtocolHTTP && !signalSpecific {
		// The generic variable names the collector's base URL; traces go
		// to its /v1/traces (OTLP exporter specification).
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
		endpoint = u.String()
	}
	return endpoint, protocol, nil
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
