package postgres

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations creates the helpdesk schema: the schema's name and its numbered SQL files
// (NNNN_description.sql), applied in order before New. Its shape is that of Mandate's own
// migration sets, so that `mandate migrate --sample` applies it with theirs; a backend of its
// own applies such files with whatever migration tool it uses.
var Migrations = struct {
	// Service names the Postgres schema.
	Service string
	// FS holds the migration files at its root.
	FS fs.FS
}{Service: "helpdesk", FS: mustSub(migrationFiles, "migrations")}

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // the directory is embedded above; this cannot fail
	}
	return sub
}

// Store is the PostgreSQL helpdesk.Store. It does not own the pool.
type Store struct {
	pool *pgxpool.Pool
}

var _ helpdesk.Store = (*Store)(nil)

// New returns a Store on pool, whose database must have [Migrations] applied.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// querier is what both the pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// InTx implements helpdesk.Store. The transaction is never retried: fn may have called the
// payment gateway.
func (s *Store) InTx(ctx context.Context, fn func(tx helpdesk.Tx) error) error {
	return inTx(ctx, s.pool, func(t pgx.Tx) error {
		return fn(&tx{reader: reader{t}, pgtx: t})
	})
}

// Reads outside a transaction run on the pool.

// Ticket implements helpdesk.Reader.
func (s *Store) Ticket(ctx context.Context, tenant, id string) (helpdesk.Ticket, error) {
	return reader{s.pool}.Ticket(ctx, tenant, id)
}

// SearchTickets implements helpdesk.Reader.
func (s *Store) SearchTickets(ctx context.Context, tenant string, f helpdesk.TicketFilter, after *helpdesk.TicketCursor, limit int) ([]helpdesk.Ticket, error) {
	return reader{s.pool}.SearchTickets(ctx, tenant, f, after, limit)
}

// Refund implements helpdesk.Reader.
func (s *Store) Refund(ctx context.Context, tenant, id string) (helpdesk.Refund, error) {
	return reader{s.pool}.Refund(ctx, tenant, id)
}

// Refunds implements helpdesk.Reader.
func (s *Store) Refunds(ctx context.Context, tenant, ticketID string) ([]helpdesk.Refund, error) {
	return reader{s.pool}.Refunds(ctx, tenant, ticketID)
}

// Report implements helpdesk.Reader.
func (s *Store) Report(ctx context.Context, tenant, id string) (helpdesk.ExpenseReport, error) {
	return reader{s.pool}.Report(ctx, tenant, id)
}

// Erasure implements helpdesk.Reader.
func (s *Store) Erasure(ctx context.Context, tenant, id string) (helpdesk.Erasure, error) {
	return reader{s.pool}.Erasure(ctx, tenant, id)
}

// reader implements helpdesk.Reader on a pool or a transaction.
type reader struct{ q querier }

const ticketColumns = `tenant, ticket_id, org, subject, status, customer_email,
	paid_currency, paid_minor, refunded_minor, tags, created_at`

func scanTicket(row pgx.Row) (helpdesk.Ticket, error) {
	var t helpdesk.Ticket
	var refunded int64
	err := row.Scan(&t.Tenant, &t.ID, &t.Org, &t.Subject, &t.Status, &t.CustomerEmail,
		&t.Paid.Currency, &t.Paid.Minor, &refunded, &t.Tags, &t.CreatedAt)
	if err != nil {
		return helpdesk.Ticket{}, err
	}
	if refunded > 0 {
		t.Refunded = helpdesk.Money{Currency: t.Paid.Currency, Minor: refunded}
	}
	return t.Normalize(), nil
}

func (r reader) ticket(ctx context.Context, tenant, id, lock string) (helpdesk.Ticket, error) {
	t, err := scanTicket(r.q.QueryRow(ctx,
		`SELECT `+ticketColumns+` FROM helpdesk.tickets WHERE tenant = $1 AND ticket_id = $2`+lock, tenant, id))
	return t, wrap("ticket "+id, err)
}

