package helpdesk

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// Money is an amount in minor units (cents for EUR) of one ISO 4217 currency. The zero value
// means "no amount".
type Money struct {
	// Currency is the ISO 4217 code, e.g. "EUR".
	Currency string `json:"currency"`
	// Minor is the amount in minor units.
	Minor int64 `json:"minor"`
}

// IsZero reports whether m is the zero value.
func (m Money) IsZero() bool { return m == Money{} }

// String renders m for messages, e.g. "49.90 EUR". It assumes two decimals, which holds for the
// currencies of the sample domain.
func (m Money) String() string {
	sign := ""
	minor := m.Minor
	if minor < 0 {
		sign, minor = "-", -minor
	}
	return fmt.Sprintf("%s%d.%02d %s", sign, minor/100, minor%100, m.Currency)
}

// TicketStatus is where a ticket is in its life.
type TicketStatus string

// Ticket statuses.
const (
	// TicketOpen waits for support.
	TicketOpen TicketStatus = "open"
	// TicketPending waits for the customer.
	TicketPending TicketStatus = "pending"
	// TicketClosed is done; nothing more is refunded on it.
	TicketClosed TicketStatus = "closed"
)

// Valid reports whether s is one of the defined statuses.
func (s TicketStatus) Valid() bool {
	return s == TicketOpen || s == TicketPending || s == TicketClosed
}

// Ticket is a customer support case of one tenant.
type Ticket struct {
	// Tenant owns the ticket; (Tenant, ID) is the key, so two tenants may use the same ID.
	Tenant string
	// ID is e.g. "T-1001".
	ID string
	// Org is the organisation inside the tenant that handles the ticket.
	Org string
	// Subject is the one-line summary written by the customer.
	Subject string
	// Status is the current status.
	Status TicketStatus
	// CustomerEmail is the customer's address.
	CustomerEmail string
	// Paid is what the customer paid; zero when nothing was paid.
	Paid Money
	// Refunded is what was refunded so far, in Paid's currency; zero when nothing was.
	Refunded Money
	// Tags are free-form labels.
	Tags []string
	// CreatedAt is when the ticket was opened.
	CreatedAt time.Time
}

// Refundable returns how much of Paid has not been refunded yet.
func (t Ticket) Refundable() Money {
	return Money{Currency: t.Paid.Currency, Minor: t.Paid.Minor - t.Refunded.Minor}
}

// Clone returns a deep copy of t; empty tags become nil.
func (t Ticket) Clone() Ticket {
	t.Tags = cloneSlice(t.Tags)
	return t
}

// Normalize returns a deep copy of t as a store keeps it: times in UTC at microsecond
// precision (what Postgres stores), no empty slices, and Refunded zero when nothing was
// refunded. Stores call it so that every implementation returns the same values.
func (t Ticket) Normalize() Ticket {
	t = t.Clone()
	t.CreatedAt = normTime(t.CreatedAt)
	if t.Refunded.Minor == 0 {
		t.Refunded = Money{}
	}
	return t
}

// Validate checks what a store requires of a ticket; errors match ErrInvalid.
func (t Ticket) Validate() error {
	switch {
	case t.Tenant == "" || t.ID == "":
		return invalidRecord("ticket needs a tenant and an id")
	case !t.Status.Valid():
		return invalidRecord("ticket " + t.ID + " has an unknown status")
	case t.Paid.Minor < 0 || (t.Paid.Minor == 0) != (t.Paid.Currency == ""):
		return invalidRecord("ticket " + t.ID + " has a malformed paid amount")
	case t.Refunded.Minor < 0 || t.Refunded.Minor > t.Paid.Minor:
		return invalidRecord("ticket " + t.ID + " has refunded more than was paid")
	case t.Refunded.Minor > 0 && t.Refunded.Currency != t.Paid.Currency:
		return invalidRecord("ticket " + t.ID + " has refunds in another currency than was paid")
	case t.CreatedAt.IsZero():
		return invalidRecord("ticket " + t.ID + " has no creation time")
	}
	return nil
}

// RefundStatus is where a refund is at the payment gateway.
type RefundStatus string

// Refund statuses.
const (
	// RefundAccepted means the gateway took the refund; money is on its way.
	RefundAccepted RefundStatus = "accepted"
	// RefundSettled means the customer's bank has the money.
	RefundSettled RefundStatus = "settled"
)

