package memory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

type key struct{ tenant, id string }

type seqKey struct {
	tenant string
	seq    helpdesk.Sequence
}

// Store is an in-memory helpdesk.Store, safe for concurrent use. The zero value is not
// usable; call New.
type Store struct {
	mu       sync.RWMutex
	tickets  map[key]helpdesk.Ticket
	refunds  map[key]helpdesk.Refund
	reports  map[key]helpdesk.ExpenseReport
	erasures map[key]helpdesk.Erasure
	seqs     map[seqKey]int64
	claims   map[helpdesk.IdempotencyKey]helpdesk.Claim
	receipts *receipt.Memory
}

var _ helpdesk.Store = (*Store)(nil)

// New returns an empty Store.
func New() *Store {
	return &Store{
		tickets:  map[key]helpdesk.Ticket{},
		refunds:  map[key]helpdesk.Refund{},
		reports:  map[key]helpdesk.ExpenseReport{},
		erasures: map[key]helpdesk.Erasure{},
		seqs:     map[seqKey]int64{},
		claims:   map[helpdesk.IdempotencyKey]helpdesk.Claim{},
		receipts: receipt.NewMemory(),
	}
}

// errTxDone reports a Tx used after its InTx returned.
var errTxDone = errors.New("memory: transaction already ended")

// InTx implements helpdesk.Store. It holds the store's lock while fn runs, so transactions
// run one at a time.
func (s *Store) InTx(ctx context.Context, fn func(tx helpdesk.Tx) error) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := &tx{s: s}
	committed := false
	defer func() {
		t.done = true
		if !committed {
			// Undo in reverse order; a panic in fn is re-raised after the rollback.
			for i := len(t.undo) - 1; i >= 0; i-- {
				t.undo[i]()
			}
		}
	}()
	if err := fn(t); err != nil {
		return err
	}
	committed = true
	return nil
}

// Ticket implements helpdesk.Reader.
func (s *Store) Ticket(ctx context.Context, tenant, id string) (helpdesk.Ticket, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ticket(ctx, tenant, id)
}

// SearchTickets implements helpdesk.Reader.
func (s *Store) SearchTickets(ctx context.Context, tenant string, f helpdesk.TicketFilter, after *helpdesk.TicketCursor, limit int) ([]helpdesk.Ticket, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.searchTickets(ctx, tenant, f, after, limit)
}

// Refund implements helpdesk.Reader.
func (s *Store) Refund(ctx context.Context, tenant, id string) (helpdesk.Refund, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.refund(ctx, tenant, id)
}

// Refunds implements helpdesk.Reader.
func (s *Store) Refunds(ctx context.Context, tenant, ticketID string) ([]helpdesk.Refund, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.refundsOf(ctx, tenant, ticketID)
}

// Report implements helpdesk.Reader.
func (s *Store) Report(ctx context.Context, tenant, id string) (helpdesk.ExpenseReport, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.report(ctx, tenant, id)
}

// Erasure implements helpdesk.Reader.
func (s *Store) Erasure(ctx context.Context, tenant, id string) (helpdesk.Erasure, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.erasure(ctx, tenant, id)
}

// The lower-case readers expect s.mu to be held.

func (s *Store) ticket(ctx context.Context, tenant, id string) (helpdesk.Ticket, error) {
	if err := ctx.Err(); err != nil {
		return helpdesk.Ticket{}, err
	}
	t, ok := s.tickets[key{tenant, id}]
	if !ok {
		return helpdesk.Ticket{}, fmt.Errorf("ticket %s: %w", id, helpdesk.ErrNotFound)
	}
	return t.Clone(), nil
}

