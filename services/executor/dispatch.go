package executor

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/schema"
)

// Metadata the executor sends to backends.
const (
	MetadataInvocationID   = "x-mandate-invocation-id"
	MetadataIdempotencyKey = "x-mandate-idempotency-key"
)

// GRPCDispatcher calls backends with dynamic gRPC. Connections are keyed by
// fully-qualified proto service name and should carry the executor's
// service credentials (identity.UnaryClientInterceptor), which forward the
// caller's token so the backend sees the end user.
type GRPCDispatcher struct {
	conns map[string]grpc.ClientConnInterface
}

// NewGRPCDispatcher returns a dispatcher over conns (service name → conn).
func NewGRPCDispatcher(conns map[string]grpc.ClientConnInterface) *GRPCDispatcher {
	return &GRPCDispatcher{conns: conns}
}

// Dispatch invokes the command's RPC on its backend. The reply comes back
// undecoded and is transcoded to the result's JSON (schema.TranscodeOutput);
// only a reply that declines is decoded, as gRPC's codec would have.
func (g *GRPCDispatcher) Dispatch(ctx context.Context, d Dispatch) (Reply, error) {
	conn, ok := g.conns[d.Command.RPC.Service]
	if !ok {
		return Reply{}, failure.Wrap(StageDispatch, failure.CodeHandlerUnavailable, fmt.Sprintf("no backend is configured for %s", d.Command.RPC.Service), ErrNotSent)
	}
	// A call whose caller went away, or whose deadline passed, before it
	// got here (its executor was frozen, say) is never sent: that much is
	// known, so it is not executed — its key and grant are given back —
	// rather than a failure with an unknown effect, cached for the key.
	if err := ctx.Err(); err != nil {
		return Reply{}, failure.Wrap(StageDispatch, failure.CodeHandlerNotSent,
			"the call was not sent to the backend: "+notSentReason(err)+"; nothing was run", fmt.Errorf("%w: %w", ErrNotSent, err))
	}
	ctx, cancel := context.WithTimeout(ctx, d.Deadline)
	defer cancel()
	if d.IdempotencyKey != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataInvocationID, d.InvocationID, MetadataIdempotencyKey, d.IdempotencyKey)
	} else {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataInvocationID, d.InvocationID)
	}
	var req any = d.Request
	if d.Wire != nil {
		req = &wireRequest{b: d.Wire}
	}
	var reply wireReply
	if err := conn.Invoke(ctx, d.Command.RPC.FullMethod, req, &reply, undecodedReply); err != nil {
		return Reply{}, err
	}
	return decodeReply(d.Method.Output(), reply.b)
}

// notSentReason says why a context ended.
func notSentReason(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "its deadline had passed"
	}
	return "its caller had cancelled it"
}

// decodeReply turns a reply's wire bytes b, of type md, into the result's
// JSON, or failing that into a dynamic message, which is what gRPC's codec
// decoded replies into before: the same checks (required fields, through
// the panic guard of schema.Unmarshal) and, on failure, the same status.
func decodeReply(md protoreflect.MessageDescriptor, b []byte) (Reply, error) {
	if out, ok := schema.TranscodeOutput(md, b); ok {
		return Reply{JSON: out, Wire: b}, nil
	}
	m := dynamicpb.NewMessage(md)
	// AllowPartial only skips a required-field check that cannot fail.
	if err := schema.Unmarshal(proto.UnmarshalOptions{AllowPartial: !schema.CanLackRequired(md)}, b, m); err != nil {
		return Reply{}, status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
	}
	return Reply{Message: m}, nil
}

// wireReply receives a backend's reply undecoded: from a gRPC connection
// through wireCodec, from the in-process channel through UnmarshalBinary.
type wireReply struct{ b []byte }

// UnmarshalBinary keeps b, the reply's wire bytes.
func (r *wireReply) UnmarshalBinary(b []byte) error {
	r.b = b
	return nil
}

// wireCodec is gRPC's protobuf codec, except that a *wireReply receives
// the bytes of the message as they came.
type wireCodec struct{}

func (wireCodec) Name() string { return grpcproto.Name }

func (wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*wireRequest); ok {
		return mem.BufferSlice{mem.SliceBuffer(r.b)}, nil
	}
	return encoding.GetCodecV2(grpcproto.Name).Marshal(v)
}

// wireRequest is a request sent as the wire bytes it is already encoded
// to (Dispatch.Wire): through wireCodec over a gRPC connection, through
// MarshalBinary over the in-process channel, where gRPC's codec would
// encode the message again.
type wireRequest struct{ b []byte }

// MarshalBinary returns the request's wire bytes, which are not to be
// written to.
func (r *wireRequest) MarshalBinary() ([]byte, error) { return r.b, nil }

func (wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*wireReply); ok {
		r.b = data.Materialize()
		return nil
	}
	return encoding.GetCodecV2(grpcproto.Name).Unmarshal(data, v)
}

// undecodedReply is the call option for wireCodec, made once.
var undecodedReply = grpc.ForceCodecV2(wireCodec{})
