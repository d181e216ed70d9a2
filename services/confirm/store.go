package confirm

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"
)

// Store keeps challenges. Implementations: services/confirm/memory and
// services/confirm/postgres; services/confirm/confirmtest holds the
// conformance suite both pass.
//
// Every method is scoped to one tenant: a challenge of another tenant reads
// as ErrNotFound. Challenges come back with their effective State (EXPIRED
// once ExpiresAt is reached, judged by the store's clock). State changes are
// atomic: of any number of concurrent Decide (or Redeem) calls on one
// challenge, at most one succeeds. Errors are *Error values matching the
// sentinels named below, or ErrUnavailable when the store cannot be reached.
type Store interface {
	// Create stores c as PENDING with CreatedAt = now and ExpiresAt = now +
	// ttl by the store's clock; the state and time fields of c are ignored.
	// If the tenant already has a challenge for c.InvocationID, that one is
	// returned instead with created false (opening is idempotent per
	// invocation). ErrInvalid for a missing id, tenant, invocation or digest
	// or a ttl ≤ 0.
	Create(ctx context.Context, c Challenge, ttl time.Duration) (stored Challenge, created bool, err error)

	// Get returns the tenant's challenge, or ErrNotFound.
	Get(ctx context.Context, tenant, id string) (Challenge, error)

	// ListPending returns up to limit of the tenant's challenges that are
	// pending and not expired, newest first.
	ListPending(ctx context.Context, tenant string, limit int) ([]Challenge, error)

	// CountPending returns how many of the tenant's challenges that are
	// pending and not expired were requested by user through agent ("" for
	// the user acting directly).
	CountPending(ctx context.Context, tenant, user, agent string) (int, error)

	// Decide records d on a PENDING, unexpired challenge: APPROVED or
	// DECLINED, DecidedBy, DecidedAt (store clock) and DecisionChannel.
	// ErrNotFound, ErrAlreadyDecided (approved, declined or redeemed before)
	// or ErrExpired (nobody decided in time).
	Decide(ctx context.Context, tenant, id string, d Decision) (Challenge, error)

	// Redeem moves an APPROVED, unexpired challenge whose InvocationDigest
	// equals digest to REDEEMED, exactly once. Otherwise: ErrNotFound;
	// ErrRefused (declined); ErrGrantMismatch (another digest);
	// ErrAlreadyRedeemed; ErrExpired; ErrPending (nobody decided yet).
	Redeem(ctx context.Context, tenant, id, digest string) (Challenge, error)

	// Release moves a REDEEMED, unexpired challenge whose InvocationDigest
	// equals digest back to APPROVED, so that it can be redeemed once more
	// (its call provably did not run). Releasing an APPROVED one changes
	// nothing. Otherwise: ErrNotFound; ErrGrantMismatch (another digest);
	// ErrExpired; ErrPending, ErrRefused as Redeem.
	Release(ctx context.Context, tenant, id, digest string) (Challenge, error)

	// Watch sends the challenge as it is now, then again whenever it changes
	// (through any process sharing the store) or expires, until it is no
	// longer PENDING; then it closes the channel. It also closes the channel
	// when ctx ends or the store is closed. ErrNotFound as Get.
	Watch(ctx context.Context, tenant, id string) (<-chan Challenge, error)
}

// SessionStore keeps the approval page's one-time sign-in tokens and
// sessions, in the database so that any replica can serve a signed-in
// human. The memory and Postgres stores implement it next to Store.
type SessionStore interface {
	// ConsumeLoginToken records that the sign-in token jti was used. It
	// succeeds once per jti; later calls fail with ErrLoginTokenUsed.
	// expiresAt is the token's expiry: the record may be dropped after it,
	// when the token itself no longer verifies.
	ConsumeLoginToken(ctx context.Context, jti string, expiresAt time.Time) error

	// CreateSession stores s with CreatedAt = now and ExpiresAt = now + ttl
	// by the store's clock.
	CreateSession(ctx context.Context, s Session, ttl time.Duration) (Session, error)

	// Session returns the unexpired session with this id hash, or
	// ErrNotFound.
	Session(ctx context.Context, idHash string) (Session, error)

	// DeleteSession ends a session; deleting a missing one is not an error.
	DeleteSession(ctx context.Context, idHash string) error
}

