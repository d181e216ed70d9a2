// Package telemetrytest is an in-process OTLP collector for tests: it
// accepts spans and metrics over OTLP/gRPC and OTLP/HTTP (protobuf) on
// loopback and keeps them for assertions, so a test can point real service
// processes at it and check that one trace crosses all of them and what
// each one counted.
package telemetrytest

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	collectormetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Protocols a span or a metric can arrive by (Span.Protocol,
// Metric.Protocol).
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// Span is one received span, flattened.
type Span struct {
	// Service is the resource's service.name, e.g. "mandate-executor".
	Service string
	// TraceID, SpanID and ParentSpanID are lower-case hex; ParentSpanID is
	// empty for a root span.
	TraceID, SpanID, ParentSpanID string
	// Name is the span name, e.g. "mandate.v1.ExecutorService/Execute".
	Name string
	// Kind is server, client, internal, producer or consumer.
	Kind string
	// Attributes holds the span's attributes, values formatted as text.
	Attributes map[string]string
	// Resource holds the resource attributes (service.name,
	// service.version, …), values formatted as text.
	Resource map[string]string
	// Protocol is how the span arrived: grpc or http/protobuf.
	Protocol string
}

// Metric is one received data point, flattened. Exporters send cumulative
// values by default, so each export repeats every point with its total so
// far: Last finds the newest.
type Metric struct {
	// Service is the resource's service.name, e.g. "mandate-executor".
	Service string
	// Scope is the instrumentation scope (meter) name, e.g.
	// "mandate/executor".
	Scope string
	// Name and Unit are the instrument's, e.g. "mandate.executor.calls".
	Name, Unit string
	// Kind is sum, gauge, histogram, exponential_histogram or summary.
	Kind string
	// Attributes holds the data point's attributes, values formatted as
	// text.
	Attributes map[string]string
	// Value is a sum's or gauge's value, and a histogram's or summary's sum
	// of observations.
	Value float64
	// Count is the number of observations of a histogram or summary.
	Count uint64
	// Resource holds the resource attributes, values formatted as text.
	Resource map[string]string
	// Protocol is how the point arrived: grpc or http/protobuf.
	Protocol string
}

// Collector receives OTLP trace and metric exports. The zero value is ready
// to Start.
type Collector struct {
	collectortrace.UnimplementedTraceServiceServer

	mu       sync.Mutex
	spans    []Span
	metrics  []Metric
	changed  chan struct{} // closed (and replaced) on every export
	grpcAddr string
	httpAddr string
}

// Start listens for OTLP/gRPC and OTLP/HTTP on loopback ports, stops when
// the test ends, and returns the gRPC endpoint URL (http://127.0.0.1:PORT),
// the value for --otlp-endpoint or OTEL_EXPORTER_OTLP_ENDPOINT.
func (c *Collector) Start(t testing.TB) string {
	t.Helper()
	c.mu.Lock()
	if c.changed == nil {
		c.changed = make(chan struct{})
	}
	c.mu.Unlock()

	glis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("telemetrytest: %v", err)
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = glis.Close()
		t.Fatalf("telemetrytest: %v", err)
	}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, c)
	collectormetrics.RegisterMetricsServiceServer(gs, metricsService{c: c})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		var req collectortrace.ExportTraceServiceRequest
		if serveHTTP(w, r, &req, &collectortrace.ExportTraceServiceResponse{}) {
			c.add(&req, ProtocolHTTP)
		}
	})
	mux.HandleFunc("POST /v1/metrics", func(w http.ResponseWriter, r *http.Request) {
		var req collectormetrics.ExportMetricsServiceRequest
		if serveHTTP(w, r, &req, &collectormetrics.ExportMetricsServiceResponse{}) {
			c.addMetrics(&req, ProtocolHTTP)
		}
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = gs.Serve(glis) })
	wg.Go(func() { _ = hs.Serve(hlis) })
	t.Cleanup(func() {
		gs.Stop()
		_ = hs.Close()
		wg.Wait()
	})
	c.mu.Lock()
	c.grpcAddr, c.httpAddr = glis.Addr().String(), hlis.Addr().String()
	c.mu.Unlock()
	return c.Endpoint()
}

