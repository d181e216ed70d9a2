package helpdesk

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/mandate-dev/mandate/internal/failure"
)

// Metadata keys the executor sets on every call it dispatches to a backend.
const (
	// InvocationIDHeader carries the invocation id that every log line and audit row of the
	// call carries.
	InvocationIDHeader = "x-mandate-invocation-id"
	// IdempotencyKeyHeader carries the client's idempotency key; absent or empty when the
	// client gave none.
	IdempotencyKeyHeader = "x-mandate-idempotency-key"
)

// MaxIdempotencyKeyLen bounds an idempotency key, as the executor's API does.
const MaxIdempotencyKeyLen = 255

// maxInvocationIDLen bounds what a log line repeats from the caller.
const maxInvocationIDLen = 128

// Invocation is what the executor says about the call being served.
type Invocation struct {
	// ID is the invocation id; empty when the caller sent none.
	ID string
	// IdempotencyKey is the client's idempotency key; empty when there is none.
	IdempotencyKey string
}

// InvocationFromContext reads the executor's metadata from an incoming gRPC context. Missing
// keys give empty fields; a key sent more than once, or an idempotency key longer than
// MaxIdempotencyKeyLen, is refused at idempotency_check with idempotency.invalid_key, since
// guessing which value was meant could de-duplicate the wrong requests.
func InvocationFromContext(ctx context.Context) (Invocation, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	var inv Invocation
	ids := md.Get(InvocationIDHeader)
	if len(ids) > 0 {
		inv.ID = ids[0]
		if len(inv.ID) > maxInvocationIDLen {
			inv.ID = inv.ID[:maxInvocationIDLen]
		}
	}
	keys := md.Get(IdempotencyKeyHeader)
	switch {
	case len(keys) > 1:
		return inv, refuse(StageIdempotencyCheck, CodeInvalidKey, codes.InvalidArgument, "more than one idempotency key")
	case len(keys) == 1 && len(keys[0]) > MaxIdempotencyKeyLen:
		return inv, refuse(StageIdempotencyCheck, CodeInvalidKey, codes.InvalidArgument, "the idempotency key is longer than 255 bytes")
	case len(keys) == 1:
		inv.IdempotencyKey = keys[0]
	}
	return inv, nil
}

// withInvocation attaches the invocation id to a refusal so the client can quote it.
func withInvocation(e *failure.Error, inv Invocation) *failure.Error {
	if e.InvocationID == "" {
		e.InvocationID = inv.ID
	}
	return e
}