// NoticeKind is what happened to a challenge. The strings are the event
// types the webhook relay sends.
type NoticeKind string

// The notice kinds.
const (
	// NoticeOpened: a challenge was created (an idempotent re-open is not).
	NoticeOpened NoticeKind = "challenge.opened"
	// NoticeDecided: a human approved or declined a challenge.
	NoticeDecided NoticeKind = "challenge.decided"
	// NoticeExpired: a challenge nobody decided reached its expiry.
	NoticeExpired NoticeKind = "challenge.expired"
)

// Notice is one event for the webhook relay: a row of the stores' outbox,
// recorded in the same transaction as the change it reports, delivered at
// least once.
type Notice struct {
	// ID is assigned by the store, increasing in the order notices are
	// recorded.
	ID int64
	// Kind is what happened.
	Kind NoticeKind
	// Tenant and ChallengeID name the challenge.
	Tenant      string
	ChallengeID string
	// At is when it happened, by the store's clock: the challenge's
	// CreatedAt, DecidedAt or ExpiresAt.
	At time.Time
	// Attempts is how many delivery attempts failed so far (NoticeFailed).
	Attempts int
	// Challenge is the challenge as stored now, with its effective state
	// (as Get returns it), not as it was when the notice was recorded.
	Challenge Challenge
}

// MaxNoticeReason bounds the reason kept with a failed or given-up notice,
// in bytes; the Postgres notices table checks it too.
const MaxNoticeReason = 500

// NoticeReason returns reason as stores keep it: valid UTF-8 without NUL
// bytes (a webhook's answer may hold anything), cut at a character boundary
// to at most MaxNoticeReason bytes. Stores call it so that every
// implementation keeps the same text.
func NoticeReason(reason string) string {
	reason = strings.ReplaceAll(strings.ToValidUTF8(reason, "\uFFFD"), "\x00", "")
	if len(reason) <= MaxNoticeReason {
		return reason
	}
	cut := MaxNoticeReason
	for cut > 0 && !utf8.RuneStart(reason[cut]) {
		cut--
	}
	return reason[:cut]
}

// Purger is a Store that bounds what it keeps: PurgeExpired deletes up
// to limit challenges (any tenant) that expired longer ago than the
// store's retention, with their notices, oldest first, and returns how
// many. Such a challenge can no longer be decided, redeemed or released;
// until then it reads as EXPIRED. The webhook relay's round calls it, so
// that every replica purges (each row once). The memory and Postgres
// stores implement it.
type Purger interface {
	PurgeExpired(ctx context.Context, limit int) (int, error)
}