func (s *Store) searchTickets(ctx context.Context, tenant string, f helpdesk.TicketFilter, after *helpdesk.TicketCursor, limit int) ([]helpdesk.Ticket, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []helpdesk.Ticket
	for k, t := range s.tickets {
		if k.tenant == tenant && matches(t, f) && (after == nil || before(t, *after)) {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b helpdesk.Ticket) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	for i := range out {
		out[i] = out[i].Clone()
	}
	return out, nil
}

// before reports whether t comes after the cursor in search order (newest first).
func before(t helpdesk.Ticket, c helpdesk.TicketCursor) bool {
	if c := t.CreatedAt.Compare(c.CreatedAt); c != 0 {
		return c < 0
	}
	return t.ID < c.ID
}

func matches(t helpdesk.Ticket, f helpdesk.TicketFilter) bool {
	if f.Query != "" && !strings.Contains(strings.ToLower(t.Subject), strings.ToLower(f.Query)) {
		return false
	}
	if len(f.Statuses) > 0 && !slices.Contains(f.Statuses, t.Status) {
		return false
	}
	if f.CustomerEmail != "" && !strings.EqualFold(f.CustomerEmail, t.CustomerEmail) {
		return false
	}
	for _, tag := range f.Tags {
		if !slices.Contains(t.Tags, tag) {
			return false
		}
	}
	return f.CreatedAfter.IsZero() || !t.CreatedAt.Before(f.CreatedAfter)
}

func (s *Store) refund(ctx context.Context, tenant, id string) (helpdesk.Refund, error) {
	if err := ctx.Err(); err != nil {
		return helpdesk.Refund{}, err
	}
	r, ok := s.refunds[key{tenant, id}]
	if !ok {
		return helpdesk.Refund{}, fmt.Errorf("refund %s: %w", id, helpdesk.ErrNotFound)
	}
	return r, nil
}

func (s *Store) refundsOf(ctx context.Context, tenant, ticketID string) ([]helpdesk.Refund, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []helpdesk.Refund
	for k, r := range s.refunds {
		if k.tenant == tenant && r.TicketID == ticketID {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b helpdesk.Refund) int {
		return cmp.Or(a.IssuedAt.Compare(b.IssuedAt), strings.Compare(a.ID, b.ID))
	})
	return out, nil
}

func (s *Store) report(ctx context.Context, tenant, id string) (helpdesk.ExpenseReport, error) {
	if err := ctx.Err(); err != nil {
		return helpdesk.ExpenseReport{}, err
	}
	r, ok := s.reports[key{tenant, id}]
	if !ok {
		return helpdesk.ExpenseReport{}, fmt.Errorf("expense report %s: %w", id, helpdesk.ErrNotFound)
	}
	return r.Clone(), nil
}

func (s *Store) erasure(ctx context.Context, tenant, id string) (helpdesk.Erasure, error) {
	if err := ctx.Err(); err != nil {
		return helpdesk.Erasure{}, err
	}
	e, ok := s.erasures[key{tenant, id}]
	if !ok {
		return helpdesk.Erasure{}, fmt.Errorf("erasure %s: %w", id, helpdesk.ErrNotFound)
	}
	return e, nil
}

// tx is a transaction: it runs with s.mu held exclusively and records how to undo each write.
type tx struct {
	s    *Store
	undo []func()
	done bool
}

var _ helpdesk.Tx = (*tx)(nil)

func (t *tx) check(ctx context.Context) error {
	if t.done {
		return errTxDone
	}
	return ctx.Err()
}

// set writes m[k] = v and records how to restore the previous value.
func set[K comparable, V any](t *tx, m map[K]V, k K, v V) {
	old, had := m[k]
	t.undo = append(t.undo, func() {
		if had {
			m[k] = old
		} else {
			delete(m, k)
		}
	})
	m[k] = v
}

func (t *tx) Ticket(ctx context.Context, tenant, id string) (helpdesk.Ticket, error) {
	if err := t.check(ctx); err != nil {
		return helpdesk.Ticket{}, err
	}
	return t.s.ticket(ctx, tenant, id)
}

func (t *tx) SearchTickets(ctx context.Context, tenant string, f helpdesk.TicketFilter, after *helpdesk.TicketCursor, limit int) ([]helpdesk.Ticket, error) {
	if err := t.check(ctx); err != nil {
		return nil, err
	}
	return t.s.searchTickets(ctx, tenant, f, after, limit)
}

func (t *tx) Refund(ctx context.Context, tenant, id string) (helpdesk.Refund, error) {
	if err := t.check(ctx); err != nil {
		return helpdesk.Refund{}, err
	}
	return t.s.refund(ctx, tenant, id)
}

func (t *tx) Refunds(ctx context.Context, tenant, ticketID string) ([]helpdesk.Refund, error) {
	if err := t.check(ctx); err != nil {
		return nil, err
	}
	return t.s.refundsOf(ctx, tenant, ticketID)
}

func (t *tx) Report(ctx context.Context, tenant, id string) (helpdesk.ExpenseReport, error) {
	if err := t.check(ctx); err != nil {
		return helpdesk.ExpenseReport{}, err
	}
	return t.s.report(ctx, tenant, id)
}

func (t *tx) Erasure(ctx context.Context, tenant, id string) (helpdesk.Erasure, error) {
	if err := t.check(ctx); err != nil {
		return helpdesk.Erasure{}, err
	}
	return t.s.erasure(ctx, tenant, id)
}

// TicketForUpdate needs no lock of its own: the transaction holds the store's.
func (t *tx) TicketForUpdate(ctx context.Context, tenant, id string) (helpdesk.Ticket, error) {
	return t.Ticket(ctx, tenant, id)
}

func (t *tx) InsertTicket(ctx context.Context, tk helpdesk.Ticket) error {
	if err := t.check(ctx); err != nil {
		return err
	}
	if err := tk.Validate(); err != nil {
		return err
	}
	k := key{tk.Tenant, tk.ID}
	if _, ok := t.s.tickets[k]; ok {
		return fmt.Errorf("ticket %s: %w", tk.ID, helpdesk.ErrConflict)
	}
	set(t, t.s.tickets, k, tk.Normalize())
	return nil
}

func (t *tx) UpdateTicket(ctx context.Context, tk helpdesk.Ticket) error {
	if err := t.check(ctx); err != nil {
		return err
	}
	if err := tk.Validate(); err != nil {
		return err
	}
	k := key{tk.Tenant, tk.ID}
	old, ok := t.s.tickets[k]
	if !ok {
		return fmt.Errorf("ticket %s: %w", tk.ID, helpdesk.ErrNotFound)
	}
	tk.CreatedAt = old.CreatedAt
	set(t, t.s.tickets, k, tk.Normalize())
	return nil
}

func (t *tx) InsertRefund(ctx context.Context, r helpdesk.Refund) error {
	if err := t.check(ctx); err != nil {
		return err
	}
	if err := r.Validate(); err != nil {
		return err
	}
	if _, ok := t.s.tickets[key{r.Tenant, r.TicketID}]; !ok {
		return fmt.Errorf("ticket %s: %w", r.TicketID, helpdesk.ErrNotFound)
	}
	k := key{r.Tenant, r.ID}
	if _, ok := t.s.refunds[k]; ok {
		return fmt.Errorf("refund %s: %w", r.ID, helpdesk.ErrConflict)
	}
	set(t, t.s.refunds, k, r.Normalize())
	return nil
}

func (t *tx) ReportForUpdate(ctx context.Context, tenant, id string) (helpdesk.ExpenseReport, error) {
	return t.Report(ctx, tenant, id)
}

func (t *tx) InsertReport(ctx context.Context, r helpdesk.ExpenseReport) error {
	if err := t.check(ctx); err != nil {
		return err
	}
	if err := r.Validate(); err != nil {
		return err
	}
	k := key{r.Tenant, r.ID}
	if _, ok := t.s.reports[k]; ok {
		return fmt.Errorf("expense report %s: %w", r.ID, helpdesk.ErrConflict)
	}
	set(t, t.s.reports, k, r.Normalize())
	return nil
}

func (t *tx) UpdateReport(ctx context.Context, r helpdesk.ExpenseReport) error {
	if err := t.check(ctx); err != nil {
		return err
	}
	if err := r.Validate(); err != nil {
		return err
	}
	k := key{r.Tenant, r.ID}
	old, ok := t.s.reports[k]
	if !ok {
		return fmt.Errorf("expense report %s: %w", r.ID, helpdesk.ErrNotFound)
	}
	r.Owner, r.OwnerOrg, r.CreatedAt = old.Owner, old.OwnerOrg, old.CreatedAt
	set(t, t.s.reports, k, r.Normalize())
	return nil
}

func (t *tx) EraseCustomer(ctx context.Context, tenant, email, tombstone string) (int, error) {
	if err := t.check(ctx); err != nil {
		return 0, err
	}
	if email == "" || tombstone == "" {
		return 0, fmt.Errorf("%w: erasing a customer needs an email and a tombstone", helpdesk.ErrInvalid)
	}
	n := 0
	for k, tk := range t.s.tickets {
		if k.tenant == tenant && strings.EqualFold(tk.CustomerEmail, email) {
			tk.CustomerEmail = tombstone
			set(t, t.s.tickets, k, tk)
			n++
		}
	}
	return n, nil
}

func (t *tx) InsertErasure(ctx context.Context, e helpdesk.Erasure) error {
	if err := t.check(ctx); err != nil {
		return err
	}
	if err := e.Validate(); err != nil {
		return err
	}
	k := key{e.Tenant, e.ID}
	if _, ok := t.s.erasures[k]; ok {
		return fmt.Errorf("erasure %s: %w", e.ID, helpdesk.ErrConflict)
	}
	set(t, t.s.erasures, k, e.Normalize())
	return nil
}

func (t *tx) NextID(ctx context.Context, tenant string, seq helpdesk.Sequence, floor int64) (int64, error) {
	if err := t.check(ctx); err != nil {
		return 0, err
	}
	k := seqKey{tenant, seq}
	n := max(t.s.seqs[k], floor) + 1
	set(t, t.s.seqs, k, n)
	return n, nil
}

// ClaimKey never waits: no other transaction can be running.
func (t *tx) ClaimKey(ctx context.Context, k helpdesk.IdempotencyKey, digest string) (helpdesk.Claim, error) {
	if err := t.check(ctx); err != nil {
		return helpdesk.Claim{}, err
	}
	if c, ok := t.s.claims[k]; ok {
		return c, nil
	}
	set(t, t.s.claims, k, helpdesk.Claim{Digest: digest})
	return helpdesk.Claim{New: true, Digest: digest}, nil
}

func (t *tx) CompleteKey(ctx context.Context, k helpdesk.IdempotencyKey, resultID string) error {
	if err := t.check(ctx); err != nil {
		return err
	}
	c, ok := t.s.claims[k]
	if !ok {
		return fmt.Errorf("idempotency key not claimed: %w", helpdesk.ErrNotFound)
	}
	c.ResultID = resultID
	set(t, t.s.claims, k, c)
	return nil
}

// OnRollback implements receipt.MemoryTx: the receipt store's writes are undone with the
// transaction's own.
func (t *tx) OnRollback(undo func()) { t.undo = append(t.undo, undo) }

// Receipt needs no lock of its own: the transaction holds the store's.
func (t *tx) Receipt(ctx context.Context, invocationID string) (receipt.Receipt, bool, error) {
	if err := t.check(ctx); err != nil {
		return receipt.Receipt{}, false, err
	}
	return t.s.receipts.Get(ctx, t, invocationID)
}

func (t *tx) RecordReceipt(ctx context.Context, r receipt.Receipt) error {
	if err := t.check(ctx); err != nil {
		return err
	}
	return t.s.receipts.Record(ctx, t, r)
}
