package server

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// gatewayHeader marks calls that the in-process REST gateway makes. Its
// value is a per-process random nonce, so a gRPC client cannot claim to be
// the gateway.
const gatewayHeader = "x-mandate-gateway"

type gatewayKey struct{}

// FromGateway reports whether the call came in over REST through this
// process's gateway.
func FromGateway(ctx context.Context) bool {
	v, _ := ctx.Value(gatewayKey{}).(bool)
	return v
}

func newNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Server) markGateway(ctx context.Context) context.Context {
	vals, input := metadata.ValueFromIncomingContext(ctx, gatewayHeader), metadata.ValueFromIncomingContext(ctx, gatewayInputHeader)
	if len(vals) == 0 && len(input) == 0 {
		return ctx
	}
	md, _ := metadata.FromIncomingContext(ctx)
	md.Delete(gatewayHeader)
	md.Delete(gatewayInputHeader)
	ctx = metadata.NewIncomingContext(ctx, md)
	if len(vals) == 1 && subtle.ConstantTimeCompare([]byte(vals[0]), []byte(s.nonce)) == 1 {
		ctx = context.WithValue(ctx, gatewayKey{}, true)
		// The faults the gateway found in the REST request (input.go),
		// trusted only with the nonce.
		if ie := readGatewayInput(input); ie != nil {
			ctx = context.WithValue(ctx, inputKey{}, ie)
		}
	}
	return ctx
}

func (s *Server) gatewayUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return handler(s.markGateway(ctx), req)
}

func (s *Server) gatewayStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &ctxStream{ServerStream: ss, ctx: s.markGateway(ss.Context())})
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c *ctxStream) Context() context.Context { return c.ctx }