// Refund is money sent back to a ticket's customer. The cardholder reference it was sent with
// is sensitive and never stored.
type Refund struct {
	// Tenant owns the refund.
	Tenant string
	// ID is e.g. "RF-3001".
	ID string
	// TicketID is the ticket refunded.
	TicketID string
	// Amount is what was refunded.
	Amount Money
	// Reason is the text the customer reads.
	Reason string
	// Status is where the refund is at the gateway.
	Status RefundStatus
	// GatewayRef is the gateway's id of the refund.
	GatewayRef string
	// RequestedBy is the user the refund was made for; AgentID the agent that asked, if any.
	RequestedBy string
	AgentID     string
	// InvocationID is the Mandate invocation that made the refund.
	InvocationID string
	// IssuedAt is when the gateway accepted the refund.
	IssuedAt time.Time
}

// Normalize returns r as a store keeps it (see Ticket.Normalize).
func (r Refund) Normalize() Refund {
	r.IssuedAt = normTime(r.IssuedAt)
	return r
}

// Validate checks what a store requires of a refund; errors match ErrInvalid.
func (r Refund) Validate() error {
	switch {
	case r.Tenant == "" || r.ID == "" || r.TicketID == "":
		return invalidRecord("refund needs a tenant, an id and a ticket")
	case r.Amount.Minor <= 0 || r.Amount.Currency == "":
		return invalidRecord("refund " + r.ID + " needs a positive amount with a currency")
	case r.Status != RefundAccepted && r.Status != RefundSettled:
		return invalidRecord("refund " + r.ID + " has an unknown status")
	case r.IssuedAt.IsZero():
		return invalidRecord("refund " + r.ID + " has no issue time")
	}
	return nil
}

// Erasure is the receipt of a customer erasure: what was erased, for whom and by which
// invocation. It never holds the erased data: the customer's email is gone from the tenant's
// records once the erasure commits, and the receipt does not keep a copy.
type Erasure struct {
	// Tenant owns the erasure.
	Tenant string
	// ID is e.g. "CE-4001".
	ID string
	// Reason is why the customer was erased, e.g. the reference of the deletion request.
	Reason string
	// TicketsErased is how many tickets had the customer's email replaced by the tombstone.
	TicketsErased int
	// RequestedBy is the user the erasure was made for; AgentID the agent that asked, if any.
	RequestedBy string
	AgentID     string
	// InvocationID is the Mandate invocation that made the erasure.
	InvocationID string
	// ErasedAt is when the erasure was made.
	ErasedAt time.Time
}

// Tombstone is what replaces the erased customer's email on their records: it names the
// erasure, so the records of one customer stay recognisable as one, and carries nothing
// derived from the email (a hash of it could be reversed by guessing addresses).
func (e Erasure) Tombstone() string { return "erased:" + e.ID }

// Normalize returns e as a store keeps it (see Ticket.Normalize).
func (e Erasure) Normalize() Erasure {
	e.ErasedAt = normTime(e.ErasedAt)
	return e
}

// Validate checks what a store requires of an erasure; errors match ErrInvalid.
func (e Erasure) Validate() error {
	switch {
	case e.Tenant == "" || e.ID == "":
		return invalidRecord("erasure needs a tenant and an id")
	case e.TicketsErased < 0:
		return invalidRecord("erasure " + e.ID + " has a negative count")
	case e.ErasedAt.IsZero():
		return invalidRecord("erasure " + e.ID + " has no erasure time")
	}
	return nil
}

// Category classifies an expense line.
type Category string

// Expense categories.
const (
	// CategoryTravel is trains, flights and taxis.
	CategoryTravel Category = "travel"
	// CategoryLodging is hotels.
	CategoryLodging Category = "lodging"
	// CategoryMeals is meals with customers or while travelling.
	CategoryMeals Category = "meals"
	// CategoryOther is anything else.
	CategoryOther Category = "other"
)

// Valid reports whether c is one of the defined categories.
func (c Category) Valid() bool {
	return c == CategoryTravel || c == CategoryLodging || c == CategoryMeals || c == CategoryOther
}

// Line is one expense of a report.
type Line struct {
	// Description says what was bought.
	Description string `json:"description"`
	// Amount is what it cost.
	Amount Money `json:"amount"`
	// Category classifies it.
	Category Category `json:"category"`
	// DistanceKm is set for mileage claims.
	DistanceKm *float64 `json:"distance_km,omitempty"`
}

// ReportState is where an expense report is in its workflow: draft → submitted → approved; a
// submitted report can be recalled to draft until it is approved.
type ReportState string

// Expense report states.
const (
	// ReportDraft is being written by its owner.
	ReportDraft ReportState = "draft"
	// ReportSubmitted waits for approval.
	ReportSubmitted ReportState = "submitted"
	// ReportApproved is approved for reimbursement; final.
	ReportApproved ReportState = "approved"
)

