package telemetry

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/rpcconv"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The gRPC instrumentation of every Mandate connection and server: a span
// per call, the W3C trace context carried across the hop, and the
// semantic conventions' call-duration histograms (rpc.server.call.duration,
// rpc.client.call.duration, in seconds, with rpc.method, rpc.system.name,
// rpc.response.status_code and, for a failure, error.type; a client's also
// with server.address and server.port of its dial target).
//
// It is made of interceptors rather than a gRPC stats handler (otelgrpc's):
// a stats handler makes gRPC build an event for every header, message and
// trailer of every call — copying the metadata of each — whether or not
// anything is recorded, and otelgrpc copied the metadata again to read or
// write the trace context. On a governed call, which crosses three gRPC
// hops where an ungoverned one crosses one, that was 165 of its 1,197
// allocations (cmd/mandate-bench; docs/architecture/topology.md). Here the
// trace context is read and appended key by key, and the attribute set of
// each method and status code is built once.
//
// What it gives up: a call gRPC refuses before any interceptor runs (an
// unknown method on a server without an unknown-service handler, a
// malformed request line) has no span and is not in the histogram — it
// never reached a handler, and the HTTP/2 transport counts it.

// scopeName is the instrumentation scope of the spans and histograms.
const scopeName = "github.com/mandate-dev/mandate/internal/telemetry"

// OtherMethod stands, on spans and histograms, for a method the server
// does not serve: the semantic conventions' _OTHER. A caller names any
// method it likes, and each name would be a new series.
const OtherMethod = "_OTHER"

// durationBuckets are the histogram's boundaries, in seconds.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// rpcCodes is the number of gRPC status codes (OK to Unauthenticated).
const rpcCodes = 17

// rpcMethod is what is known of one method on one side of a call, built
// once: the span's name and options, and the histogram's attributes for
// each status code.
type rpcMethod struct {
	name     string
	spanOpts []trace.SpanStartOption
	base     []attribute.KeyValue
	mu       sync.Mutex
	record   [rpcCodes][]metric.RecordOption
}

// recordOptions is the histogram's attributes for a call that ended with
// code, failed (error.type) or not — a slice, so that passing it to
// Record allocates nothing. Whether a code is a failure is fixed per
// side, so the code alone is the key.
func (m *rpcMethod) recordOptions(code codes.Code, failed bool) []metric.RecordOption {
	if int(code) >= rpcCodes {
		return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(m.attributes(code, failed)...))}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.record[code] == nil {
		m.record[code] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(m.attributes(code, failed)...))}
	}
	return m.record[code]
}

func (m *rpcMethod) attributes(code codes.Code, failed bool) []attribute.KeyValue {
	kv := append(append(make([]attribute.KeyValue, 0, len(m.base)+2), m.base...), semconv.RPCResponseStatusCode(canonicalCode(code)))
	if failed {
		kv = append(kv, semconv.ErrorTypeKey.String(canonicalCode(code)))
	}
	return kv
}

// maxMethods bounds the methods an instrumentation keeps built: past it,
// a method's attributes are built on each call. Servers name a method
// they do not serve OtherMethod, so the bound is only a guard.
const maxMethods = 4096

// rpcInstruments is one side's tracer, histogram and methods.
type rpcInstruments struct {
	server   bool
	tracer   trace.Tracer
	duration metric.Float64Histogram
	prop     propagation.TextMapPropagator

	mu      sync.RWMutex
	methods map[methodKey]*rpcMethod
}

type methodKey struct{ method, target string }

func newRPCInstruments(server bool) *rpcInstruments {
	in := &rpcInstruments{
		server:  server,
		tracer:  otel.GetTracerProvider().Tracer(scopeName),
		prop:    Propagator(),
		methods: map[methodKey]*rpcMethod{},
	}
	meter := otel.GetMeterProvider().Meter(scopeName, metric.WithSchemaURL(semconv.SchemaURL))
	buckets := metric.WithExplicitBucketBoundaries(durationBuckets...)
	if server {
		if d, err := rpcconv.NewServerCallDuration(meter, buckets); err != nil {
			otel.Handle(err)
		} else {
			in.duration = d.Inst()
		}
	} else {
		if d, err := rpcconv.NewClientCallDuration(meter, buckets); err != nil {
			otel.Handle(err)
		} else {
			in.duration = d.Inst()
		}
	}
	return in
}

// method returns what is built for a full method ("/pkg.Service/Method",
// or OtherMethod) called on target (a client's dial target; "" on a
// server).
func (in *rpcInstruments) method(fullMethod, target string) *rpcMethod {
	k := methodKey{fullMethod, target}
	in.mu.RLock()
	m := in.methods[k]
	in.mu.RUnlock()
	if m != nil {
		return m
	}
	m = in.build(fullMethod, target)
	in.mu.Lock()
	if have := in.methods[k]; have != nil {
		m = have
	} else if len(in.methods) < maxMethods {
		in.methods[k] = m
	}
	in.mu.Unlock()
	return m
}

