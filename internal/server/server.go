// Package server runs one Mandate service: a gRPC server (health,
// reflection, OpenTelemetry, panic recovery, authentication) and an HTTP
// server carrying the service's REST routes through grpc-gateway, with
// problem+json errors, plus /healthz. REST requests are authenticated
// before their body is read, and hostile paths, queries and bodies are
// refused as 400 schema.invalid, never 5xx (input.go). Run serves until
// its context ends, then shuts down in order: health NOT_SERVING, gRPC
// GracefulStop (bounded), HTTP Shutdown.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/mandate-dev/mandate/internal/edgelimit"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/telemetry"
)

// Config configures a service's listeners.
type Config struct {
	// Name identifies the service in health checks and logs.
	Name string
	// GRPCAddr and HTTPAddr are listen addresses; ":0" picks a port.
	GRPCAddr string
	HTTPAddr string
	// Auth authenticates every RPC except health and server reflection
	// (which reveals nothing /openapi.json does not). Required: Mandate has
	// no other unauthenticated RPCs.
	Auth *identity.Authenticator
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// ShutdownTimeout bounds graceful shutdown (default 10s).
	ShutdownTimeout time.Duration
	// MaxRecvBytes bounds a gRPC request (default 4 MiB).
	MaxRecvBytes int
	// GRPCOptions are added to the gRPC server (e.g. an unknown-service
	// handler).
	GRPCOptions []grpc.ServerOption
	// ManifestDigest is the digest of the manifest the service runs,
	// reported by /healthz so that an operator (and a test) sees which
	// commands each service holds; empty for a service without one.
	ManifestDigest string
	// Metrics, when set, is served as GET /metrics without a token, for
	// Prometheus to scrape (telemetry.Installed.Metrics); nil leaves
	// /metrics a 404 like any unknown route.
	Metrics http.Handler
	// ProxiedMethod reports whether the gRPC server's unknown-service
	// handler (GRPCOptions) serves a full method name, such as a governed
	// command of the executor's proxy. The RPC metrics name the methods
	// registered on the server and these; any other method a caller names
	// is reported as _OTHER, so made-up names cannot add series.
	ProxiedMethod func(fullMethod string) bool
	// MaxConnectionAge is how long a client's connection may live before
	// the server asks the client (HTTP/2 GOAWAY) to open a new one for its
	// next calls. A client balancing over DNS (round_robin over a headless
	// Service) re-resolves when that happens, so replicas added since it
	// connected get their share. Zero: connections live as long as the
	// client keeps them.
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace is how long the calls still running on such a
	// connection may go on before it is closed under them; it must exceed
	// the longest call. Zero: as long as they take.
	MaxConnectionAgeGrace time.Duration
	// Ready, when set, says whether the service can serve: typically a
	// ping of its database. It is probed every ReadyInterval with a
	// deadline of its own (ReadyInterval too, at most), never on a
	// request's time, so a database that hangs makes the service
	// not-ready within about two intervals instead of hanging its health
	// checks. While it fails, /healthz and gRPC health for the service
	// answer NOT_SERVING; /livez only says the process runs.
	Ready func(ctx context.Context) error
	// ReadyInterval is how often Ready is probed (default 1s).
	ReadyInterval time.Duration
	// EdgeLimit, when set, bounds the REST requests of each principal
	// (edgelimit; docs/architecture/limits.md): past it a request is
	// refused 429 rate.limited with Retry-After before its body is read.
	// Requests whose token does not verify share edgelimit's anonymous
	// buckets. gRPC calls are not limited here.
	EdgeLimit *edgelimit.Limiter
	// EdgeRecorder records the audit row of each such refusal (nil: none).
	EdgeRecorder *edgelimit.Recorder
}

// Health paths, served without a token: /healthz is readiness (the
// service can serve: it runs and Config.Ready passes), /livez liveness
// (the process runs and answers HTTP; an orchestrator restarts it only
// when this fails, never for a database outage).
const (
	HealthPath = "/healthz"
	LivePath   = "/livez"
)

// MetricsPath is where Config.Metrics is served.
const MetricsPath = "/metrics"

// KeepaliveMinTime is the shortest interval between a client's keepalive
// pings that the server accepts: a client pinging more often gets
// GOAWAY too_many_pings and loses its connection. The Mandate services'
// clients ping no more often than this (clicore checks
// --grpc-keepalive-time against it); pings are allowed on a connection
// without calls, since an idle connection is the one whose death a
// client wants to notice before its next call.
const KeepaliveMinTime = 10 * time.Second

