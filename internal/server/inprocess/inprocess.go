package inprocess

import (
	"context"
	"encoding"
	"fmt"

	"github.com/fullstorydev/grpchan"
	"github.com/fullstorydev/grpchan/inprocgrpc"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/schema"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/telemetry"
)

// Conn returns a connection to the services registered on srv
// (server.Server.RegisterService, before or after Conn) that stays in the
// calling process: no socket and no serialisation (messages are cloned),
// but the same server interceptors as a gRPC call — panic recovery,
// authentication, the checks of hostile input, request validation — so a
// service wired in process (mandate dev) behaves as it does over the
// network. src supplies the calling service's credential, as
// identity.UnaryClientInterceptor does for a gRPC connection; nil sends
// none (the caller's own bearer, if any, still travels in its outgoing
// metadata). The headers in set (the manifest digest) travel with the
// credential, set as identity.UnaryClientInterceptor sets them; without a
// src, none do. Each call attaches a channel of its own to srv: call it
// once per caller, before srv runs.
func Conn(srv *server.Server, src identity.TokenSource, set ...identity.Header) grpc.ClientConnInterface {
	ch := new(inprocgrpc.Channel)
	chain := srv.Attach(ch)
	// The client side carries the caller's trace context to the service,
	// as a gRPC connection of a Mandate service does
	// (telemetry.GRPCClientOptions); the server side is traced by the
	// first interceptor of the server's chain.
	ch.WithServerUnaryInterceptor(chainUnary(chain.Unary)).
		WithServerStreamInterceptor(chainStream(chain.Stream)).
		WithCloner(wireCloner{})
	tc := telemetry.NewGRPCClient()
	traced := grpchan.InterceptClientConn(ch, tc.Unary, tc.Stream)
	if src == nil {
		return traced
	}
	return grpchan.InterceptClientConn(traced, identity.UnaryClientInterceptor(src, set...), identity.StreamClientInterceptor(src, set...))
}

// wireCloner copies messages between the two ends of the in-process
// channel. Messages of one type are cloned; a caller's message of another
// Go type for the same proto message — the executor's dispatcher sends
// dynamic messages (dynamicpb) to services serving their generated types —
// goes through the wire format, as over a gRPC connection, and so does a
// caller's message that is already wire bytes (encoding.BinaryMarshaler).
type wireCloner struct{}

func (wireCloner) Copy(out, in any) error {
	o, oOK := out.(proto.Message)
	i, iOK := in.(proto.Message)
	if u, ok := out.(encoding.BinaryUnmarshaler); ok && !oOK && iOK {
		// A reply the caller decodes itself (the executor's dispatcher
		// transcodes its backends' replies): the wire bytes, as a gRPC
		// connection would bring them.
		b, err := proto.MarshalOptions{AllowPartial: !schema.CanLackRequired(i.ProtoReflect().Descriptor())}.Marshal(i)
		if err != nil {
			return err
		}
		return u.UnmarshalBinary(b)
	}
	if m, ok := in.(encoding.BinaryMarshaler); ok && oOK && !iOK {
		// A request the caller sends already encoded (the executor's
		// dispatcher sends the arguments' canonical bytes): decoded as a
		// gRPC connection would bring it.
		b, err := m.MarshalBinary()
		if err != nil {
			return err
		}
		return schema.Unmarshal(proto.UnmarshalOptions{AllowPartial: !schema.CanLackRequired(o.ProtoReflect().Descriptor())}, b, o)
	}
	if !oOK || !iOK {
		return inprocgrpc.ProtoCloner{}.Copy(out, in)
	}
	od, id := o.ProtoReflect().Descriptor(), i.ProtoReflect().Descriptor()
	if od == id {
		proto.Reset(o)
		proto.Merge(o, i)
		return nil
	}
	if od.FullName() != id.FullName() {
		return fmt.Errorf("in-process call: a %s where a %s is expected", id.FullName(), od.FullName())
	}
	// Both ends check required fields, as gRPC's codec does, unless the
	// type cannot lack one: the check then always passes, and on a dynamic
	// message it is an allocating walk of every field.
	b, err := proto.MarshalOptions{AllowPartial: !schema.CanLackRequired(id)}.Marshal(i)
	if err != nil {
		return err
	}
	return schema.Unmarshal(proto.UnmarshalOptions{AllowPartial: !schema.CanLackRequired(od)}, b, o)
}

func (wireCloner) Clone(in any) (any, error) {
	m, ok := in.(proto.Message)
	if !ok {
		return inprocgrpc.ProtoCloner{}.Clone(in)
	}
	return proto.Clone(m), nil
}

// chainUnary runs interceptors in order, as grpc.ChainUnaryInterceptor does:
// the handler each one is given is made when it is called, one per
// interceptor after the first, and none past an interceptor that refuses.
func chainUnary(ints []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	if len(ints) == 0 {
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			return handler(ctx, req)
		}
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return ints[0](ctx, req, info, unaryAfter(ints, 0, info, handler))
	}
}

// unaryAfter is the handler interceptor i of ints calls: the next
// interceptor, or the final handler after the last.
func unaryAfter(ints []grpc.UnaryServerInterceptor, i int, info *grpc.UnaryServerInfo, final grpc.UnaryHandler) grpc.UnaryHandler {
	if i == len(ints)-1 {
		return final
	}
	return func(ctx context.Context, req any) (any, error) {
		return ints[i+1](ctx, req, info, unaryAfter(ints, i+1, info, final))
	}
}

// chainStream runs interceptors in order, as grpc.ChainStreamInterceptor does.
func chainStream(ints []grpc.StreamServerInterceptor) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		next := handler
		for i := len(ints) - 1; i >= 0; i-- {
			in, h := ints[i], next
			next = func(srv any, ss grpc.ServerStream) error { return in(srv, ss, info, h) }
		}
		return next(srv, ss)
	}
}
