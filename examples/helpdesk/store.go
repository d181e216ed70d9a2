package helpdesk

import (
	"context"
	"errors"
	"time"

	"github.com/mandate-dev/mandate/pkg/receipt"
)

// Errors returned (wrapped) by Store implementations. The domain turns them into refusals or
// internal errors; none of them carries driver text.
var (
	// ErrNotFound reports that the addressed record does not exist in the tenant.
	ErrNotFound = errors.New("helpdesk: not found")
	// ErrConflict reports a record that already exists, or a change that collided with a
	// concurrent transaction.
	ErrConflict = errors.New("helpdesk: conflict")
	// ErrUnavailable reports that the store could not be reached; nothing was changed and
	// retrying later may succeed.
	ErrUnavailable = errors.New("helpdesk: store unavailable")
)

// TicketFilter selects tickets; all set fields combine with AND.
type TicketFilter struct {
	// Query matches the subject case-insensitively as a substring.
	Query string `json:"query,omitempty"`
	// Statuses keeps tickets in one of them.
	Statuses []TicketStatus `json:"statuses,omitempty"`
	// CustomerEmail keeps the customer's tickets; compared case-insensitively.
	CustomerEmail string `json:"customer_email,omitempty"`
	// Tags keeps tickets that carry every one of them.
	Tags []string `json:"tags,omitempty"`
	// CreatedAfter keeps tickets created at or after it, when set.
	CreatedAfter time.Time `json:"created_after,omitzero"`
}

// TicketCursor is the position of a ticket in search order (newest first: CreatedAt
// descending, then ID descending); a search after it starts with the next ticket.
type TicketCursor struct {
	CreatedAt time.Time
	ID        string
}

// Sequence names a per-tenant id counter.
type Sequence string

// Sequences of the domain.
const (
	// SeqTicket numbers tickets (T-1001, …).
	SeqTicket Sequence = "ticket"
	// SeqReport numbers expense reports (ER-2001, …).
	SeqReport Sequence = "expense_report"
	// SeqRefund numbers refunds (RF-3001, …).
	SeqRefund Sequence = "refund"
	// SeqErasure numbers customer erasures (CE-4001, …).
	SeqErasure Sequence = "erasure"
)

// IdempotencyKey scopes a client's idempotency key to the tenant, the user it acts for and the
// command, as the executor does (docs/architecture/pipeline.md): the same key used by another
// user or for another command is a different key.
type IdempotencyKey struct {
	Tenant  string
	UserID  string
	Command string
	Key     string
}

// Claim is the result of claiming an idempotency key.
type Claim struct {
	// New is true when this transaction claimed the key; false when a committed transaction
	// holds it already, whose request digest and result are then given.
	New bool
	// Digest identifies the request that first used the key.
	Digest string
	// ResultID is the id of the record that request created.
	ResultID string
}

// Reader reads records. Every method is scoped to one tenant: no method returns a record of
// another tenant, whatever the id.
type Reader interface {
	// Ticket returns one ticket, or an error matching ErrNotFound.
	Ticket(ctx context.Context, tenant, id string) (Ticket, error)
	// SearchTickets returns up to limit tickets matching f in search order (newest first),
	// starting after the cursor when it is not nil.
	SearchTickets(ctx context.Context, tenant string, f TicketFilter, after *TicketCursor, limit int) ([]Ticket, error)
	// Refund returns one refund, or an error matching ErrNotFound.
	Refund(ctx context.Context, tenant, id string) (Refund, error)
	// Refunds returns the refunds of a ticket, oldest first.
	Refunds(ctx context.Context, tenant, ticketID string) ([]Refund, error)
	// Report returns one expense report, or an error matching ErrNotFound.
	Report(ctx context.Context, tenant, id string) (ExpenseReport, error)
	// Erasure returns one customer erasure, or an error matching ErrNotFound.
	Erasure(ctx context.Context, tenant, id string) (Erasure, error)
}

