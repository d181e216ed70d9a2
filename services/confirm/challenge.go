package confirm

import (
	"crypto/rand"
	"encoding/base64"
	"regexp"
	"time"

	"github.com/mandate-dev/mandate/internal/contract"
)

// State is where a challenge is in its life. The strings are the names of
// mandate.v1.ChallengeState without the prefix.
type State string

// The states. EXPIRED is never stored: a PENDING or APPROVED challenge whose
// ExpiresAt has passed reads as EXPIRED.
const (
	StatePending  State = "PENDING"
	StateApproved State = "APPROVED"
	StateDeclined State = "DECLINED"
	StateExpired  State = "EXPIRED"
	StateRedeemed State = "REDEEMED"
)

// ApproverKind says who may approve: the user the call is made for, or
// another user holding a permission (four eyes). The strings are those of
// the manifest's approver declaration.
type ApproverKind string

// The approver kinds.
const (
	ApproverRequestingUser   ApproverKind = "REQUESTING_USER"
	ApproverPermissionHolder ApproverKind = "PERMISSION_HOLDER"
)

// ApproverPolicy is the declaration's approver policy, copied onto the
// challenge when it is opened so that a later manifest change does not
// change who may approve a pending request.
type ApproverPolicy struct {
	// Kind is REQUESTING_USER or PERMISSION_HOLDER.
	Kind ApproverKind
	// Permission is what a PERMISSION_HOLDER approver must hold; empty for
	// REQUESTING_USER.
	Permission string
}

// Decision channels: where a human said yes or no.
const (
	ChannelApprovalPage   = contract.ChannelApprovalPage
	ChannelMCPElicitation = contract.ChannelMCPElicitation
	ChannelAPI            = contract.ChannelAPI
)

// ValidChannel reports whether c is one of the decision channels.
func ValidChannel(c string) bool {
	return c == ChannelApprovalPage || c == ChannelMCPElicitation || c == ChannelAPI
}

// Lifetimes of a challenge.
const (
	// DefaultTTL applies when Open is given none.
	DefaultTTL = 10 * time.Minute
	// MaxTTL is the longest a challenge may stay open.
	MaxTTL = 24 * time.Hour
)

// ApprovalPath is where the approval page serves a challenge:
// ApprovalPath + id.
const ApprovalPath = "/approve/"

// Challenge is a request for a human's confirmation of one exact invocation.
type Challenge struct {
	// ID is random (128 bits), URL-safe; see NewID.
	ID string
	// Tenant owns the challenge; nobody outside it sees it.
	Tenant string
	// Command is the command's code.
	Command string
	// Risk is the declared risk, "L0" … "L4".
	Risk string
	// InvocationDigest is the executor's SHA-256 (64 lower-case hex) over
	// command, request, principal and idempotency key. Only the invocation
	// with this digest can redeem the grant.
	InvocationDigest string
	// InvocationID is the invocation that opened the challenge; opening
	// twice for the same invocation returns the first challenge.
	InvocationID string
	// RequesterUser is the user the call is made for.
	RequesterUser string
	// RequesterAgent is the agent that asked, empty when the user did.
	RequesterAgent string
	// Approver is the declaration's approver policy.
	Approver ApproverPolicy
	// Prompt is what the approver is shown.
	Prompt Prompt
	// State is the effective state (EXPIRED once ExpiresAt has passed).
	State State
	// CreatedAt and ExpiresAt are set by the store, from its clock.
	CreatedAt, ExpiresAt time.Time
	// DecidedBy, DecidedAt and DecisionChannel record the human decision;
	// zero while pending.
	DecidedBy       string
	DecidedAt       time.Time
	DecisionChannel string
	// RedeemedAt is when the grant was used; zero until then.
	RedeemedAt time.Time
	// Elicitable is not stored: Get sets it for its caller, true when that
	// caller may answer the challenge through an MCP confirmation form
	// (see Service.Elicitable).
	Elicitable bool
}

// Decided reports whether a human decided the challenge.
func (c *Challenge) Decided() bool { return c.DecidedBy != "" }

// Decision is a human's answer, as a store records it.
type Decision struct {
	// Approve is true for yes, false for no.
	Approve bool
	// By is the deciding user.
	By string
	// Channel is where the decision was made (ValidChannel).
	Channel string
}

// Grant is a redeemed approval: what the executor records in the audit row.
type Grant struct {
	// ChallengeID names the challenge.
	ChallengeID string
	// Approver is the user who approved; never empty, never an agent.
	Approver string
	// DecidedAt is when the approver decided.
	DecidedAt time.Time
	// Channel is where the approver decided.
	Channel string
	// PreviewDigest is the executor's digest of the backend's preview the
	// approver was shown (Prompt.PreviewDigest); empty when there was none.
	PreviewDigest string
}

// GrantOf returns the grant of a redeemed challenge.
func GrantOf(c Challenge) Grant {
	return Grant{ChallengeID: c.ID, Approver: c.DecidedBy, DecidedAt: c.DecidedAt, Channel: c.DecisionChannel,
		PreviewDigest: c.Prompt.PreviewDigest}
}

// Session is a signed-in human on the approval page.
type Session struct {
	// IDHash is the hex SHA-256 of the session cookie's value: a store read
	// alone cannot be turned into a working cookie.
	IDHash string
	// Tenant and UserID identify the human.
	Tenant, UserID string
	// CSRFToken is the synchronizer token every form of the session carries.
	CSRFToken string
	// CreatedAt and ExpiresAt are set by the store, from its clock.
	CreatedAt, ExpiresAt time.Time
}

var (
	idRE     = regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`)
	digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// NewID returns a random 128-bit challenge id, base64url without padding
// (22 characters).
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// ValidID reports whether id has the shape NewID produces. Anything else
// cannot name a challenge and is answered with not_found without a lookup.
func ValidID(id string) bool { return idRE.MatchString(id) }

// ValidDigest reports whether d is 64 lower-case hex characters.
func ValidDigest(d string) bool { return digestRE.MatchString(d) }

// EffectiveState is the state a stored challenge has at now: PENDING and
// APPROVED turn EXPIRED once expiresAt is reached. Stores use it so that
// every implementation reads expiry the same way.
func EffectiveState(stored State, expiresAt, now time.Time) State {
	if (stored == StatePending || stored == StateApproved) && !now.Before(expiresAt) {
		return StateExpired
	}
	return stored
}