// NoticeStore keeps the notices: a durable outbox of what happened to
// challenges, so that a relay running in any replica can deliver each as a
// webhook at least once, even after a crash. The memory and Postgres stores
// implement it next to Store.
//
// Store records the notices itself, in the same transaction as the change:
// Create records a NoticeOpened when it created the challenge (created
// true), Decide a NoticeDecided when it recorded the decision; refusals,
// Redeem and Release record nothing. Expiry is no write, so ExpireDue
// records the NoticeExpired ones. A notice is due as soon as it is
// recorded. Notices span tenants: the relay serves them all, and
// Notice.Challenge is always the challenge of Notice.Tenant.
type NoticeStore interface {
	// ExpireDue records a NoticeExpired for each challenge (any tenant)
	// still stored PENDING whose ExpiresAt has passed by the store's clock
	// and that has no expired notice yet — once across every process
	// sharing the store, however many call it at once, and never again
	// after its notice was delivered — up to limit per call, those that
	// expired first first; it returns how many it recorded. A challenge
	// decided before its expiry never gets one (Decide refuses one after
	// it), nor does an approved grant that expires unredeemed.
	ExpireDue(ctx context.Context, limit int) (int, error)

	// ClaimNotices returns up to limit notices due for delivery (not
	// delivered, not given up, next attempt at or before now), oldest
	// (lowest ID) first, and hides them from every other claimer for lease:
	// their next attempt moves to now + lease, so a claimer that dies
	// leaves them to be claimed again then. ErrInvalid for a lease ≤ 0.
	ClaimNotices(ctx context.Context, limit int, lease time.Duration) ([]Notice, error)

	// NoticeDelivered drops a delivered notice. Unknown ids are no error.
	NoticeDelivered(ctx context.Context, id int64) error

	// NoticeFailed records a failed attempt: Attempts+1, the next attempt
	// after from now (a negative after counts as zero), and the reason
	// (bounded by NoticeReason). It does not revive a given-up notice.
	// Unknown ids are no error: another claimer may have delivered it after
	// the lease ran out.
	NoticeFailed(ctx context.Context, id int64, after time.Duration, reason string) error

	// NoticeGiveUp stops delivering a notice, keeping it with its reason
	// (bounded by NoticeReason) for an operator to look at; given-up
	// notices are never claimed again. Attempts is left as it is. Unknown
	// ids are no error.
	NoticeGiveUp(ctx context.Context, id int64, reason string) error
}

// DecideRefusal says why a challenge stored in state stored (expired by the
// store's clock or not) cannot be decided, or nil when it can. Stores share
// it so that every implementation refuses alike.
func DecideRefusal(stored State, expired bool) error {
	switch {
	case stored != StatePending:
		return ErrAlreadyDecided
	case expired:
		return ErrExpired
	}
	return nil
}

// RedeemRefusal says why a challenge stored in state stored cannot be
// redeemed by an invocation whose digest matches it or not, or nil when it
// can. A declined challenge is refused whatever the digest; a digest that
// does not match is refused before anything about the grant is revealed.
func RedeemRefusal(stored State, digestMatches, expired bool) error {
	switch {
	case stored == StateDeclined:
		return ErrRefused
	case !digestMatches:
		return ErrGrantMismatch
	case stored == StateRedeemed:
		return ErrAlreadyRedeemed
	case expired:
		return ErrExpired
	case stored == StatePending:
		return ErrPending
	case stored == StateApproved:
		return nil
	}
	return refuse(ErrUnavailable, "challenge in unknown state "+string(stored))
}

// ReleaseRefusal is why a challenge in state stored cannot be released
// (nil: it can, or it is APPROVED already). Stores call it so that every
// implementation refuses alike.
func ReleaseRefusal(stored State, digestMatches, expired bool) error {
	switch {
	case !digestMatches:
		return ErrGrantMismatch
	case stored == StateDeclined:
		return ErrRefused
	case expired:
		return ErrExpired
	case stored == StatePending:
		return ErrPending
	case stored == StateApproved, stored == StateRedeemed:
		return nil
	}
	return refuse(ErrUnavailable, "challenge in unknown state "+string(stored))
}

// CheckNew validates a challenge about to be created; stores call it first
// so that every implementation refuses the same inputs.
func CheckNew(c *Challenge, ttl time.Duration) error {
	switch {
	case c.ID == "":
		return Invalid("id", "is required")
	case c.Tenant == "":
		return Invalid("tenant", "is required")
	case c.InvocationID == "":
		return Invalid("invocation_id", "is required")
	case !ValidDigest(c.InvocationDigest):
		return Invalid("invocation_digest", "must be 64 lower-case hex characters")
	case c.RequesterUser == "":
		return Invalid("requester_user", "is required")
	case c.Approver.Kind != ApproverRequestingUser && c.Approver.Kind != ApproverPermissionHolder:
		return Invalid("approver_kind", "must be REQUESTING_USER or PERMISSION_HOLDER")
	case c.Approver.Kind == ApproverPermissionHolder && c.Approver.Permission == "":
		return Invalid("approver_permission", "is required for PERMISSION_HOLDER")
	case ttl < time.Microsecond:
		return Invalid("ttl", "must be positive")
	}
	return nil
}