// GatewayRegistrar registers a service's grpc-gateway handlers.
type GatewayRegistrar func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error

// Server is one service's listeners.
type Server struct {
	cfg  Config
	log  *slog.Logger
	grpc *grpc.Server
	// chain is what every call runs through before its handler, on the
	// gRPC listener and on the registrars attached to the server (Attach).
	chain Interceptors
	// registered are the services registered with RegisterService, and
	// attached the registrars that serve them too (Attach).
	registered []registration
	attached   []grpc.ServiceRegistrar
	health     *health.Server
	gateway    *runtime.ServeMux
	http       *http.ServeMux
	gateways   []GatewayRegistrar
	grpcLis    net.Listener
	httpLis    net.Listener
	nonce      string
	// stopping is closed when shutdown begins, ending long-lived streams
	// (Watch, Await) so GracefulStop does not wait for its timeout.
	stopping chan struct{}
	// methods are the full names of the methods registered on the gRPC
	// server (listMethods), read by the RPC instrumentation (knownMethod)
	// on calls that may come in process while services still register.
	methods atomic.Pointer[map[string]bool]
}

// New builds the servers and binds the listeners, so the addresses are
// known (and port conflicts reported) before Run.
func New(cfg Config) (*Server, error) {
	if cfg.Name == "" {
		return nil, errors.New("server: Name is required")
	}
	if cfg.Auth == nil {
		return nil, errors.New("server: Auth is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ReadyInterval <= 0 {
		cfg.ReadyInterval = time.Second
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	if cfg.MaxRecvBytes <= 0 {
		cfg.MaxRecvBytes = 4 << 20
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("server", cfg.Name), health: health.NewServer(), http: http.NewServeMux()}
	v, err := newValidator()
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s.nonce = newNonce()
	s.stopping = make(chan struct{})
	// Tracing first, so the span holds every interceptor's refusal, and a
	// panic's Internal once recovered.
	tel := telemetry.NewGRPCServer(s.knownMethod, func(fullMethod string) bool {
		// Health probes are not traffic worth a trace.
		return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/")
	})
	s.chain = Interceptors{
		Unary:  []grpc.UnaryServerInterceptor{tel.Unary, s.recoverUnary, s.gatewayUnary, cfg.Auth.UnaryServerInterceptor(), s.inputUnary, v.unary},
		Stream: []grpc.StreamServerInterceptor{tel.Stream, s.recoverStream, s.stopStream, s.gatewayStream, cfg.Auth.StreamServerInterceptor(), s.inputStream, v.stream},
	}
	opts := append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(cfg.MaxRecvBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: cfg.MaxConnectionAge, MaxConnectionAgeGrace: cfg.MaxConnectionAgeGrace}),
		grpc.ChainUnaryInterceptor(s.chain.Unary...),
		grpc.ChainStreamInterceptor(s.chain.Stream...),
	}, cfg.GRPCOptions...)
	s.grpc = grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	// Reflection (v1 and v1alpha) is served without a token, like health
	// (identity exempts both), so grpcurl and Postman can list and
	// describe the services.
	reflection.Register(s.grpc)
	s.listMethods()
	s.gateway = runtime.NewServeMux(
		runtime.WithErrorHandler(problemHandler),
		runtime.WithRoutingErrorHandler(routingErrorHandler),
		runtime.WithIncomingHeaderMatcher(headerMatcher),
		runtime.WithMetadata(func(context.Context, *http.Request) metadata.MD {
			return metadata.Pairs(gatewayHeader, s.nonce)
		}),
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &strictMarshaler{JSONPb: &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}}),
		// Authentication and the checks of hostile input (input.go) run
		// once a route matched, before anything reads the body.
		runtime.WithMiddlewares(s.checkRequest),
	)
	s.http.HandleFunc("GET "+HealthPath, s.healthz)
	s.http.HandleFunc("GET "+LivePath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"SERVING"}`))
	})
	if cfg.Metrics != nil {
		s.http.Handle("GET "+MetricsPath, cfg.Metrics)
	}
	s.http.Handle("/", s.gateway)

	if s.grpcLis, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("server: listening for gRPC on %s: %w", cfg.GRPCAddr, err)
	}
	if s.httpLis, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		_ = s.grpcLis.Close()
		return nil, fmt.Errorf("server: listening for HTTP on %s: %w", cfg.HTTPAddr, err)
	}
	return s, nil
}

// ServiceNames lists the full names of the gRPC services registered on the
// server, sorted, without health and reflection themselves.
func (s *Server) ServiceNames() []string {
	var names []string
	for name := range s.grpc.GetServiceInfo() {
		if name == healthpb.Health_ServiceDesc.ServiceName || strings.HasPrefix(name, "grpc.reflection.") {
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// GRPC returns the gRPC server. Services registered on it directly are
// not served in process; register them with RegisterService (pass the
// Server as the grpc.ServiceRegistrar) to serve them on both.
func (s *Server) GRPC() *grpc.Server { return s.grpc }

// HandleGateway adds a service's REST routes (before Run).
func (s *Server) HandleGateway(r GatewayRegistrar) { s.gateways = append(s.gateways, r) }

// Handle adds a plain HTTP handler (before Run).
func (s *Server) Handle(pattern string, h http.Handler) { s.http.Handle(pattern, h) }

// GRPCAddr is the bound gRPC address.
func (s *Server) GRPCAddr() string { return s.grpcLis.Addr().String() }

// HTTPAddr is the bound HTTP address.
func (s *Server) HTTPAddr() string { return s.httpLis.Addr().String() }

// Run serves until ctx ends, then shuts down gracefully.
func (s *Server) Run(ctx context.Context) error {
	// The gateway calls this service's own gRPC port, so REST calls run
	// through the same interceptors as gRPC calls.
	conn, err := grpc.NewClient(s.GRPCAddr(), append(telemetry.GRPCClientOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(gatewayInputUnary),
		grpc.WithChainStreamInterceptor(gatewayInputStream))...)
	if err != nil {
		return fmt.Errorf("server: gateway connection: %w", err)
	}
	defer func() { _ = conn.Close() }()
	for _, r := range s.gateways {
		if err := r(ctx, s.gateway, conn); err != nil {
			return fmt.Errorf("server: registering gateway: %w", err)
		}
	}
	s.listMethods()
	httpSrv := &http.Server{
		Handler: otelhttp.NewHandler(http.MaxBytesHandler(s.labelRoute(s.http), int64(s.cfg.MaxRecvBytes)), s.cfg.Name,
			// A scrape or a health probe every few seconds is not traffic
			// worth a trace.
			otelhttp.WithFilter(traced)),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	errc := make(chan error, 2)
	go func() { errc <- s.grpc.Serve(s.grpcLis) }()
	go func() {
		if err := httpSrv.Serve(s.httpLis); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
			return
		}
		errc <- nil
	}()
	// Health answers for the server (""), the service's short name and
	// the full name of every gRPC service it serves, as grpc_health_probe
	// -service and load balancers ask.
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	ready := s.cfg.Ready == nil || s.probeReady(ctx) == nil
	s.setReady(ready)
	s.log.Info("serving", "grpc", s.GRPCAddr(), "http", s.HTTPAddr())
	readyDone := make(chan struct{})
	if s.cfg.Ready != nil {
		go s.watchReady(ctx, ready, readyDone)
	} else {
		close(readyDone)
	}
	defer func() { <-readyDone }()

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	s.health.Shutdown()
	close(s.stopping)
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	timer := time.NewTimer(s.cfg.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		s.grpc.Stop()
		<-stopped
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := httpSrv.Shutdown(shutdownCtx); err != nil && runErr == nil {
		runErr = err
	}
	s.log.Info("stopped")
	return runErr
}

// setReady sets the health of the service's names (its short name and
// every gRPC service it serves); the server's own ("") stays SERVING while
// it runs.
func (s *Server) setReady(ok bool) {
	st := healthpb.HealthCheckResponse_SERVING
	if !ok {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.health.SetServingStatus(s.cfg.Name, st)
	for _, name := range s.ServiceNames() {
		s.health.SetServingStatus(name, st)
	}
}

// probeReady runs Config.Ready once, bounded by the probe interval.
func (s *Server) probeReady(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, s.cfg.ReadyInterval)
	defer cancel()
	done := make(chan error, 1)
	// A probe that ignores its context (a stuck driver) must not stall
	// the watch: its answer is waited for only until the deadline.
	go func() { done <- s.cfg.Ready(pctx) }()
	select {
	case err := <-done:
		return err
	case <-pctx.Done():
		return fmt.Errorf("no answer within %v", s.cfg.ReadyInterval)
	}
}

// watchReady probes Config.Ready every interval until ctx ends, and sets
// the service's health from it, logging each change.
func (s *Server) watchReady(ctx context.Context, ready bool, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(s.cfg.ReadyInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.stopping:
			return
		case <-t.C:
		}
		err := s.probeReady(ctx)
		if ok := err == nil; ok != ready && ctx.Err() == nil {
			ready = ok
			s.setReady(ok)
			if ok {
				s.log.Info("ready again: the readiness probe passes")
			} else {
				s.log.Warn("not ready: the readiness probe fails", "error", err)
			}
		}
	}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	resp, err := s.health.Check(r.Context(), &healthpb.HealthCheckRequest{Service: s.cfg.Name})
	w.Header().Set("Content-Type", "application/json")
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"NOT_SERVING"}`))
		return
	}
	if s.cfg.ManifestDigest == "" {
		_, _ = w.Write([]byte(`{"status":"SERVING"}`))
		return
	}
	b, _ := json.Marshal(struct {
		Status         string `json:"status"`
		ManifestDigest string `json:"manifest_digest"`
	}{"SERVING", s.cfg.ManifestDigest})
	_, _ = w.Write(b)
}