// Endpoint is the OTLP/gRPC endpoint URL (after Start).
func (c *Collector) Endpoint() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return "http://" + c.grpcAddr
}

// HTTPEndpoint is the OTLP/HTTP base URL (after Start): exporters given it
// in OTEL_EXPORTER_OTLP_ENDPOINT post to its /v1/traces and /v1/metrics.
func (c *Collector) HTTPEndpoint() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return "http://" + c.httpAddr
}

// Env returns the variables that point a process's exporter at this
// collector over gRPC, to append to exec.Cmd.Env.
func (c *Collector) Env() []string {
	return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + c.Endpoint(), "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"}
}

// Spans returns every span received so far, in arrival order.
func (c *Collector) Spans() []Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Span(nil), c.spans...)
}

// Metrics returns every data point received so far, in arrival order.
func (c *Collector) Metrics() []Metric {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Metric(nil), c.metrics...)
}

// Last returns the newest point among ms of the metric name from service
// ("" for any) whose attributes include every one of attrs — with
// cumulative export, the total so far of that series.
func Last(ms []Metric, service, name string, attrs map[string]string) (Metric, bool) {
	for i := len(ms) - 1; i >= 0; i-- {
		m := ms[i]
		if m.Name != name || service != "" && m.Service != service {
			continue
		}
		match := true
		for k, v := range attrs {
			if got, ok := m.Attributes[k]; !ok || got != v {
				match = false
				break
			}
		}
		if match {
			return m, true
		}
	}
	return Metric{}, false
}

