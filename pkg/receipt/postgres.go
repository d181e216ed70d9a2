package receipt

import (
	"context"
	_ "embed" // SchemaSQL
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"

	"github.com/mandate-dev/mandate/internal/storage/pg"
)

// SchemaSQL creates the receipts table. A backend copies it into a numbered migration of its own
// schema (migrations never change once applied, so copy it rather than reference it), next to
// the tables of its effects: the receipt must commit in the same transaction as they do.
//
//go:embed schema.sql
var SchemaSQL string

// Postgres is the Store on a pgx.Tx, over the receipts table of one schema.
type Postgres struct {
	table string // sanitised schema-qualified identifier
}

var _ Store[pgx.Tx] = (*Postgres)(nil)

var schemaRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// NewPostgres returns the Store over schema.receipts, created by [SchemaSQL]. schema is the
// backend's own schema name (e.g. "helpdesk"), never input; a malformed one panics.
func NewPostgres(schema string) *Postgres {
	if !schemaRE.MatchString(schema) {
		panic(fmt.Sprintf("receipt: schema name %q must match %s", schema, schemaRE))
	}
	return &Postgres{table: pgx.Identifier{schema, "receipts"}.Sanitize()}
}

// lockClass is the first key of the transaction advisory locks that hold an invocation id
// ("rcpt"); the two-key space never meets the one-key locks of migrations.
const lockClass int32 = 0x72637074

// Get implements Store. It takes a transaction-scoped advisory lock on the invocation id before
// it reads, so a delivery and a fence of one invocation serialise: whichever comes second waits
// for the first to commit or roll back, then sees its row (each statement of a READ COMMITTED
// transaction reads what committed before it began).
func (p *Postgres) Get(ctx context.Context, tx pgx.Tx, invocationID string) (Receipt, bool, error) {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int4, hashtext($2))`, lockClass, invocationID); err != nil {
		return Receipt{}, false, pg.Wrap("receipt: lock invocation", err)
	}
	r := Receipt{InvocationID: invocationID}
	err := tx.QueryRow(ctx, `SELECT state, method, result, recorded_at FROM `+p.table+` WHERE invocation_id = $1`,
		invocationID).Scan(&r.State, &r.Method, &r.Result, &r.RecordedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Receipt{}, false, nil
	case err != nil:
		return Receipt{}, false, pg.Wrap("receipt: get", err)
	}
	return r.normalize(), true, nil
}

// Record implements Store. The primary key on invocation_id is what makes a fenced invocation's
// effect fail: a conflicting row turns into ErrFenced or ErrExecuted, and the caller's
// transaction, which carries the effect, then rolls back.
func (p *Postgres) Record(ctx context.Context, tx pgx.Tx, r Receipt) error {
	if err := r.Validate(); err != nil {
		return err
	}
	r = r.normalize()
	result := r.Result
	if result == nil {
		result = []byte{} // NOT NULL
	}
	// ON CONFLICT DO NOTHING rather than a unique violation: the violation would abort the
	// transaction before the state could be read to say which conflict it was.
	tag, err := tx.Exec(ctx, `INSERT INTO `+p.table+` (invocation_id, state, method, result, recorded_at)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (invocation_id) DO NOTHING`,
		r.InvocationID, string(r.State), r.Method, result, r.RecordedAt)
	if err != nil {
		return pg.Wrap("receipt: record", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var state State
	err = tx.QueryRow(ctx, `SELECT state FROM `+p.table+` WHERE invocation_id = $1`, r.InvocationID).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		// A snapshot older than the conflicting row (REPEATABLE READ or stricter): the row
		// exists but this transaction cannot say which it is. Either way it must not commit.
		return fmt.Errorf("invocation %s: %w", r.InvocationID, pg.ErrConflict)
	}
	if err != nil {
		return pg.Wrap("receipt: record", err)
	}
	return conflict(r.InvocationID, state)
}
