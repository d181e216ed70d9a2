package helpdesk

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/mandate-dev/mandate/pkg/backend"
)

// Search page sizes.
const (
	// DefaultPageSize is the page size of a search that names none.
	DefaultPageSize = 20
	// MaxPageSize is the largest page a search returns.
	MaxPageSize = 100
)

// Id floors: the first id of each sequence is floor+1.
const (
	ticketFloor = 1000
	reportFloor = 2000
	refundFloor = 3000
)

// Command codes, as declared in proto/examples/helpdesk/v1; idempotency keys are scoped by them.
const (
	cmdRefund       = "ticket.refund"
	cmdCreateReport = "expense.report.create"
)

// desk is the domain logic. It knows principals and stores, not transports.
type desk struct {
	store   Store
	gateway PaymentGateway
	now     func() time.Time
}

// clock returns the current time at the precision every store keeps.
func (d *desk) clock() time.Time { return d.now().UTC().Truncate(time.Microsecond) }

// searchInput is a ticket search.
type searchInput struct {
	Filter    TicketFilter
	PageSize  int
	PageToken string
}

// pageToken is the opaque next_page_token: the position of the last ticket returned and a
// digest of the search it belongs to, so a token cannot be replayed against another filter.
type pageToken struct {
	Version   int    `json:"v"`
	CreatedAt int64  `json:"t"`
	ID        string `json:"id"`
	Search    string `json:"s"`
}

const pageTokenVersion = 1

func (d *desk) searchTickets(ctx context.Context, p backend.Caller, in searchInput) ([]Ticket, string, error) {
	f := normalizeFilter(in.Filter)
	size := in.PageSize
	if size <= 0 {
		size = DefaultPageSize
	}
	size = min(size, MaxPageSize)
	search := searchDigest(p.Tenant, f)
	var after *TicketCursor
	if in.PageToken != "" {
		c, err := decodePageToken(in.PageToken, search)
		if err != nil {
			return nil, "", err
		}
		after = &c
	}
	// One more than asked tells whether another page exists.
	tickets, err := d.store.SearchTickets(ctx, p.Tenant, f, after, size+1)
	if err != nil {
		return nil, "", err
	}
	if len(tickets) <= size {
		return tickets, "", nil
	}
	tickets = tickets[:size]
	last := tickets[size-1]
	return tickets, encodePageToken(pageToken{
		Version: pageTokenVersion, CreatedAt: last.CreatedAt.UnixMicro(), ID: last.ID, Search: search,
	}), nil
}

// normalizeFilter orders the set-like fields so that equivalent searches share page tokens.
func normalizeFilter(f TicketFilter) TicketFilter {
	f.Statuses = slices.Clone(f.Statuses)
	slices.Sort(f.Statuses)
	f.Statuses = slices.Compact(f.Statuses)
	f.Tags = slices.Clone(f.Tags)
	slices.Sort(f.Tags)
	f.Tags = slices.Compact(f.Tags)
	if !f.CreatedAfter.IsZero() {
		f.CreatedAfter = f.CreatedAfter.UTC()
	}
	return f
}

func searchDigest(tenant string, f TicketFilter) string {
	// Strings and a time: encoding cannot fail.
	b, _ := json.Marshal(struct {
		Tenant string       `json:"tenant"`
		Filter TicketFilter `json:"filter"`
	}{tenant, f})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

func encodePageToken(t pageToken) string {
	b, _ := json.Marshal(t) // ints and strings: encoding cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePageToken(s, search string) (TicketCursor, error) {
	bad := refuse(StageSchemaValidate, backend.CodeSchemaInvalidPageToken, codes.InvalidArgument,
		"page_token is not a token this search returned; start again without it")
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return TicketCursor{}, bad
	}
	var t pageToken
	if err := json.Unmarshal(b, &t); err != nil || t.Version != pageTokenVersion || t.ID == "" || t.Search != search {
		return TicketCursor{}, bad
	}
	return TicketCursor{CreatedAt: time.UnixMicro(t.CreatedAt).UTC(), ID: t.ID}, nil
}

func (d *desk) getTicket(ctx context.Context, p backend.Caller, id string) (Ticket, error) {
	t, err := d.store.Ticket(ctx, p.Tenant, id)
	if errors.Is(err, ErrNotFound) {
		return Ticket{}, notFound("ticket", id)
	}
	return t, err
}

// refundInput is a refund request. Its JSON encoding is the request digest of the
// idempotency key; the cardholder reference is left out of it because the digest is stored and
// a short reference could be recovered from it by brute force, so the same key with another
// card replays the first refund rather than being refused.
type refundInput struct {
	TicketID            string `json:"ticket_id"`
	Amount              Money  `json:"amount"`
	Reason              string `json:"reason"`
	CardholderReference string `json:"-"`
}