// Store keeps the helpdesk's records. Implementations: examples/helpdesk/memory and
// examples/helpdesk/postgres; examples/helpdesk/helpdesktest holds the conformance suite both
// pass.
type Store interface {
	Reader
	// InTx runs fn in one transaction: every change fn makes is committed when it returns nil
	// and none is when it returns an error, which InTx returns unchanged. Records read with a
	// ...ForUpdate method stay locked against other transactions until InTx returns. fn runs
	// once: it may have side effects outside the store (a payment gateway call), so InTx never
	// re-runs it.
	InTx(ctx context.Context, fn func(tx Tx) error) error
}

// Tx is a transaction of a Store; it is valid only inside the InTx callback.
type Tx interface {
	Reader
	// TicketForUpdate is Ticket, locking the ticket until the transaction ends.
	TicketForUpdate(ctx context.Context, tenant, id string) (Ticket, error)
	// InsertTicket stores a new ticket; an existing (Tenant, ID) fails with ErrConflict. Every
	// write refuses a record that breaks its Validate method with an error matching ErrInvalid,
	// and stores what its Normalize method returns.
	InsertTicket(ctx context.Context, t Ticket) error
	// UpdateTicket replaces a stored ticket's mutable fields (everything but Tenant, ID and
	// CreatedAt) with those of t, which must be a valid ticket as a whole; an unknown ticket
	// fails with ErrNotFound.
	UpdateTicket(ctx context.Context, t Ticket) error
	// InsertRefund stores a new refund of an existing ticket; an existing (Tenant, ID) fails
	// with ErrConflict, an unknown ticket with ErrNotFound.
	InsertRefund(ctx context.Context, r Refund) error
	// ReportForUpdate is Report, locking the report until the transaction ends.
	ReportForUpdate(ctx context.Context, tenant, id string) (ExpenseReport, error)
	// InsertReport stores a new expense report; an existing (Tenant, ID) fails with
	// ErrConflict.
	InsertReport(ctx context.Context, r ExpenseReport) error
	// UpdateReport replaces a stored report's mutable fields (everything but Tenant, ID, Owner,
	// OwnerOrg and CreatedAt) with those of r, which must be a valid report as a whole; an
	// unknown report fails with ErrNotFound.
	UpdateReport(ctx context.Context, r ExpenseReport) error
	// EraseCustomer replaces the customer email of every ticket of tenant whose email equals
	// email (compared case-insensitively) with tombstone, and returns how many tickets it
	// changed. An empty email or tombstone fails with ErrInvalid: neither may match or leave
	// a ticket without a customer.
	EraseCustomer(ctx context.Context, tenant, email, tombstone string) (int, error)
	// InsertErasure stores the receipt of an erasure; an existing (Tenant, ID) fails with
	// ErrConflict.
	InsertErasure(ctx context.Context, e Erasure) error
	// NextID advances the tenant's counter seq and returns its new value, max(last, floor)+1:
	// the first call with floor 1000 returns 1001, and a larger floor jumps ahead. Counters
	// are per tenant and roll back with the transaction.
	NextID(ctx context.Context, tenant string, seq Sequence, floor int64) (int64, error)
	// ClaimKey claims k for this transaction with the digest of the request. When a committed
	// transaction holds k already it returns that claim (New false); when a concurrent
	// transaction holds it, ClaimKey waits for that transaction to end first. A claim rolls
	// back with its transaction.
	ClaimKey(ctx context.Context, k IdempotencyKey, digest string) (Claim, error)
	// CompleteKey records the id of the record created under a key claimed by this
	// transaction.
	CompleteKey(ctx context.Context, k IdempotencyKey, resultID string) error
	// Receipt returns the effect receipt of an invocation (pkg/receipt); found is false when
	// there is none. The invocation id stays held against other transactions until this one
	// ends, so a delivery and a fence of one invocation run one after the other.
	Receipt(ctx context.Context, invocationID string) (r receipt.Receipt, found bool, err error)
	// RecordReceipt stores a receipt, which commits or rolls back with the transaction's
	// effects; an invocation that has one already fails with an error matching
	// receipt.ErrFenced or receipt.ErrExecuted, a malformed receipt with receipt.ErrInvalid.
	RecordReceipt(ctx context.Context, r receipt.Receipt) error
}
