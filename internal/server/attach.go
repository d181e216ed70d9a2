package server

import (
	"slices"

	"google.golang.org/grpc"
)

// registration is a service registered with RegisterService.
type registration struct {
	desc *grpc.ServiceDesc
	impl any
}

// Interceptors are the chains a server runs every call through before its
// handler, in order: panic recovery, authentication, the checks of hostile
// input, request validation.
type Interceptors struct {
	Unary  []grpc.UnaryServerInterceptor
	Stream []grpc.StreamServerInterceptor
}

// RegisterService implements grpc.ServiceRegistrar: the service is served
// on the gRPC listener and by every registrar attached to s (Attach).
// Register services before Run.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	s.grpc.RegisterService(desc, impl)
	s.listMethods()
	s.registered = append(s.registered, registration{desc: desc, impl: impl})
	for _, r := range s.attached {
		r.RegisterService(desc, impl)
	}
}

// Attach has r serve every service registered on s with RegisterService,
// those registered already and those registered later, and returns the
// interceptors r must run every call through to behave as the gRPC
// listener does. It is how `mandate dev` serves services in process
// (internal/server/inprocess), which lives apart so that a service's own
// binary does not link an in-process transport it never uses. Attach
// before Run.
func (s *Server) Attach(r grpc.ServiceRegistrar) Interceptors {
	for _, reg := range s.registered {
		r.RegisterService(reg.desc, reg.impl)
	}
	s.attached = append(s.attached, r)
	return Interceptors{Unary: slices.Clone(s.chain.Unary), Stream: slices.Clone(s.chain.Stream)}
}