func (s *Server) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.ErrorContext(ctx, "panic in handler", "method", info.FullMethod, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = failure.Internal("", nil).GRPCStatus().Err()
		}
	}()
	return handler(ctx, req)
}

// stopStream cancels the context of server-streaming RPCs (tails such as
// Watch and Await) when shutdown begins. Other streams, such as governed
// proxy calls, finish normally under GracefulStop.
func (s *Server) stopStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.IsClientStream || !info.IsServerStream {
		return handler(srv, ss)
	}
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	go func() {
		select {
		case <-s.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	return handler(srv, &ctxStream{ServerStream: ss, ctx: ctx})
}

func (s *Server) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("panic in stream handler", "method", info.FullMethod, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = failure.Internal("", nil).GRPCStatus().Err()
		}
	}()
	return handler(srv, ss)
}

// headerMatcher forwards the headers Mandate reads from REST callers.
func headerMatcher(key string) (string, bool) {
	switch k := strings.ToLower(key); k {
	case "idempotency-key", "x-request-id", "x-mandate-conversation", "x-mandate-approval-grant", identity.OnBehalfOfHeader, "traceparent", "tracestate":
		return k, true
	}
	return runtime.DefaultHeaderMatcher(key)
}

// problemHandler renders every gateway error as RFC 9457 problem+json.
func problemHandler(_ context.Context, mux *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	var httpErr *runtime.HTTPStatusError
	if errors.As(err, &httpErr) && httpErr.Err != nil {
		err = httpErr.Err
	}
	st, ok := status.FromError(err)
	if !ok {
		st = failure.ToStatus(err)
	}
	if st.Code() == 0 {
		st = failure.ToStatus(err)
	}
	p := failure.Problem(st, r.URL.Path)
	if st.Code() == codes.InvalidArgument && !failure.CarriesCode(st) {
		// The gateway itself refused a parameter: refused again by the
		// RPC, and audited, where it was the query; otherwise answered here.
		if redispatch(mux, w, r) {
			return
		}
		p.Code, p.Stage = failure.CodeRequestMalformed, "decode"
	}
	WriteProblem(w, p)
}

// WriteProblem writes a problem+json response.
func WriteProblem(w http.ResponseWriter, p failure.ProblemBody) {
	if p.Status == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

func routingErrorHandler(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	p := failure.ProblemBody{Type: "about:blank", Status: httpStatus, Title: http.StatusText(httpStatus), Instance: r.URL.Path}
	switch httpStatus {
	case http.StatusMethodNotAllowed, http.StatusNotImplemented:
		p.Status, p.Title, p.Code = http.StatusMethodNotAllowed, http.StatusText(http.StatusMethodNotAllowed), failure.CodeRequestMethodNotAllowed
	case http.StatusNotFound:
		p.Code = failure.CodeRequestRouteNotFound
	default:
		p.Code = failure.CodeRequestMalformed
	}
	WriteProblem(w, p)
}

// traced reports whether an HTTP request gets a trace: not the health
// probes and metric scrapes that orchestrators send every few seconds.
func traced(r *http.Request) bool {
	return r.URL.Path != MetricsPath && r.URL.Path != HealthPath && r.URL.Path != LivePath
}