// Valid reports whether s is one of the defined states.
func (s ReportState) Valid() bool {
	return s == ReportDraft || s == ReportSubmitted || s == ReportApproved
}

// ExpenseReport is a set of expenses a user asks to be reimbursed.
type ExpenseReport struct {
	// Tenant owns the report.
	Tenant string
	// ID is e.g. "ER-2001".
	ID string
	// Owner is the user the report belongs to; OwnerOrg is their organisation when the report
	// was created, which decides who may approve it.
	Owner    string
	OwnerOrg string
	// Title is a short title.
	Title string
	// State is where the report is in its workflow.
	State ReportState
	// Lines are the expenses, all in one currency.
	Lines []Line
	// Labels are free-form key/value labels.
	Labels map[string]string
	// PayrollID or BankAccountAlias (exactly one) says how the owner is reimbursed.
	PayrollID        string
	BankAccountAlias string
	// SubmittedBy, SubmittedAt and SubmitNote describe the last submission; a recall leaves
	// them in place so the history stays readable, and the next submission overwrites them.
	SubmittedBy string
	SubmittedAt time.Time
	SubmitNote  string
	// RecallReason is why the report was last recalled.
	RecallReason string
	// ApprovedBy, ApprovedAt and ApprovalComment are set by the approval.
	ApprovedBy      string
	ApprovedAt      time.Time
	ApprovalComment string
	// CreatedAt is when the report was created.
	CreatedAt time.Time
}

// Clone returns a deep copy of r; empty lines and labels become nil.
func (r ExpenseReport) Clone() ExpenseReport {
	r.Lines = cloneSlice(r.Lines)
	for i := range r.Lines {
		if d := r.Lines[i].DistanceKm; d != nil {
			v := *d
			r.Lines[i].DistanceKm = &v
		}
	}
	if len(r.Labels) == 0 {
		r.Labels = nil
	} else {
		r.Labels = maps.Clone(r.Labels)
	}
	return r
}

// Normalize returns a deep copy of r as a store keeps it (see Ticket.Normalize).
func (r ExpenseReport) Normalize() ExpenseReport {
	r = r.Clone()
	r.CreatedAt = normTime(r.CreatedAt)
	r.SubmittedAt = normTime(r.SubmittedAt)
	r.ApprovedAt = normTime(r.ApprovedAt)
	return r
}

// Validate checks what a store requires of a report; errors match ErrInvalid.
func (r ExpenseReport) Validate() error {
	switch {
	case r.Tenant == "" || r.ID == "" || r.Owner == "":
		return invalidRecord("expense report needs a tenant, an id and an owner")
	case !r.State.Valid():
		return invalidRecord("expense report " + r.ID + " has an unknown state")
	case r.CreatedAt.IsZero():
		return invalidRecord("expense report " + r.ID + " has no creation time")
	}
	if _, err := r.Total(); err != nil {
		return invalidRecord("expense report " + r.ID + ": " + err.Error())
	}
	return nil
}

// Errors of [Total].
var (
	// ErrMixedCurrencies reports lines in more than one currency.
	ErrMixedCurrencies = errors.New("helpdesk: expense lines use more than one currency")
	// ErrTotalOverflow reports a total that does not fit in int64 minor units.
	ErrTotalOverflow = errors.New("helpdesk: expense total overflows")
)

// Total returns the sum of lines; every line must be in the same currency. The total of no
// lines is zero Money.
func Total(lines []Line) (Money, error) {
	var t Money
	for i, l := range lines {
		if i == 0 {
			t.Currency = l.Amount.Currency
		} else if l.Amount.Currency != t.Currency {
			return Money{}, ErrMixedCurrencies
		}
		if l.Amount.Minor > math.MaxInt64-t.Minor {
			return Money{}, ErrTotalOverflow
		}
		t.Minor += l.Amount.Minor
	}
	return t, nil
}

// Total returns the sum of the report's lines.
func (r ExpenseReport) Total() (Money, error) { return Total(r.Lines) }

// ErrInvalid reports a record that a store refuses to keep because it breaks a rule of the
// domain; it means a bug in the caller, never bad user input, which is refused earlier.
var ErrInvalid = errors.New("helpdesk: invalid record")

func invalidRecord(msg string) error { return fmt.Errorf("%w: %s", ErrInvalid, msg) }

func cloneSlice[S ~[]E, E any](s S) S {
	if len(s) == 0 {
		return nil
	}
	return slices.Clone(s)
}

func normTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC().Truncate(time.Microsecond)
}
