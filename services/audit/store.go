package audit

import (
	"context"
	"time"
)

// Store keeps the audit rows. Implementations: services/audit/memory and
// services/audit/postgres; services/audit/audittest holds the conformance suite both pass.
//
// Every method is scoped to one tenant (except PendingIntents, which serves reconciliation):
// no method returns a row of a tenant other than the one asked for.
type Store interface {
	// AppendBatch appends recs atomically: either every new row is committed or none is. Each
	// record must be normalized and valid (the Writer sees to both). Per tenant, new rows get
	// the next Seq values in the order given and are chained onto the tenant's head. A record
	// whose (Tenant, InvocationID, Phase) is already stored — or appears earlier in recs — is
	// not written again: the stored row is returned in its place and the chain does not move.
	// The result is aligned with recs. Errors match ErrUnavailable when the store cannot be
	// reached (nothing was written, or — if the commit itself was cut off — possibly
	// everything; either way, retrying is safe).
	AppendBatch(ctx context.Context, recs []Record) ([]Stored, error)

	// Query returns one page of the tenant's rows that match f, newest (highest Seq) first.
	Query(ctx context.Context, f Filter) (Page, error)

	// Get returns the tenant's rows of one invocation in Seq order, or an error matching
	// ErrNotFound when it has none.
	Get(ctx context.Context, tenant, invocationID string) ([]Stored, error)

	// Verify walks the tenant's chain in Seq order and reports the first broken link. A broken
	// chain is a Report with OK false, not an error; errors are operational. A store bounded to
	// its newest rows walks those, from the PrevHash of the oldest it keeps.
	Verify(ctx context.Context, tenant string) (Report, error)

	// Watch streams the tenant's committed rows with Seq > afterSeq, in Seq order without gaps:
	// first those already stored, then new ones as they are committed (by any process sharing
	// the store). The channel is closed when ctx ends or the store is closed. A slow reader
	// falls behind but never loses rows, except in a store bounded to its newest rows (the
	// memory store with MaxRows): there a watch from an evicted Seq starts at the oldest kept
	// row, and a reader more than the bound behind skips what was evicted meanwhile.
	Watch(ctx context.Context, tenant string, afterSeq int64) (<-chan Stored, error)

	// PendingIntents returns up to limit intent rows, of any tenant, whose Time is before
	// before and that have no outcome row yet, oldest first.
	PendingIntents(ctx context.Context, before time.Time, limit int) ([]Stored, error)

	// UnresolvedUnknowns returns up to limit outcome rows, of any tenant, whose Outcome is
	// unknown, whose Time is before before, and that no resolution row answers yet, oldest
	// first.
	UnresolvedUnknowns(ctx context.Context, before time.Time, limit int) ([]Stored, error)
}
