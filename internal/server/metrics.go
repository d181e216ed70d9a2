package server

import (
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
)

// The request metrics of a server (otelhttp's on the HTTP listener,
// telemetry.GRPCServer's on the gRPC one) are served unauthenticated at /metrics, so
// no label may take a value a caller makes up: each new value is a new
// series, kept for the life of the process. The HTTP metrics name the
// route by the pattern that matched (a template registered here, or "/"
// for everything the gateway did not route), never the path; the
// attributes otelhttp takes from the Host header and the request line
// are dropped by the view telemetry.Install sets. The gRPC metrics name
// a method only when the server serves it (knownMethod), any other
// telemetry.OtherMethod.

// routeKey is the semantic-convention key of the route attribute.
const routeKey = attribute.Key("http.route")

// labelRoute adds to the request's metrics the route that serves it: the
// pattern of the mux's handler, stripped of its method ("GET /healthz" is
// "/healthz"). The gateway's middleware refines "/" to the REST route
// that matched (routeGateway). A request no pattern serves gets no route.
func (s *Server) labelRoute(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l, ok := otelhttp.LabelerFromContext(r.Context()); ok {
			if _, pattern := s.http.Handler(r); pattern != "" {
				l.Add(routeKey.String(patternRoute(pattern)))
			}
		}
		next.ServeHTTP(w, r)
	})
}

// routeGateway names the REST route the gateway matched, a template of
// the registered routes ("/v1/commands/{code=*}:execute"), on the
// request's metrics; the labeler keeps the last value of a key, so it
// replaces labelRoute's "/".
func routeGateway(r *http.Request) {
	l, ok := otelhttp.LabelerFromContext(r.Context())
	if !ok {
		return
	}
	if p, ok := runtime.HTTPPattern(r.Context()); ok {
		l.Add(routeKey.String(p.String()))
	}
}

// patternRoute is the path part of a ServeMux pattern ("[METHOD ][HOST]/PATH").
func patternRoute(pattern string) string {
	for i := 0; i < len(pattern); i++ {
		if pattern[i] == '/' {
			return pattern[i:]
		}
	}
	return pattern
}

// listMethods records the methods registered on the gRPC server. It runs
// on every registration (RegisterService), and once more when Run starts
// serving (gRPC refuses a registration once it serves, so the set is then
// final).
func (s *Server) listMethods() {
	m := map[string]bool{}
	for svc, info := range s.grpc.GetServiceInfo() {
		for _, method := range info.Methods {
			m["/"+svc+"/"+method.Name] = true
		}
	}
	s.methods.Store(&m)
}

// knownMethod reports whether the server serves a full method name:
// registered on it, or served by its unknown-service handler
// (Config.ProxiedMethod).
func (s *Server) knownMethod(fullMethod string) bool {
	if m := s.methods.Load(); m != nil && (*m)[fullMethod] {
		return true
	}
	return s.cfg.ProxiedMethod != nil && s.cfg.ProxiedMethod(fullMethod)
}
