package telemetry_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/mandate-dev/mandate/internal/telemetry"
)

// The test service t.T: unary methods that answer with the code they
// are named for, a stream of three replies (Stream) and a stream that
// waits for its caller to go (Hang). Any other method reaches the
// unknown-service handler, as on the executor, which refuses it.
var testCodes = map[string]codes.Code{
	"/t.T/OK":     codes.OK,
	"/t.T/Denied": codes.PermissionDenied,
	"/t.T/Broken": codes.Internal,
}

func unaryTest(name string) grpc.MethodHandler {
	c := testCodes[name]
	return func(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		in := &emptypb.Empty{}
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(context.Context, any) (any, error) {
			if c != codes.OK {
				return nil, status.Error(c, "refused")
			}
			return &emptypb.Empty{}, nil
		}
		if interceptor == nil {
			return h(ctx, in)
		}
		return interceptor(ctx, in, &grpc.UnaryServerInfo{FullMethod: name}, h)
	}
}

var testService = grpc.ServiceDesc{
	ServiceName: "t.T",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "OK", Handler: unaryTest("/t.T/OK")},
		{MethodName: "Denied", Handler: unaryTest("/t.T/Denied")},
		{MethodName: "Broken", Handler: unaryTest("/t.T/Broken")},
	},
	Streams: []grpc.StreamDesc{
		{StreamName: "Stream", ServerStreams: true, Handler: func(_ any, ss grpc.ServerStream) error {
			if err := ss.RecvMsg(&emptypb.Empty{}); err != nil {
				return err
			}
			for range 3 {
				if err := ss.SendMsg(&emptypb.Empty{}); err != nil {
					return err
				}
			}
			return nil
		}},
		{StreamName: "Hang", ServerStreams: true, Handler: func(_ any, ss grpc.ServerStream) error {
			<-ss.Context().Done()
			return ss.Context().Err()
		}},
	},
}

func refuseUnknown(any, grpc.ServerStream) error {
	return status.Error(codes.Unimplemented, "no such method")
}

// recorded is what the global providers recorded during a test.
type recorded struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
}

// withProviders installs recording global providers for the test; the
// instrumentation must be built after it.
func withProviders(t testing.TB) recorded {
	t.Helper()
	r := recorded{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader)))
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
	})
	return r
}

// instrumentedPair serves the test service with the server interceptors
// (methods under /t.T/ known, the rest OtherMethod) and dials it with the
// client's options.
func instrumentedPair(t testing.TB, server []grpc.ServerOption, client []grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append(server, grpc.UnknownServiceHandler(refuseUnknown), grpc.WaitForHandlers(true))...)
	srv.RegisterService(&testService, struct{}{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), append(client, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(); srv.GracefulStop(); <-done })
	return conn
}

func instrumented(t testing.TB) *grpc.ClientConn {
	tel := telemetry.NewGRPCServer(func(m string) bool { return strings.HasPrefix(m, "/t.T/") }, nil)
	return instrumentedPair(t,
		[]grpc.ServerOption{grpc.ChainUnaryInterceptor(tel.Unary), grpc.ChainStreamInterceptor(tel.Stream)},
		telemetry.GRPCClientOptions())
}

// point is one data point of a duration histogram.
type point struct {
	attrs map[string]string
	count uint64
}

func durations(t *testing.T, r recorded, name string) []point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var ps []point
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if m.Name != name || !ok {
				continue
			}
			if m.Unit != "s" {
				t.Errorf("%s in %q, want seconds", name, m.Unit)
			}
			for _, dp := range h.DataPoints {
				p := point{attrs: map[string]string{}, count: dp.Count}
				for _, kv := range dp.Attributes.ToSlice() {
					p.attrs[string(kv.Key)] = kv.Value.String()
				}
				ps = append(ps, p)
			}
		}
	}
	return ps
}

// find is the data point whose attributes include want, and reports
// whether there is exactly one.
func find(ps []point, want map[string]string) (point, bool) {
	var found []point
outer:
	for _, p := range ps {
		for k, v := range want {
			if p.attrs[k] != v {
				continue outer
			}
		}
		found = append(found, p)
	}
	if len(found) != 1 {
		return point{}, false
	}
	return found[0], true
}

