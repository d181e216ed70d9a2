package identity

import (
	"context"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// publicServices are the only gRPC services reachable without a token:
// health, so load balancers and orchestrators can probe us
// (docs/architecture/identity.md), and
// server reflection, so grpcurl and Postman can discover the API. Reflection
// reveals the compiled-in descriptors and nothing the published OpenAPI
// document (/openapi.json) does not; it never reaches a handler, a store or
// a backend.
var publicServices = []string{
	"/grpc.health.v1.Health/",
	"/grpc.reflection.v1.ServerReflection/",
	"/grpc.reflection.v1alpha.ServerReflection/",
}

// isPublicMethod reports whether fullMethod is served without a token.
func isPublicMethod(fullMethod string) bool {
	for _, prefix := range publicServices {
		if strings.HasPrefix(fullMethod, prefix) {
			return true
		}
	}
	return false
}

func (a *Authenticator) authenticateIncoming(ctx context.Context) (context.Context, error) {
	// ValueFromIncomingContext copies the two values, not the whole map.
	ctx, err := a.Authenticate(ctx, metadata.ValueFromIncomingContext(ctx, "authorization"),
		metadata.ValueFromIncomingContext(ctx, OnBehalfOfHeader))
	if err != nil {
		// GRPCStatus carries Unauthenticated and the ErrorInfo detail.
		return ctx, asError(err).GRPCStatus().Err()
	}
	return ctx, nil
}

// UnaryServerInterceptor authenticates every unary call except health
// checks and server reflection and refuses the rest with codes.Unauthenticated and a
// google.rpc.ErrorInfo whose reason is the refusal code.
func (a *Authenticator) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if isPublicMethod(info.FullMethod) {
			return handler(ctx, req)
		}
		ctx, err := a.authenticateIncoming(ctx)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streams.
func (a *Authenticator) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if isPublicMethod(info.FullMethod) {
			return handler(srv, ss)
		}
		ctx, err := a.authenticateIncoming(ss.Context())
		if err != nil {
			return err
		}
		return handler(srv, &authenticatedStream{ServerStream: ss, ctx: ctx})
	}
}

// authenticatedStream swaps in the context carrying the principal; a
// ServerStream's context cannot be replaced any other way.
type authenticatedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *authenticatedStream) Context() context.Context { return s.ctx }

// outgoingContext attaches the service token and, when the call is made
// while serving an end user, that user's original token. Existing values of
// both keys are replaced, never appended, so metadata copied from an
// incoming call cannot smuggle the caller's credentials through.
// The headers in set are set too, replacing any value ctx carries, in the
// same copy of the outgoing metadata.
func outgoingContext(ctx context.Context, src *bearerSource, set []Header) (context.Context, error) {
	header, err := src.header(ctx)
	if err != nil {
		return ctx, err
	}
	// FromOutgoingContext builds a new MD on every call (it merges the
	// pairs appended to ctx), so it is changed here without another copy.
	md, ok := metadata.FromOutgoingContext(ctx)
	if !ok {
		md = make(metadata.MD, 2)
	}
	md.Set("authorization", header)
	md.Delete(OnBehalfOfHeader)
	if raw, ok := RawTokenFromContext(ctx); ok {
		md.Set(OnBehalfOfHeader, "Bearer "+raw)
	}
	for _, h := range set {
		md.Set(h.Key, h.Value)
	}
	return metadata.NewOutgoingContext(ctx, md), nil
}

// bearerSource is a TokenSource's token as an authorization header value,
// built once per token rather than once per call.
type bearerSource struct {
	src  TokenSource
	last atomic.Pointer[[2]string] // the last token and its header
}

func (b *bearerSource) header(ctx context.Context) (string, error) {
	tok, err := b.src.Token(ctx)
	if err != nil {
		return "", err
	}
	if last := b.last.Load(); last != nil && last[0] == tok {
		return last[1], nil
	}
	h := "Bearer " + tok
	b.last.Store(&[2]string{tok, h})
	return h, nil
}

// Header is a metadata key and the value a service's every outgoing call
// sets it to (replacing any the context carries), with its credentials.
type Header struct {
	Key, Value string
}

// UnaryClientInterceptor makes a service's outgoing unary calls carry its
// own service token and forward the end user's token from ctx (see
// WithRawToken), so the callee authorises the end user, not the service;
// and the headers in set (the manifest digest, say), in the one copy of the
// outgoing metadata the credentials take — an interceptor of their own
// would copy it again.
func UnaryClientInterceptor(src TokenSource, set ...Header) grpc.UnaryClientInterceptor {
	bs := &bearerSource{src: src}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, err := outgoingContext(ctx, bs, set)
		if err != nil {
			return err
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// StreamClientInterceptor is UnaryClientInterceptor for streams.
func StreamClientInterceptor(src TokenSource, set ...Header) grpc.StreamClientInterceptor {
	bs := &bearerSource{src: src}
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx, err := outgoingContext(ctx, bs, set)
		if err != nil {
			return nil, err
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
}
