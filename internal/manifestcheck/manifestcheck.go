package manifestcheck

import (
	"context"
	"regexp"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/mandate-dev/mandate/internal/failure"
)

// Header is the metadata key that carries the caller's manifest digest.
const Header = "x-mandate-manifest-digest"

// Stage is the stage a mismatch is reported at: request_check, the check
// of what a call carries besides its arguments, after authenticate (so
// the refusal names a principal and is audited) and before
// load_definition (the definition the caller meant is not the one here).
const Stage = failure.StageRequest

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Declared returns the manifest digest the caller sent, "" when none.
func Declared(ctx context.Context) string {
	if v := metadata.ValueFromIncomingContext(ctx, Header); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Check returns the refusal of a call that declared digest declared to a
// service running manifest own, or nil when they agree or the caller
// declared none.
func Check(declared, own string) *failure.Error {
	if declared == "" || declared == own {
		return nil
	}
	shown := declared
	if !digestPattern.MatchString(declared) {
		// A malformed value is not echoed: it may be anything.
		shown = "a malformed digest"
	}
	fe := failure.New(Stage, failure.CodeManifestMismatch,
		"the calling service runs manifest "+shown+", this service runs "+own+": they disagree about the commands")
	fe.Remedy = "ask an operator: deploy the same manifest to every Mandate service"
	return fe
}

// UnaryClientInterceptor sends digest with every unary call.
func UnaryClientInterceptor(digest string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(withDigest(ctx, digest), method, req, reply, cc, opts...)
	}
}

// StreamClientInterceptor sends digest with every stream.
func StreamClientInterceptor(digest string) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(withDigest(ctx, digest), desc, cc, method, opts...)
	}
}

// withDigest sets the header once: a relayed context may already carry
// one (the executor's dispatch of a call it received), which is replaced
// by this process's own.
func withDigest(ctx context.Context, digest string) context.Context {
	md, ok := metadata.FromOutgoingContext(ctx)
	if !ok {
		md = make(metadata.MD, 1)
	}
	if v := md.Get(Header); len(v) == 1 && v[0] == digest {
		return ctx
	}
	// FromOutgoingContext made md for this call: it is set without
	// another copy.
	md.Set(Header, digest)
	return metadata.NewOutgoingContext(ctx, md)
}

// Guard returns a copy of desc whose every method and stream refuses a
// caller that declared another manifest than own, once the server's
// interceptors have run and before the implementation sees the call:
// register the service implementation with it
// (grpc.ServiceRegistrar.RegisterService).
func Guard(desc *grpc.ServiceDesc, own string) *grpc.ServiceDesc {
	g := *desc
	g.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, m := range desc.Methods {
		h := m.Handler
		m.Handler = func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			// Checked where the handler would run: after the server's
			// interceptors (authentication first), as streams are.
			checked := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
				next := func(ctx context.Context, req any) (any, error) {
					if fe := Check(Declared(ctx), own); fe != nil {
						return nil, fe
					}
					return handler(ctx, req)
				}
				if interceptor == nil {
					return next(ctx, req)
				}
				return interceptor(ctx, req, info, next)
			}
			return h(srv, ctx, dec, checked)
		}
		g.Methods[i] = m
	}
	g.Streams = make([]grpc.StreamDesc, len(desc.Streams))
	for i, st := range desc.Streams {
		h := st.Handler
		st.Handler = func(srv any, stream grpc.ServerStream) error {
			if fe := Check(Declared(stream.Context()), own); fe != nil {
				return fe
			}
			return h(srv, stream)
		}
		g.Streams[i] = st
	}
	return &g
}