// issueRefund checks the ticket, has the gateway move the money and books it, in tx, which
// holds the ticket's lock throughout: two concurrent refunds of one ticket are checked one after
// the other, so together they never exceed what was paid.
func (d *desk) issueRefund(ctx context.Context, tx Tx, p backend.Caller, in refundInput) (Refund, error) {
	if in.Amount.Minor <= 0 || in.Amount.Currency == "" {
		return Refund{}, invalidInput("/amount", "a refund must be a positive amount with a currency")
	}
	key := IdempotencyKey{Tenant: p.Tenant, UserID: p.UserID, Command: cmdRefund, Key: p.IdempotencyKey}
	if key.Key != "" {
		prior, found, err := replay(ctx, tx, key, digestOf(in))
		if err != nil {
			return Refund{}, err
		}
		if found {
			return tx.Refund(ctx, p.Tenant, prior)
		}
	}
	t, err := tx.TicketForUpdate(ctx, p.Tenant, in.TicketID)
	if errors.Is(err, ErrNotFound) {
		return Refund{}, notFound("ticket", in.TicketID)
	}
	if err != nil {
		return Refund{}, err
	}
	if err := checkRefund(t, in.Amount); err != nil {
		return Refund{}, err
	}
	n, err := tx.NextID(ctx, p.Tenant, SeqRefund, refundFloor)
	if err != nil {
		return Refund{}, err
	}
	r := Refund{
		Tenant: p.Tenant, ID: fmt.Sprintf("RF-%d", n), TicketID: t.ID, Amount: in.Amount,
		Reason: in.Reason, Status: RefundAccepted, RequestedBy: p.UserID, AgentID: p.AgentID,
		InvocationID: p.InvocationID,
	}
	// The gateway is called last, once everything that could refuse has been checked and
	// while the ticket is locked, so a refusal never moves money. What remains is the commit
	// itself failing after the gateway moved money: the receipt commits with the booking, so
	// the executor would be told "not executed" while the fake moved money. A real gateway
	// would be given an idempotency reference (the invocation id) and reconciled.
	ref, err := d.gateway.Refund(ctx, GatewayRefund{Reference: p.Tenant + "/" + r.ID, Amount: in.Amount, CardholderReference: in.CardholderReference})
	if err != nil {
		if ctx.Err() != nil {
			return Refund{}, ctx.Err()
		}
		e := backend.Refuse(StageDispatch, CodeGatewayUnavailable, "the payment gateway did not accept the refund; nothing was refunded").WithCause(err)
		e.Status, e.Retriable, e.Remedy = codes.Unavailable, true, "retry later"
		return Refund{}, e
	}
	r.GatewayRef, r.IssuedAt = ref, d.clock()
	t.Refunded = Money{Currency: t.Paid.Currency, Minor: t.Refunded.Minor + in.Amount.Minor}
	if err := tx.UpdateTicket(ctx, t); err != nil {
		return Refund{}, err
	}
	if err := tx.InsertRefund(ctx, r); err != nil {
		return Refund{}, err
	}
	if key.Key != "" {
		if err := tx.CompleteKey(ctx, key, r.ID); err != nil {
			return Refund{}, err
		}
	}
	return r, nil
}

// checkRefund applies the refund rules to a locked ticket.
func checkRefund(t Ticket, amount Money) error {
	if t.Status == TicketClosed {
		return refuse(StageStateCheck, CodeTicketClosed, codes.FailedPrecondition,
			"ticket "+t.ID+" is closed; refunds are only issued on open or pending tickets")
	}
	if t.Paid.IsZero() {
		return refuse(StagePreInvariant, CodeRefundExceedsPaid, codes.FailedPrecondition,
			"nothing was paid on ticket "+t.ID)
	}
	if amount.Currency != t.Paid.Currency {
		return refuse(StagePreInvariant, CodeRefundCurrencyMismatch, codes.FailedPrecondition,
			"ticket "+t.ID+" was paid in "+t.Paid.Currency+", not "+amount.Currency)
	}
	if left := t.Refundable(); amount.Minor > left.Minor {
		return refuse(StagePreInvariant, CodeRefundExceedsPaid, codes.FailedPrecondition,
			fmt.Sprintf("at most %s of ticket %s can still be refunded", left, t.ID))
	}
	return nil
}

// replay claims an idempotency key. found reports that a committed request holds it already,
// with the same digest, and created the record with id prior; the same key with a different
// request is refused.
func replay(ctx context.Context, tx Tx, key IdempotencyKey, digest string) (prior string, found bool, err error) {
	c, err := tx.ClaimKey(ctx, key, digest)
	if err != nil || c.New {
		return "", false, err
	}
	if c.Digest != digest {
		return "", false, refuse(StageIdempotencyCheck, backend.CodeIdempotencyKeyReused, codes.FailedPrecondition,
			"this idempotency key was used with a different request; use a new key")
	}
	return c.ResultID, true, nil
}

// digestOf identifies a request by the SHA-256 of its JSON encoding, which is deterministic
// for the input structs here (struct fields in order, map keys sorted).
func digestOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("helpdesk: digest of %T: %v", v, err)) // plain structs cannot fail
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
