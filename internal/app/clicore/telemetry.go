package clicore

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/telemetry"
)

// traceFlushTimeout bounds how long a stopping process waits for its last
// spans and metrics to reach the collector.
const traceFlushTimeout = 5 * time.Second

// OTLPFlag declares --otlp-endpoint (MANDATE_OTLP_ENDPOINT). Left empty,
// the standard OTEL_EXPORTER_OTLP_* variables apply.
func OTLPFlag(s *config.Set, p *string) {
	s.String(p, "otlp-endpoint", "", "OTLP collector URL for traces and metrics, e.g. http://jaeger:4317 "+
		"(default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / _METRICS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT; none: no export)")
}

// MetricsFlag declares --metrics (MANDATE_METRICS): Prometheus /metrics on
// the HTTP port, on unless switched off (--metrics=false,
// MANDATE_METRICS=false).
func MetricsFlag(s *config.Set, p *bool) {
	s.Bool(p, "metrics", true, "serve Prometheus metrics at GET /metrics on the HTTP port (--metrics=false: off)")
}

// StartTracing installs the W3C propagator and, when an endpoint is
// configured, exports the spans and metrics of service ("executor" reports
// as "mandate-executor"). With metrics on, it also returns the handler of
// GET /metrics (server.Config.Metrics), which serves the same instruments
// for Prometheus. The exporters are flushed and stopped by cl, after
// everything added to cl later has closed. Every service subcommand calls
// it right after its logger exists, before it builds its servers, clients
// and the executor, which take their meter from the global provider it
// installs:
//
//	metrics, err := StartTracing(ctx, io, "mcpbridge", endpoint, true, log, &cl)
func StartTracing(ctx context.Context, io IO, service, endpoint string, metrics bool, log *slog.Logger, cl *Closers) (http.Handler, error) {
	in, err := telemetry.Install(ctx, service, telemetry.Config{Endpoint: endpoint, Env: io.Env, Logger: log, Prometheus: metrics})
	if err != nil {
		return nil, err
	}
	cl.Add(func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), traceFlushTimeout)
		defer cancel()
		if err := in.Shutdown(fctx); err != nil {
			log.Warn("flushing traces and metrics", "err", err)
		}
	})
	return in.Metrics, nil
}

// Tracing is StartTracing with the service's --otlp-endpoint and --metrics.
func (f *ServiceFlags) Tracing(ctx context.Context, io IO, service string, log *slog.Logger, cl *Closers) (http.Handler, error) {
	return StartTracing(ctx, io, service, f.OTLPEndpoint, f.Metrics, log, cl)
}
