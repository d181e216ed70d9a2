package receipt

import (
	"context"
	"slices"

	"google.golang.org/grpc/metadata"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// Metadata keys the executor sets on every call it dispatches to a backend.
const (
	// InvocationIDHeader carries the invocation id that every log line, audit row and
	// receipt of the call carries.
	InvocationIDHeader = "x-mandate-invocation-id"
	// IdempotencyKeyHeader carries the client's idempotency key; absent or empty when the
	// client gave none.
	IdempotencyKeyHeader = "x-mandate-idempotency-key"
)

// Bounds of what the executor sends, as its API and mandate.v1.GetReceiptRequest state them.
const (
	// MaxInvocationIDLen bounds an invocation id.
	MaxInvocationIDLen = 128
	// MaxIdempotencyKeyLen bounds an idempotency key.
	MaxIdempotencyKeyLen = 255
)

// Pipeline stages (mandate.v1.Stage; docs/architecture/pipeline.md) this package refuses at; the executor passes them on unchanged.
const (
	// StageRequestCheck refuses malformed executor metadata.
	StageRequestCheck = failure.StageRequest
	// StageScopeCheck refuses a caller that did not come through Mandate.
	StageScopeCheck = failure.StageScope
	// StageIdempotencyCheck refuses a misused idempotency key or a fenced invocation.
	StageIdempotencyCheck = failure.StageIdempotency
	// StageDispatch reports that the receipt store could not answer.
	StageDispatch = "dispatch"
)

// Codes of this package's refusals, stable: the executor and the audit trail key on them.
// They are rows of Mandate's table of codes (internal/failure), named here for backends
// outside this module, which cannot import it.
const (
	// CodeNotViaExecutor: the caller reached the backend without going through a trusted
	// Mandate service (PermissionDenied).
	CodeNotViaExecutor = failure.CodeScopeNotViaExecutor
	// CodeInvalidMetadata: the invocation id metadata is missing where an effect needs it,
	// sent twice or too long (InvalidArgument).
	CodeInvalidMetadata = failure.CodeRequestInvalidMetadata
	// CodeInvalidKey: the idempotency key metadata is sent twice or too long
	// (InvalidArgument).
	CodeInvalidKey = failure.CodeIdempotencyInvalidKey
	// CodeFenced: the invocation was resolved as not executed (GetReceipt fenced it), so
	// this delivery of it may never act (FailedPrecondition, not retriable).
	CodeFenced = failure.CodeReceiptFenced
	// CodeUnavailable: the receipt store could not be read (Unavailable, retriable).
	CodeUnavailable = failure.CodeReceiptUnavailable
)

// Invocation is what the executor says about the call being served.
type Invocation struct {
	// ID is the invocation id; empty when the relaying service sent none (reads need none;
	// [Effect] and [Replay] refuse an empty id).
	ID string
	// IdempotencyKey is the client's idempotency key; empty when there is none.
	IdempotencyKey string
	// Caller is the end user (or their agent) the call is made for, with Via naming the
	// Mandate service that relayed it.
	Caller identity.Principal
}

// Trust names the Mandate services a backend serves. The zero value trusts any Mandate
// service: a valid service token is already proof of being one.
type Trust struct {
	// Services lists service token names, e.g. "executor"; empty means any.
	Services []string
}

func (t Trust) trusted(service string) bool {
	return service != "" && (len(t.Services) == 0 || slices.Contains(t.Services, service))
}

// FromContext is Trust{}.FromContext: it accepts calls relayed by any Mandate service.
func FromContext(ctx context.Context) (Invocation, error) { return Trust{}.FromContext(ctx) }

// FromContext returns the invocation of a call relayed by a trusted Mandate service: the
// authenticated principal (put in ctx by the server's identity interceptor) must be an end
// user whose call a trusted service relayed (Via). A call without one is refused at
// authenticate; a user or agent calling directly, or a call relayed by another service, at
// scope_check with scope.not_via_executor. Metadata sent more than once, an invocation id longer
// than MaxInvocationIDLen or a key longer than MaxIdempotencyKeyLen is refused too, since
// guessing which value was meant could de-duplicate the wrong requests.
func (t Trust) FromContext(ctx context.Context) (Invocation, error) {
	p, ok := identity.FromContext(ctx)
	if !ok || p.Tenant == "" || p.UserID == "" {
		// The server's interceptor authenticates every call; reaching here means it was not
		// installed, which must not turn into serving an anonymous caller.
		return Invocation{}, failure.New(identity.Stage, failure.CodeAuthenticationMissingCredentials, "no authenticated caller")
	}
	if !t.trusted(p.Via) {
		return Invocation{Caller: p}, notViaExecutor()
	}
	inv, err := fromMetadata(ctx)
	inv.Caller = p
	return inv, err
}

// fromMetadata reads the executor's metadata from an incoming gRPC context,
// copying only the two values it needs, not the whole metadata.
func fromMetadata(ctx context.Context) (Invocation, error) {
	var inv Invocation
	switch ids := metadata.ValueFromIncomingContext(ctx, InvocationIDHeader); {
	case len(ids) > 1:
		return inv, invalidMetadata("more than one invocation id")
	case len(ids) == 1 && len(ids[0]) > MaxInvocationIDLen:
		return inv, invalidMetadata("the invocation id is longer than 128 bytes")
	case len(ids) == 1:
		inv.ID = ids[0]
	}
	switch keys := metadata.ValueFromIncomingContext(ctx, IdempotencyKeyHeader); {
	case len(keys) > 1:
		return inv, failure.New(StageIdempotencyCheck, CodeInvalidKey, "more than one idempotency key")
	case len(keys) == 1 && len(keys[0]) > MaxIdempotencyKeyLen:
		return inv, failure.New(StageIdempotencyCheck, CodeInvalidKey, "the idempotency key is longer than 255 bytes")
	case len(keys) == 1:
		inv.IdempotencyKey = keys[0]
	}
	return inv, nil
}

// service checks that the caller of the ReceiptService is a trusted Mandate service, calling
// on its own behalf (a service token alone) or relaying a user's call.
func (t Trust) service(ctx context.Context) error {
	p, ok := identity.FromContext(ctx)
	if !ok {
		return failure.New(identity.Stage, failure.CodeAuthenticationMissingCredentials, "no authenticated caller")
	}
	if (p.Kind == identity.KindService && t.trusted(p.ServiceName)) || t.trusted(p.Via) {
		return nil
	}
	e := failure.New(StageScopeCheck, CodeNotViaExecutor, "receipts are for Mandate services only")
	e.Remedy = "ask the executor; it resolves invocations through receipts"
	return e
}

func notViaExecutor() *failure.Error {
	e := failure.New(StageScopeCheck, CodeNotViaExecutor,
		"this backend only serves calls made through Mandate; call the command through the executor")
	e.Remedy = "call the command through the executor"
	return e
}

func invalidMetadata(msg string) *failure.Error {
	return failure.New(StageRequestCheck, CodeInvalidMetadata, msg)
}