func (in *rpcInstruments) build(fullMethod, target string) *rpcMethod {
	name := strings.TrimPrefix(fullMethod, "/")
	base := []attribute.KeyValue{semconv.RPCMethod(name), semconv.RPCSystemNameGRPC}
	kind := trace.SpanKindServer
	if !in.server {
		kind = trace.SpanKindClient
		if host, port, ok := targetAddress(target); ok {
			base = append(base, semconv.ServerAddress(host))
			if port > 0 {
				base = append(base, semconv.ServerPort(port))
			}
		}
	}
	return &rpcMethod{
		name:     name,
		base:     base,
		spanOpts: []trace.SpanStartOption{trace.WithSpanKind(kind), trace.WithAttributes(base...)},
	}
}

// targetAddress is the host and port of a dial target ("host:port",
// "dns:///host:port", "passthrough:///host:port").
func targetAddress(target string) (string, int, bool) {
	if target == "" {
		return "", 0, false
	}
	if i := strings.Index(target, ":///"); i >= 0 {
		target = target[i+4:]
	}
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return target, 0, true
	}
	p, _ := strconv.Atoi(port)
	return host, p, true
}

// end ends a call's span and records its duration.
func (in *rpcInstruments) end(ctx context.Context, span trace.Span, m *rpcMethod, start time.Time, err error) {
	code := status.Code(err)
	// A client failed on any error; a server only on those that are its
	// own fault, as the semantic conventions say (a refusal is not).
	failed := err != nil && (!in.server || serverFault(code))
	if span.IsRecording() {
		span.SetAttributes(semconv.RPCResponseStatusCode(canonicalCode(code)))
		if failed {
			span.SetStatus(otelcodes.Error, status.Convert(err).Message())
		}
	}
	span.End()
	if in.duration != nil && in.duration.Enabled(ctx) {
		in.duration.Record(ctx, time.Since(start).Seconds(), m.recordOptions(code, failed)...)
	}
}

// serverFault reports whether a server's status code is an error of the
// server's, not of the request.
func serverFault(c codes.Code) bool {
	switch c {
	case codes.Unknown, codes.DeadlineExceeded, codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss:
		return true
	}
	return false
}

// canonicalCode is the status code as the semantic conventions spell it.
func canonicalCode(c codes.Code) string {
	switch c {
	case codes.OK:
		return "OK"
	case codes.Canceled:
		return "CANCELLED"
	case codes.Unknown:
		return "UNKNOWN"
	case codes.InvalidArgument:
		return "INVALID_ARGUMENT"
	case codes.DeadlineExceeded:
		return "DEADLINE_EXCEEDED"
	case codes.NotFound:
		return "NOT_FOUND"
	case codes.AlreadyExists:
		return "ALREADY_EXISTS"
	case codes.PermissionDenied:
		return "PERMISSION_DENIED"
	case codes.ResourceExhausted:
		return "RESOURCE_EXHAUSTED"
	case codes.FailedPrecondition:
		return "FAILED_PRECONDITION"
	case codes.Aborted:
		return "ABORTED"
	case codes.OutOfRange:
		return "OUT_OF_RANGE"
	case codes.Unimplemented:
		return "UNIMPLEMENTED"
	case codes.Internal:
		return "INTERNAL"
	case codes.Unavailable:
		return "UNAVAILABLE"
	case codes.DataLoss:
		return "DATA_LOSS"
	case codes.Unauthenticated:
		return "UNAUTHENTICATED"
	}
	return "CODE(" + strconv.FormatInt(int64(c), 10) + ")"
}

// incomingCarrier reads the trace context from a call's incoming
// metadata key by key, without copying the rest of it.
type incomingCarrier struct{ ctx context.Context }

