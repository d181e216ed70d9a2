package backend

import (
	"context"

	"github.com/mandate-dev/mandate/pkg/receipt"
)

// Metadata the executor adds to every call it dispatches.
const (
	// InvocationIDHeader carries the invocation id: one per governed call, on every audit row
	// and receipt of it, the same on each redelivery of the call.
	InvocationIDHeader = receipt.InvocationIDHeader
	// IdempotencyKeyHeader carries the client's idempotency key; absent when it gave none.
	IdempotencyKeyHeader = receipt.IdempotencyKeyHeader
)

// Caller is who a relayed call is made for and what the executor said about it. Every field
// comes from a verified token or from the executor's metadata of the call.
type Caller struct {
	// Tenant scopes everything the caller may touch (`tenant` claim). Never empty.
	Tenant string
	// Org is the organisation inside the tenant (`org` claim); may be empty.
	Org string
	// UserID is the user the call is made for (`sub`); for an agent, the user who delegated.
	// Never empty.
	UserID string
	// AgentID is the acting agent (RFC 8693 `act.sub`); empty when a human called.
	AgentID string
	// Model and ModelVersion name the agent's model (`act.mandate_model`,
	// `act.mandate_model_version`); empty when a human called or the token does not say.
	Model        string
	ModelVersion string
	// Issuer is the user's token's `iss`: user ids are unique per issuer only.
	Issuer string
	// TokenID is the user's token's `jti`, for correlating with Mandate's audit trail.
	TokenID string
	// Relay is the Mandate service that relayed the call (its service token's
	// `mandate_service`), the executor.
	Relay string
	// InvocationID is the executor's invocation id (InvocationIDHeader); empty only when the
	// relay sent none, which the executor never does on a command.
	InvocationID string
	// IdempotencyKey is the client's idempotency key (IdempotencyKeyHeader); empty when none.
	IdempotencyKey string
}

// IsAgent reports whether an AI agent made the call for UserID.
func (c Caller) IsAgent() bool { return c.AgentID != "" }

// CallerFrom returns the caller of a call the Guard admitted. It refuses a call without an
// authenticated user (a service token alone, or a server without the Guard) at authenticate
// with CodeAuthenticationMissingCredentials, a call not relayed by the Guard's relay at
// scope_check with CodeScopeNotViaExecutor, and executor metadata sent twice or too long
// (MaxInvocationIDLen, MaxIdempotencyKeyLen) with CodeInvalidMetadata or CodeInvalidKey; each
// refusal is an error carrying its gRPC status, which a handler returns as it is ([AsError]
// reads its stage and code).
//
// It reads what pkg/receipt reads, by the same rules: on a server whose interceptors are
// Mandate's own rather than a Guard's, any relaying Mandate service is accepted, as
// receipt.FromContext accepts.
func CallerFrom(ctx context.Context) (Caller, error) {
	var trust receipt.Trust
	if relay, ok := ctx.Value(relayKey{}).(string); ok {
		trust.Services = []string{relay}
	}
	inv, err := trust.FromContext(ctx)
	if err != nil {
		return Caller{}, err
	}
	return CallerOf(inv), nil
}

// CallerOf is the Caller of an invocation pkg/receipt read (receipt.Trust.FromContext), for a
// backend that names the services it trusts with a receipt.Trust of its own.
func CallerOf(inv receipt.Invocation) Caller {
	p := inv.Caller
	return Caller{
		Tenant: p.Tenant, Org: p.Org, UserID: p.UserID,
		AgentID: p.AgentID, Model: p.Model, ModelVersion: p.ModelVersion,
		Issuer: p.Issuer, TokenID: p.TokenID, Relay: p.Via,
		InvocationID: inv.ID, IdempotencyKey: inv.IdempotencyKey,
	}
}

// Bounds of the executor's metadata; longer values are refused, never truncated.
const (
	// MaxInvocationIDLen bounds an invocation id, in bytes.
	MaxInvocationIDLen = receipt.MaxInvocationIDLen
	// MaxIdempotencyKeyLen bounds an idempotency key, in bytes.
	MaxIdempotencyKeyLen = receipt.MaxIdempotencyKeyLen
)
