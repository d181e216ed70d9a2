package executor

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/mandate-dev/mandate/internal/failure"
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

// Dispatch invokes the command's RPC on its backend.
func (g *GRPCDispatcher) Dispatch(ctx context.Context, d Dispatch) (proto.Message, error) {
	conn, ok := g.conns[d.Command.RPC.Service]
	if !ok {
		return nil, failure.Wrap(StageDispatch, failure.CodeHandlerUnavailable, fmt.Sprintf("no backend is configured for %s", d.Command.RPC.Service), ErrNotSent)
	}
	ctx, cancel := context.WithTimeout(ctx, d.Deadline)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, MetadataInvocationID, d.InvocationID)
	if d.IdempotencyKey != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataIdempotencyKey, d.IdempotencyKey)
	}
	out := dynamicpb.NewMessage(d.Method.Output())
	if err := conn.Invoke(ctx, d.Command.RPC.FullMethod, d.Request, out); err != nil {
		return nil, err
	}
	return out, nil
}