func (c incomingCarrier) Get(key string) string {
	if v := metadata.ValueFromIncomingContext(c.ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}
func (incomingCarrier) Set(string, string) {}
func (incomingCarrier) Keys() []string     { return nil }

// outgoingCarrier collects the trace context to append to a call's
// outgoing metadata.
type outgoingCarrier struct{ kv []string }

func (*outgoingCarrier) Get(string) string       { return "" }
func (c *outgoingCarrier) Set(key, value string) { c.kv = append(c.kv, key, value) }
func (*outgoingCarrier) Keys() []string          { return nil }

// GRPCServer is the instrumentation of one gRPC server: interceptors to
// put first in its chains.
type GRPCServer struct {
	in    *rpcInstruments
	known func(fullMethod string) bool
	skip  func(fullMethod string) bool
}

// NewGRPCServer instruments a server with the global tracer and meter
// providers (as they are when it is called, or the ones installed later:
// the global providers delegate). known reports whether the server
// serves a method (nil: every method it is called for); a call to any
// other is named OtherMethod. skip, when it reports true, leaves a call
// untraced and unmeasured (health probes).
func NewGRPCServer(known, skip func(fullMethod string) bool) *GRPCServer {
	return &GRPCServer{in: newRPCInstruments(true), known: known, skip: skip}
}

func (s *GRPCServer) start(ctx context.Context, fullMethod string) (context.Context, trace.Span, *rpcMethod) {
	if s.known != nil && !s.known(fullMethod) {
		fullMethod = OtherMethod
	}
	m := s.in.method(fullMethod, "")
	ctx = s.in.prop.Extract(ctx, incomingCarrier{ctx})
	ctx, span := s.in.tracer.Start(ctx, m.name, m.spanOpts...)
	return ctx, span, m
}

// Unary is the server's unary interceptor.
func (s *GRPCServer) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.skip != nil && s.skip(info.FullMethod) {
		return handler(ctx, req)
	}
	begin := time.Now()
	ctx, span, m := s.start(ctx, info.FullMethod)
	resp, err := handler(ctx, req)
	s.in.end(ctx, span, m, begin, err)
	return resp, err
}

// Stream is the server's stream interceptor: one span for the stream.
func (s *GRPCServer) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if s.skip != nil && s.skip(info.FullMethod) {
		return handler(srv, ss)
	}
	begin := time.Now()
	ctx, span, m := s.start(ss.Context(), info.FullMethod)
	err := handler(srv, contextStream{ServerStream: ss, ctx: ctx})
	s.in.end(ctx, span, m, begin, err)
	return err
}

// contextStream is a server stream with the span's context.
type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s contextStream) Context() context.Context { return s.ctx }

// GRPCClient is the instrumentation of outgoing gRPC calls.
type GRPCClient struct{ in *rpcInstruments }

// NewGRPCClient instruments outgoing calls with the global tracer and
// meter providers (see NewGRPCServer).
func NewGRPCClient() *GRPCClient { return &GRPCClient{in: newRPCInstruments(false)} }

// GRPCClientOptions instruments an outgoing gRPC connection: a client span
// per call and the trace context sent along. Every connection one Mandate
// service opens to another needs it, or the trace stops there.
func GRPCClientOptions() []grpc.DialOption {
	c := NewGRPCClient()
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.Unary), grpc.WithChainStreamInterceptor(c.Stream)}
}

func (c *GRPCClient) start(ctx context.Context, method string, cc *grpc.ClientConn) (context.Context, trace.Span, *rpcMethod) {
	target := ""
	if cc != nil {
		target = cc.Target()
	}
	m := c.in.method(method, target)
	ctx, span := c.in.tracer.Start(ctx, m.name, m.spanOpts...)
	var out outgoingCarrier
	c.in.prop.Inject(ctx, &out)
	if len(out.kv) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, out.kv...)
	}
	return ctx, span, m
}

// Unary is the client's unary interceptor.
func (c *GRPCClient) Unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	begin := time.Now()
	ctx, span, m := c.start(ctx, method, cc)
	err := invoker(ctx, method, req, reply, cc, opts...)
	c.in.end(ctx, span, m, begin, err)
	return err
}

// Stream is the client's stream interceptor: the span ends when the
// stream does — its last message received, an error, or its context
// ended.
func (c *GRPCClient) Stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	begin := time.Now()
	ctx, span, m := c.start(ctx, method, cc)
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		c.in.end(ctx, span, m, begin, err)
		return nil, err
	}
	s := &clientStream{ClientStream: cs, serverStreams: desc.ServerStreams}
	s.end = sync.OnceFunc(func() { c.in.end(ctx, span, m, begin, s.err) })
	s.stop = context.AfterFunc(ctx, func() {
		s.err = status.FromContextError(ctx.Err()).Err()
		s.end()
	})
	return s, nil
}

// clientStream ends its call's span once the stream is over.
type clientStream struct {
	grpc.ClientStream
	serverStreams bool
	err           error // written once, before end runs
	end           func()
	stop          func() bool
}

func (s *clientStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	switch {
	case errors.Is(err, io.EOF):
		s.finish(nil)
	case err != nil:
		s.finish(err)
	case !s.serverStreams:
		// A stream with one reply is over once it is read.
		s.finish(nil)
	}
	return err
}

func (s *clientStream) finish(err error) {
	if s.stop() {
		s.err = err
		s.end()
	}
}