// TestGRPCCallsAreTracedAndMeasured: each call is a client span and a
// server span of one trace, named for the method, and one observation of
// each side's duration histogram with the method and the status code. A
// refusal (PermissionDenied) fails the client's span but not the
// server's; a fault of the server (Internal) fails both, and adds
// error.type to their histograms.
func TestGRPCCallsAreTracedAndMeasured(t *testing.T) {
	r := withProviders(t)
	conn := instrumented(t)
	for _, m := range []string{"/t.T/OK", "/t.T/Denied", "/t.T/Broken", "/t.T/OK"} {
		err := conn.Invoke(t.Context(), m, &emptypb.Empty{}, &emptypb.Empty{})
		if status.Code(err) != testCodes[m] {
			t.Fatalf("%s: %v", m, err)
		}
	}
	spans := r.spans.Ended()
	clients, servers := map[string][]sdktrace.ReadOnlySpan{}, map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		switch s.SpanKind().String() {
		case "client":
			clients[s.Name()] = append(clients[s.Name()], s)
		case "server":
			servers[s.Name()] = append(servers[s.Name()], s)
		}
	}
	if len(clients["t.T/OK"]) != 2 || len(servers["t.T/OK"]) != 2 || len(clients["t.T/Denied"]) != 1 || len(servers["t.T/Broken"]) != 1 {
		t.Fatalf("spans: %d client, %d server: %v %v", len(clients), len(servers), clients, servers)
	}
	for name, cs := range clients {
		for i, c := range cs {
			s := servers[name][i]
			if s.Parent().SpanID() != c.SpanContext().SpanID() || s.SpanContext().TraceID() != c.SpanContext().TraceID() {
				t.Errorf("%s: the server span is not the client span's child", name)
			}
		}
	}
	wantStatus := map[string][2]otelcodes.Code{ // client, server
		"t.T/OK":     {otelcodes.Unset, otelcodes.Unset},
		"t.T/Denied": {otelcodes.Error, otelcodes.Unset},
		"t.T/Broken": {otelcodes.Error, otelcodes.Error},
	}
	for name, w := range wantStatus {
		if c, s := clients[name][0].Status().Code, servers[name][0].Status().Code; c != w[0] || s != w[1] {
			t.Errorf("%s: span status client %v server %v, want %v", name, c, s, w)
		}
		attrs := attribute.NewSet(servers[name][0].Attributes()...)
		if v, _ := attrs.Value("rpc.method"); v.AsString() != name {
			t.Errorf("%s: server span rpc.method %q", name, v.AsString())
		}
	}

	server, client := durations(t, r, "rpc.server.call.duration"), durations(t, r, "rpc.client.call.duration")
	cases := []struct {
		method, code, serverErr, clientErr string
		count                              uint64
	}{
		{"t.T/OK", "OK", "", "", 2},
		{"t.T/Denied", "PERMISSION_DENIED", "", "PERMISSION_DENIED", 1},
		{"t.T/Broken", "INTERNAL", "INTERNAL", "INTERNAL", 1},
	}
	for _, c := range cases {
		want := map[string]string{"rpc.method": c.method, "rpc.response.status_code": c.code, "rpc.system.name": "grpc"}
		p, ok := find(server, want)
		if !ok || p.count != c.count || p.attrs["error.type"] != c.serverErr {
			t.Errorf("server duration of %s: %+v (found %v), want %d with error.type %q", c.method, p, ok, c.count, c.serverErr)
		}
		p, ok = find(client, want)
		if !ok || p.count != c.count || p.attrs["error.type"] != c.clientErr || p.attrs["server.address"] != "127.0.0.1" || p.attrs["server.port"] == "" {
			t.Errorf("client duration of %s: %+v (found %v), want %d with error.type %q", c.method, p, ok, c.count, c.clientErr)
		}
	}
}

// TestGRPCUnknownMethodsAreOther: a method the server does not serve is
// _OTHER on the server's span and histogram however the caller names it,
// so made-up names add no series.
func TestGRPCUnknownMethodsAreOther(t *testing.T) {
	r := withProviders(t)
	conn := instrumented(t)
	for _, m := range []string{"/made.up/A", "/made.up/B", "/other.Svc/C"} {
		if err := conn.Invoke(t.Context(), m, &emptypb.Empty{}, &emptypb.Empty{}); status.Code(err) != codes.Unimplemented {
			t.Fatalf("%s: %v", m, err)
		}
	}
	server := durations(t, r, "rpc.server.call.duration")
	if len(server) != 1 || server[0].attrs["rpc.method"] != telemetry.OtherMethod || server[0].count != 3 {
		t.Fatalf("server durations %+v, want one series of %s with 3 calls", server, telemetry.OtherMethod)
	}
	for _, s := range r.spans.Ended() {
		if s.SpanKind().String() == "server" && s.Name() != telemetry.OtherMethod {
			t.Errorf("server span %q", s.Name())
		}
	}
}