// Trace returns the received spans of one trace.
func (c *Collector) Trace(traceID string) []Span {
	var out []Span
	for _, s := range c.Spans() {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

// Services returns the sorted, distinct service names among spans.
func Services(spans []Span) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range spans {
		if !seen[s.Service] {
			seen[s.Service] = true
			out = append(out, s.Service)
		}
	}
	sort.Strings(out)
	return out
}

// Wait returns the spans received so far as soon as done reports true for
// them, or ctx's error (with the spans seen) when ctx ends first. Exporters
// batch, so a test usually stops the processes (which flush on exit) or
// waits here with a deadline.
func (c *Collector) Wait(ctx context.Context, done func([]Span) bool) ([]Span, error) {
	for {
		c.mu.Lock()
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
		spans, changed := append([]Span(nil), c.spans...), c.changed
		c.mu.Unlock()
		if done(spans) {
			return spans, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return spans, fmt.Errorf("telemetrytest: %w (%d spans received)", ctx.Err(), len(spans))
		}
	}
}

// WaitMetrics is Wait for metrics: it returns the points received so far
// as soon as done reports true for them, or ctx's error when ctx ends
// first.
func (c *Collector) WaitMetrics(ctx context.Context, done func([]Metric) bool) ([]Metric, error) {
	for {
		c.mu.Lock()
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
		metrics, changed := append([]Metric(nil), c.metrics...), c.changed
		c.mu.Unlock()
		if done(metrics) {
			return metrics, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return metrics, fmt.Errorf("telemetrytest: %w (%d metric points received)", ctx.Err(), len(metrics))
		}
	}
}

// Export implements the OTLP/gRPC trace service.
func (c *Collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.add(req, ProtocolGRPC)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// metricsService is the OTLP/gRPC metrics service of a Collector (a type
// of its own: both services name their method Export).
type metricsService struct {
	collectormetrics.UnimplementedMetricsServiceServer
	c *Collector
}

// Export implements the OTLP/gRPC metrics service.
func (s metricsService) Export(_ context.Context, req *collectormetrics.ExportMetricsServiceRequest) (*collectormetrics.ExportMetricsServiceResponse, error) {
	s.c.addMetrics(req, ProtocolGRPC)
	return &collectormetrics.ExportMetricsServiceResponse{}, nil
}

// serveHTTP decodes an OTLP/HTTP protobuf request into req and answers
// with resp; false when it answered with an error instead.
func serveHTTP(w http.ResponseWriter, r *http.Request, req, resp proto.Message) bool {
	body := io.Reader(r.Body)
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return false
		}
		defer func() { _ = zr.Close() }()
		body = zr
	}
	b, err := io.ReadAll(io.LimitReader(body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, errors.New("telemetrytest: only application/x-protobuf is accepted, not "+ct).Error(), http.StatusUnsupportedMediaType)
		return false
	}
	if err := proto.Unmarshal(b, req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	out, _ := proto.Marshal(resp)
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
	return true
}

func (c *Collector) add(req *collectortrace.ExportTraceServiceRequest, protocol string) {
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				got = append(got, Span{
					Service:      res["service.name"],
					TraceID:      hex.EncodeToString(sp.GetTraceId()),
					SpanID:       hex.EncodeToString(sp.GetSpanId()),
					ParentSpanID: hex.EncodeToString(sp.GetParentSpanId()),
					Name:         sp.GetName(),
					Kind:         kind(sp.GetKind()),
					Attributes:   attrs(sp.GetAttributes()),
					Resource:     res,
					Protocol:     protocol,
				})
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.spans = append(c.spans, got...)
	c.notify()
}

func (c *Collector) addMetrics(req *collectormetrics.ExportMetricsServiceRequest, protocol string) {
	var got []Metric
	for _, rm := range req.GetResourceMetrics() {
		res := attrs(rm.GetResource().GetAttributes())
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				base := Metric{Service: res["service.name"], Scope: sm.GetScope().GetName(), Name: m.GetName(), Unit: m.GetUnit(), Resource: res, Protocol: protocol}
				got = append(got, points(base, m)...)
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.metrics = append(c.metrics, got...)
	c.notify()
}

// notify wakes Wait; c.mu is held.
func (c *Collector) notify() {
	if c.changed != nil {
		close(c.changed)
	}
	c.changed = make(chan struct{})
}

// points flattens the data points of one metric.
func points(base Metric, m *metricspb.Metric) []Metric {
	var out []Metric
	number := func(kind string, dps []*metricspb.NumberDataPoint) {
		for _, dp := range dps {
			p := base
			p.Kind, p.Attributes = kind, attrs(dp.GetAttributes())
			switch v := dp.GetValue().(type) {
			case *metricspb.NumberDataPoint_AsInt:
				p.Value = float64(v.AsInt)
			case *metricspb.NumberDataPoint_AsDouble:
				p.Value = v.AsDouble
			}
			out = append(out, p)
		}
	}
	switch d := m.GetData().(type) {
	case *metricspb.Metric_Sum:
		number("sum", d.Sum.GetDataPoints())
	case *metricspb.Metric_Gauge:
		number("gauge", d.Gauge.GetDataPoints())
	case *metricspb.Metric_Histogram:
		for _, dp := range d.Histogram.GetDataPoints() {
			p := base
			p.Kind, p.Attributes, p.Value, p.Count = "histogram", attrs(dp.GetAttributes()), dp.GetSum(), dp.GetCount()
			out = append(out, p)
		}
	case *metricspb.Metric_ExponentialHistogram:
		for _, dp := range d.ExponentialHistogram.GetDataPoints() {
			p := base
			p.Kind, p.Attributes, p.Value, p.Count = "exponential_histogram", attrs(dp.GetAttributes()), dp.GetSum(), dp.GetCount()
			out = append(out, p)
		}
	case *metricspb.Metric_Summary:
		for _, dp := range d.Summary.GetDataPoints() {
			p := base
			p.Kind, p.Attributes, p.Value, p.Count = "summary", attrs(dp.GetAttributes()), dp.GetSum(), dp.GetCount()
			out = append(out, p)
		}
	}
	return out
}

func kind(k tracepb.Span_SpanKind) string {
	switch k {
	case tracepb.Span_SPAN_KIND_SERVER:
		return "server"
	case tracepb.Span_SPAN_KIND_CLIENT:
		return "client"
	case tracepb.Span_SPAN_KIND_PRODUCER:
		return "producer"
	case tracepb.Span_SPAN_KIND_CONSUMER:
		return "consumer"
	default:
		return "internal"
	}
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		out[kv.GetKey()] = value(kv.GetValue())
	}
	return out
}

func value(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonpb.AnyValue_BytesValue:
		return hex.EncodeToString(x.BytesValue)
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}
