// Package telemetrytest is an in-process OTLP trace collector for tests:
// it accepts spans over OTLP/gRPC and OTLP/HTTP (protobuf) on loopback and
// keeps them for assertions, so a test can point real service processes at
// it and check that one trace crosses all of them.
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

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Protocols a span can arrive by (Span.Protocol).
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

// Collector receives OTLP trace exports. The zero value is ready to Start.
type Collector struct {
	collectortrace.UnimplementedTraceServiceServer

	mu       sync.Mutex
	spans    []Span
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
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", c.serveHTTP)
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
// in OTEL_EXPORTER_OTLP_ENDPOINT post to its /v1/traces.
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

// Export implements the OTLP/gRPC trace service.
func (c *Collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.add(req, ProtocolGRPC)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (c *Collector) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body := io.Reader(r.Body)
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		defer func() { _ = zr.Close() }()
		body = zr
	}
	b, err := io.ReadAll(io.LimitReader(body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, errors.New("telemetrytest: only application/x-protobuf is accepted, not "+ct).Error(), http.StatusUnsupportedMediaType)
		return
	}
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.add(&req, ProtocolHTTP)
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
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
	if c.changed != nil {
		close(c.changed)
	}
	c.changed = make(chan struct{})
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