// TestGRPCClientStreamSpansEnd: a stream's client span ends when the
// stream does — read to its end (OK), or abandoned by its context
// (CANCELLED) without another read.
func TestGRPCClientStreamSpansEnd(t *testing.T) {
	r := withProviders(t)
	conn := instrumented(t)
	desc := &grpc.StreamDesc{ServerStreams: true}
	s, err := conn.NewStream(t.Context(), desc, "/t.T/Stream")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SendMsg(&emptypb.Empty{}); err != nil {
		t.Fatal(err)
	}
	_ = s.CloseSend()
	n := 0
	for {
		err := s.RecvMsg(&emptypb.Empty{})
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 3 {
		t.Fatalf("%d replies", n)
	}
	ctx, cancel := context.WithCancel(t.Context())
	hang, err := conn.NewStream(ctx, desc, "/t.T/Hang")
	if err != nil {
		t.Fatal(err)
	}
	_ = hang.SendMsg(&emptypb.Empty{})
	cancel()
	client := func() map[string]string {
		got := map[string]string{}
		for _, sp := range r.spans.Ended() {
			if sp.SpanKind().String() == "client" {
				set := attribute.NewSet(sp.Attributes()...)
				v, _ := set.Value("rpc.response.status_code")
				got[sp.Name()] = v.AsString()
			}
		}
		return got
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(client()) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := client(); got["t.T/Stream"] != "OK" || got["t.T/Hang"] != "CANCELLED" {
		t.Fatalf("client spans ended: %v, want t.T/Stream OK and t.T/Hang CANCELLED", got)
	}
}

// BenchmarkGRPCHop: one unary call over loopback with no instrumentation,
// with Mandate's, and with otelgrpc's stats handlers, under an SDK tracer
// provider that samples nothing and a meter provider with a reader — a
// service with Prometheus on and traces off. -benchmem gives the
// allocations each adds to a call (both sides).
func BenchmarkGRPCHop(b *testing.B) {
	run := func(b *testing.B, server func() []grpc.ServerOption, client func() []grpc.DialOption) {
		otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())))
		otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())))
		b.Cleanup(func() {
			otel.SetTracerProvider(noop.NewTracerProvider())
			otel.SetMeterProvider(metricnoop.NewMeterProvider())
		})
		conn := instrumentedPair(b, server(), client())
		ctx := context.Background()
		if err := conn.Invoke(ctx, "/t.T/OK", &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if err := conn.Invoke(ctx, "/t.T/OK", &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("none", func(b *testing.B) {
		run(b, func() []grpc.ServerOption { return nil }, func() []grpc.DialOption { return nil })
	})
	b.Run("mandate", func(b *testing.B) {
		run(b, func() []grpc.ServerOption {
			tel := telemetry.NewGRPCServer(nil, nil)
			return []grpc.ServerOption{grpc.ChainUnaryInterceptor(tel.Unary), grpc.ChainStreamInterceptor(tel.Stream)}
		}, telemetry.GRPCClientOptions)
	})
	b.Run("otelgrpc", func(b *testing.B) {
		run(b, func() []grpc.ServerOption {
			return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler())}
		}, func() []grpc.DialOption {
			return []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler())}
		})
	})
}

// TestGRPCHostileTraceContext: the trace context is whatever the caller
// put in its metadata. A malformed traceparent, one of another version's
// shape, two of them, an oversized baggage: each call is served, and its
// server span starts a trace of its own unless the context is valid —
// never a panic, never the caller's made-up ids.
func TestGRPCHostileTraceContext(t *testing.T) {
	r := withProviders(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tel := telemetry.NewGRPCServer(nil, nil)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(tel.Unary), grpc.WaitForHandlers(true))
	srv.RegisterService(&testService, struct{}{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.GracefulStop()
	// A plain connection: the metadata is the test's, as a hostile
	// client's would be.
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	const valid = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	cases := []struct {
		name string
		md   []string
		keep bool // the server span continues the caller's trace
	}{
		{"valid", []string{"traceparent", valid}, true},
		{"garbage", []string{"traceparent", "not-a-trace"}, false},
		{"zero trace id", []string{"traceparent", "00-00000000000000000000000000000000-b7ad6b7169203331-01"}, false},
		{"version ff", []string{"traceparent", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, false},
		{"two of them", []string{"traceparent", valid, "traceparent", "00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, true},
		{"huge baggage", []string{"traceparent", valid, "baggage", strings.Repeat("k=v,", 4000)}, true},
		{"huge tracestate", []string{"traceparent", valid, "tracestate", strings.Repeat("a=b,", 4000)}, true},
	}
	for _, c := range cases {
		ctx := metadata.AppendToOutgoingContext(t.Context(), c.md...)
		if err := conn.Invoke(ctx, "/t.T/OK", &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		spans := r.spans.Ended()
		last := spans[len(spans)-1]
		kept := last.SpanContext().TraceID().String() == "0af7651916cd43dd8448eb211c80319c"
		if kept != c.keep || !last.SpanContext().IsValid() {
			t.Errorf("%s: server span in trace %s (kept %v, want %v)", c.name, last.SpanContext().TraceID(), kept, c.keep)
		}
	}
}
