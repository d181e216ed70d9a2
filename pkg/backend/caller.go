package backend

import (
	"context"
	"regexp"

	"google.golang.org/grpc/metadata"

	"github.com/mandate-dev/mandate/pkg/receipt"
)

// Metadata the executor adds to every call it dispatches.
const (
	// InvocationIDHeader carries the invocation id: one per governed call, on every audit row
	// and receipt of it, the same on each redelivery of the call.
	InvocationIDHeader = receipt.InvocationIDHeader
	// IdempotencyKeyHeader carries the client's idempotency key; absent when it gave none.
	IdempotencyKeyHeader = receipt.IdempotencyKeyHeader
	// ManifestDigestHeader carries the digest of the manifest the executor governs the call
	// with ("sha256:" and 64 lower-case hex digits); absent from an executor of an earlier
	// release.
	ManifestDigestHeader = "x-mandate-manifest-digest"
)

// manifestDigestRE is the shape of a manifest digest.
var manifestDigestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

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
	// ManifestDigest is the digest of the manifest the executor governed the call with
	// (ManifestDigestHeader), for a backend that checks it runs the declaration it expects;
	// empty when none was sent.
	ManifestDigest string
}

// IsAgent reports whether an AI agent made the call for UserID.
func (c Caller) IsAgent() bool { return c.AgentID != "" }

// CallerFrom returns the caller of a call the Guard admitted. It refuses a call without an
// authenticated user (a service token alone, or a server without the Guard) at authenticate
// with CodeAuthenticationMissingCredentials, a call not relayed by the Guard's relay at
// scope_check with CodeScopeNotViaExecutor, and executor metadata sent twice or too long
// (MaxInvocationIDLen, MaxIdempotencyKeyLen), and a manifest digest sent twice or malformed,
// with CodeInvalidMetadata or CodeInvalidKey; each
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
	c, err := CallerOf(ctx, inv)
	if err != nil {
		return Caller{}, err
	}
	return c, nil
}

// CallerOf is the Caller of an invocation that pkg/receipt read from ctx
// (receipt.Trust.FromContext), for a backend that names the services it trusts with a
// receipt.Trust of its own; it adds what pkg/receipt does not read (ManifestDigest), refused
// as CallerFrom refuses it. The Caller holds what inv says even on refusal, for the log.
func CallerOf(ctx context.Context, inv receipt.Invocation) (Caller, error) {
	p := inv.Caller
	c := Caller{
		Tenant: p.Tenant, Org: p.Org, UserID: p.UserID,
		AgentID: p.AgentID, Model: p.Model, ModelVersion: p.ModelVersion,
		Issuer: p.Issuer, TokenID: p.TokenID, Relay: p.Via,
		InvocationID: inv.ID, IdempotencyKey: inv.IdempotencyKey,
	}
	switch ds := metadata.ValueFromIncomingContext(ctx, ManifestDigestHeader); {
	case len(ds) > 1:
		return c, Refuse(StageRequestCheck, CodeInvalidMetadata, "more than one manifest digest")
	case len(ds) == 1 && !manifestDigestRE.MatchString(ds[0]):
		// Not echoed: it may be anything.
		return c, Refuse(StageRequestCheck, CodeInvalidMetadata, "the manifest digest is malformed")
	case len(ds) == 1:
		c.ManifestDigest = ds[0]
	}
	return c, nil
}

// Bounds of the executor's metadata; longer values are refused, never truncated.
const (
	// MaxInvocationIDLen bounds an invocation id, in bytes.
	MaxInvocationIDLen = receipt.MaxInvocationIDLen
	// MaxIdempotencyKeyLen bounds an idempotency key, in bytes.
	MaxIdempotencyKeyLen = receipt.MaxIdempotencyKeyLen
)