func (r reader) Ticket(ctx context.Context, tenant, id string) (helpdesk.Ticket, error) {
	return r.ticket(ctx, tenant, id, "")
}

// searchSQL applies every filter with a neutral value when unset, so one statement (and one
// prepared plan) serves every search.
const searchSQL = `SELECT ` + ticketColumns + ` FROM helpdesk.tickets
WHERE tenant = $1
  AND ($2::text = '' OR strpos(lower(subject), lower($2)) > 0)
  AND (cardinality($3::text[]) = 0 OR status = ANY($3))
  AND ($4::text = '' OR lower(customer_email) = lower($4))
  AND tags @> $5::text[]
  AND ($6::timestamptz IS NULL OR created_at >= $6)
  AND ($7::timestamptz IS NULL OR (created_at, ticket_id) < ($7, $8::text))
ORDER BY created_at DESC, ticket_id DESC
LIMIT $9`

func (r reader) SearchTickets(ctx context.Context, tenant string, f helpdesk.TicketFilter, after *helpdesk.TicketCursor, limit int) ([]helpdesk.Ticket, error) {
	statuses := make([]string, 0, len(f.Statuses))
	for _, st := range f.Statuses {
		statuses = append(statuses, string(st))
	}
	tags := append([]string{}, f.Tags...) // never NULL: tags @> NULL matches nothing
	var createdAfter, afterTime *time.Time
	var afterID string
	if !f.CreatedAfter.IsZero() {
		createdAfter = &f.CreatedAfter
	}
	if after != nil {
		afterTime, afterID = &after.CreatedAt, after.ID
	}
	var lim *int
	if limit > 0 {
		lim = &limit
	}
	rows, err := r.q.Query(ctx, searchSQL, tenant, f.Query, statuses, f.CustomerEmail, tags, createdAfter, afterTime, afterID, lim)
	if err != nil {
		return nil, wrap("search tickets", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (helpdesk.Ticket, error) { return scanTicket(row) })
	return out, wrap("search tickets", err)
}

const refundColumns = `tenant, refund_id, ticket_id, currency, amount_minor, reason, status,
	gateway_ref, requested_by, agent_id, invocation_id, issued_at`

func scanRefund(row pgx.Row) (helpdesk.Refund, error) {
	var r helpdesk.Refund
	err := row.Scan(&r.Tenant, &r.ID, &r.TicketID, &r.Amount.Currency, &r.Amount.Minor, &r.Reason, &r.Status,
		&r.GatewayRef, &r.RequestedBy, &r.AgentID, &r.InvocationID, &r.IssuedAt)
	return r.Normalize(), err
}

func (r reader) Refund(ctx context.Context, tenant, id string) (helpdesk.Refund, error) {
	ref, err := scanRefund(r.q.QueryRow(ctx,
		`SELECT `+refundColumns+` FROM helpdesk.refunds WHERE tenant = $1 AND refund_id = $2`, tenant, id))
	if err != nil {
		return helpdesk.Refund{}, wrap("refund "+id, err)
	}
	return ref, nil
}

func (r reader) Refunds(ctx context.Context, tenant, ticketID string) ([]helpdesk.Refund, error) {
	rows, err := r.q.Query(ctx, `SELECT `+refundColumns+` FROM helpdesk.refunds
		WHERE tenant = $1 AND ticket_id = $2 ORDER BY issued_at, refund_id`, tenant, ticketID)
	if err != nil {
		return nil, wrap("refunds of "+ticketID, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (helpdesk.Refund, error) { return scanRefund(row) })
	return out, wrap("refunds of "+ticketID, err)
}

const reportColumns = `tenant, report_id, owner, owner_org, title, state, lines, labels,
	payroll_id, bank_account_alias, submitted_by, submitted_at, submit_note, recall_reason,
	approved_by, approved_at, approval_comment, created_at`

func scanReport(row pgx.Row) (helpdesk.ExpenseReport, error) {
	var r helpdesk.ExpenseReport
	var lines, labels []byte
	var submittedAt, approvedAt *time.Time
	err := row.Scan(&r.Tenant, &r.ID, &r.Owner, &r.OwnerOrg, &r.Title, &r.State, &lines, &labels,
		&r.PayrollID, &r.BankAccountAlias, &r.SubmittedBy, &submittedAt, &r.SubmitNote, &r.RecallReason,
		&r.ApprovedBy, &approvedAt, &r.ApprovalComment, &r.CreatedAt)
	if err != nil {
		return helpdesk.ExpenseReport{}, err
	}
	if err := json.Unmarshal(lines, &r.Lines); err != nil {
		return helpdesk.ExpenseReport{}, fmt.Errorf("helpdesk: report %s: decoding lines: %w", r.ID, err)
	}
	if err := json.Unmarshal(labels, &r.Labels); err != nil {
		return helpdesk.ExpenseReport{}, fmt.Errorf("helpdesk: report %s: decoding labels: %w", r.ID, err)
	}
	if submittedAt != nil {
		r.SubmittedAt = *submittedAt
	}
	if approvedAt != nil {
		r.ApprovedAt = *approvedAt
	}
	return r.Normalize(), nil
}

func (r reader) report(ctx context.Context, tenant, id, lock string) (helpdesk.ExpenseReport, error) {
	rep, err := scanReport(r.q.QueryRow(ctx,
		`SELECT `+reportColumns+` FROM helpdesk.expense_reports WHERE tenant = $1 AND report_id = $2`+lock, tenant, id))
	return rep, wrap("expense report "+id, err)
}

func (r reader) Report(ctx context.Context, tenant, id string) (helpdesk.ExpenseReport, error) {
	return r.report(ctx, tenant, id, "")
}

const erasureColumns = `tenant, erasure_id, reason, tickets_erased, requested_by, agent_id,
	invocation_id, erased_at`

func (r reader) Erasure(ctx context.Context, tenant, id string) (helpdesk.Erasure, error) {
	var e helpdesk.Erasure
	err := r.q.QueryRow(ctx, `SELECT `+erasureColumns+` FROM helpdesk.erasures WHERE tenant = $1 AND erasure_id = $2`,
		tenant, id).Scan(&e.Tenant, &e.ID, &e.Reason, &e.TicketsErased, &e.RequestedBy, &e.AgentID, &e.InvocationID, &e.ErasedAt)
	if err != nil {
		return helpdesk.Erasure{}, wrap("erasure "+id, err)
	}
	return e.Normalize(), nil
}

// tx implements helpdesk.Tx on a pgx transaction.
type tx struct {
	reader
	pgtx pgx.Tx
}

// receipts keeps the effect receipts in helpdesk.receipts (migration 0003, receipt.SchemaSQL).
var receipts = receipt.NewPostgres("helpdesk")

var _ helpdesk.Tx = (*tx)(nil)

const forUpdate = ` FOR UPDATE`

func (t *tx) TicketForUpdate(ctx context.Context, tenant, id string) (helpdesk.Ticket, error) {
	return t.ticket(ctx, tenant, id, forUpdate)
}

func (t *tx) InsertTicket(ctx context.Context, tk helpdesk.Ticket) error {
	if err := tk.Validate(); err != nil {
		return err
	}
	tk = tk.Normalize()
	_, err := t.q.Exec(ctx, `INSERT INTO helpdesk.tickets (`+ticketColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		tk.Tenant, tk.ID, tk.Org, tk.Subject, string(tk.Status), tk.CustomerEmail,
		tk.Paid.Currency, tk.Paid.Minor, tk.Refunded.Minor, nonNil(tk.Tags), tk.CreatedAt)
	return wrap("insert ticket "+tk.ID, err)
}

func (t *tx) UpdateTicket(ctx context.Context, tk helpdesk.Ticket) error {
	if err := tk.Validate(); err != nil {
		return err
	}
	tk = tk.Normalize()
	tag, err := t.q.Exec(ctx, `UPDATE helpdesk.tickets SET org = $3, subject = $4, status = $5,
		customer_email = $6, paid_currency = $7, paid_minor = $8, refunded_minor = $9, tags = $10
		WHERE tenant = $1 AND ticket_id = $2`,
		tk.Tenant, tk.ID, tk.Org, tk.Subject, string(tk.Status), tk.CustomerEmail,
		tk.Paid.Currency, tk.Paid.Minor, tk.Refunded.Minor, nonNil(tk.Tags))
	if err != nil {
		return wrap("update ticket "+tk.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("ticket %s: %w", tk.ID, helpdesk.ErrNotFound)
	}
	return nil
}

func (t *tx) InsertRefund(ctx context.Context, r helpdesk.Refund) error {
	if err := r.Validate(); err != nil {
		return err
	}
	r = r.Normalize()
	_, err := t.q.Exec(ctx, `INSERT INTO helpdesk.refunds (`+refundColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		r.Tenant, r.ID, r.TicketID, r.Amount.Currency, r.Amount.Minor, r.Reason, string(r.Status),
		r.GatewayRef, r.RequestedBy, r.AgentID, r.InvocationID, r.IssuedAt)
	if isForeignKeyViolation(err) {
		return fmt.Errorf("ticket %s: %w", r.TicketID, helpdesk.ErrNotFound)
	}
	return wrap("insert refund "+r.ID, err)
}

func (t *tx) ReportForUpdate(ctx context.Context, tenant, id string) (helpdesk.ExpenseReport, error) {
	return t.report(ctx, tenant, id, forUpdate)
}

// reportArgs returns the report's lines and labels as JSON and its optional times as NULLs.
func reportArgs(r helpdesk.ExpenseReport) (lines, labels []byte, submittedAt, approvedAt *time.Time, err error) {
	if lines, err = json.Marshal(nonNil(r.Lines)); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("helpdesk: report %s: encoding lines: %w", r.ID, err)
	}
	if r.Labels == nil {
		r.Labels = map[string]string{}
	}
	if labels, err = json.Marshal(r.Labels); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("helpdesk: report %s: encoding labels: %w", r.ID, err)
	}
	if !r.SubmittedAt.IsZero() {
		submittedAt = &r.SubmittedAt
	}
	if !r.ApprovedAt.IsZero() {
		approvedAt = &r.ApprovedAt
	}
	return lines, labels, submittedAt, approvedAt, nil
}

func (t *tx) InsertReport(ctx context.Context, r helpdesk.ExpenseReport) error {
	if err := r.Validate(); err != nil {
		return err
	}
	r = r.Normalize()
	lines, labels, submittedAt, approvedAt, err := reportArgs(r)
	if err != nil {
		return err
	}
	_, err = t.q.Exec(ctx, `INSERT INTO helpdesk.expense_reports (`+reportColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)`,
		r.Tenant, r.ID, r.Owner, r.OwnerOrg, r.Title, string(r.State), lines, labels,
		r.PayrollID, r.BankAccountAlias, r.SubmittedBy, submittedAt, r.SubmitNote, r.RecallReason,
		r.ApprovedBy, approvedAt, r.ApprovalComment, r.CreatedAt)
	return wrap("insert expense report "+r.ID, err)
}

func (t *tx) UpdateReport(ctx context.Context, r helpdesk.ExpenseReport) error {
	if err := r.Validate(); err != nil {
		return err
	}
	r = r.Normalize()
	lines, labels, submittedAt, approvedAt, err := reportArgs(r)
	if err != nil {
		return err
	}
	tag, err := t.q.Exec(ctx, `UPDATE helpdesk.expense_reports SET title = $3, state = $4, lines = $5,
		labels = $6, payroll_id = $7, bank_account_alias = $8, submitted_by = $9, submitted_at = $10,
		submit_note = $11, recall_reason = $12, approved_by = $13, approved_at = $14, approval_comment = $15
		WHERE tenant = $1 AND report_id = $2`,
		r.Tenant, r.ID, r.Title, string(r.State), lines, labels, r.PayrollID, r.BankAccountAlias,
		r.SubmittedBy, submittedAt, r.SubmitNote, r.RecallReason, r.ApprovedBy, approvedAt, r.ApprovalComment)
	if err != nil {
		return wrap("update expense report "+r.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("expense report %s: %w", r.ID, helpdesk.ErrNotFound)
	}
	return nil
}

func (t *tx) EraseCustomer(ctx context.Context, tenant, email, tombstone string) (int, error) {
	if email == "" || tombstone == "" {
		return 0, fmt.Errorf("%w: erasing a customer needs an email and a tombstone", helpdesk.ErrInvalid)
	}
	tag, err := t.q.Exec(ctx, `UPDATE helpdesk.tickets SET customer_email = $3
		WHERE tenant = $1 AND lower(customer_email) = lower($2)`, tenant, email, tombstone)
	if err != nil {
		return 0, wrap("erase customer", err)
	}
	return int(tag.RowsAffected()), nil
}

func (t *tx) InsertErasure(ctx context.Context, e helpdesk.Erasure) error {
	if err := e.Validate(); err != nil {
		return err
	}
	e = e.Normalize()
	_, err := t.q.Exec(ctx, `INSERT INTO helpdesk.erasures (`+erasureColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		e.Tenant, e.ID, e.Reason, e.TicketsErased, e.RequestedBy, e.AgentID, e.InvocationID, e.ErasedAt)
	return wrap("insert erasure "+e.ID, err)
}

func (t *tx) NextID(ctx context.Context, tenant string, seq helpdesk.Sequence, floor int64) (int64, error) {
	var n int64
	err := t.q.QueryRow(ctx, `INSERT INTO helpdesk.sequences AS s (tenant, name, last) VALUES ($1, $2, $3::bigint + 1)
		ON CONFLICT (tenant, name) DO UPDATE SET last = GREATEST(s.last, $3::bigint) + 1
		RETURNING last`, tenant, string(seq), floor).Scan(&n)
	return n, wrap("next "+string(seq)+" id", err)
}

func (t *tx) ClaimKey(ctx context.Context, k helpdesk.IdempotencyKey, digest string) (helpdesk.Claim, error) {
	tag, err := t.q.Exec(ctx, `INSERT INTO helpdesk.idempotency_keys (tenant, user_id, command, key, digest)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`, k.Tenant, k.UserID, k.Command, k.Key, digest)
	if err != nil {
		return helpdesk.Claim{}, wrap("claim idempotency key", err)
	}
	if tag.RowsAffected() == 1 {
		return helpdesk.Claim{New: true, Digest: digest}, nil
	}
	// The row's transaction has committed (INSERT waited for it), and a READ COMMITTED
	// statement sees it.
	var c helpdesk.Claim
	err = t.q.QueryRow(ctx, `SELECT digest, result_id FROM helpdesk.idempotency_keys
		WHERE tenant = $1 AND user_id = $2 AND command = $3 AND key = $4`,
		k.Tenant, k.UserID, k.Command, k.Key).Scan(&c.Digest, &c.ResultID)
	return c, wrap("read idempotency key", err)
}

func (t *tx) CompleteKey(ctx context.Context, k helpdesk.IdempotencyKey, resultID string) error {
	tag, err := t.q.Exec(ctx, `UPDATE helpdesk.idempotency_keys SET result_id = $5
		WHERE tenant = $1 AND user_id = $2 AND command = $3 AND key = $4`,
		k.Tenant, k.UserID, k.Command, k.Key, resultID)
	if err != nil {
		return wrap("complete idempotency key", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("idempotency key not claimed: %w", helpdesk.ErrNotFound)
	}
	return nil
}

func (t *tx) Receipt(ctx context.Context, invocationID string) (receipt.Receipt, bool, error) {
	r, found, err := receipts.Get(ctx, t.pgtx, invocationID)
	return r, found, tag("receipt "+invocationID, err)
}

func (t *tx) RecordReceipt(ctx context.Context, r receipt.Receipt) error {
	return tag("record receipt "+r.InvocationID, receipts.Record(ctx, t.pgtx, r))
}

func nonNil[S ~[]E, E any](s S) S {
	if s == nil {
		return S{}
	}
	return s
}
