package postgres

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/services/audit"
)

// queryBuilder assembles a WHERE clause from constant fragments; values only ever travel as
// parameters.
type queryBuilder struct {
	where []string
	args  []any
}

// arg adds a parameter and returns its placeholder.
func (b *queryBuilder) arg(v any) string {
	b.args = append(b.args, v)
	return "$" + strconv.Itoa(len(b.args))
}

func (b *queryBuilder) cond(fragment string) { b.where = append(b.where, fragment) }

func toStrings[T ~string](in []T) []string {
	out := make([]string, len(in))
	for i, v := range in {
		out[i] = string(v)
	}
	return out
}

// buildQuery returns the SQL and arguments of one page of p. It is exported to tests through
// export_test.go so that EXPLAIN can be run on exactly what Query runs.
func buildQuery(p *audit.PreparedFilter) (string, []any) {
	var b queryBuilder
	b.cond("tenant = " + b.arg(p.Tenant))
	if !p.From.IsZero() {
		b.cond("time >= " + b.arg(p.From))
	}
	if !p.To.IsZero() {
		b.cond("time < " + b.arg(p.To))
	}
	if len(p.ActorKinds) > 0 {
		b.cond("actor_kind = ANY(" + b.arg(toStrings(p.ActorKinds)) + "::text[])")
	}
	if p.AgentID != "" {
		b.cond("agent_id = " + b.arg(p.AgentID))
	}
	if p.Model != "" {
		b.cond("model = " + b.arg(p.Model))
	}
	if len(p.Risks) > 0 {
		b.cond("risk = ANY(" + b.arg(toStrings(p.Risks)) + "::text[])")
	}
	if p.SideEffect != "" {
		b.cond("side_effects @> ARRAY[" + b.arg(p.SideEffect) + "::text]")
	}
	if p.Command != "" {
		b.cond("command = " + b.arg(p.Command))
	}
	if len(p.Outcomes) > 0 {
		b.cond("outcome = ANY(" + b.arg(toStrings(p.Outcomes)) + "::text[])")
	}
	if p.Stage != "" {
		b.cond("stage = " + b.arg(p.Stage))
	}
	if p.Approved != nil {
		if *p.Approved {
			b.cond("approver IS NOT NULL")
		} else {
			b.cond("approver IS NULL")
		}
	}
	if p.Approver != "" {
		b.cond("approver = " + b.arg(p.Approver))
	}
	if p.ConversationID != "" {
		b.cond("conversation_id = " + b.arg(p.ConversationID))
	}
	if p.Phase != "" {
		b.cond("phase = " + b.arg(string(p.Phase)))
	}
	if p.BeforeSeq > 0 {
		b.cond("seq < " + b.arg(p.BeforeSeq))
	}
	sql := "SELECT " + columnList + " FROM audit.records WHERE " + strings.Join(b.where, " AND ") +
		" ORDER BY seq DESC LIMIT " + b.arg(p.PageSize+1)
	return sql, b.args
}

// Query implements audit.Store. Statements run unnamed (QueryExecModeCacheDescribe), so every
// query is planned with its actual values: that is what lets the planner match the partial
// indexes (e.g. risk IN ('L3','L4')) against the filter.
func (s *Store) Query(ctx context.Context, f audit.Filter) (audit.Page, error) {
	p, err := f.Prepare()
	if err != nil {
		return audit.Page{}, err
	}
	if s.isClosed() {
		return audit.Page{}, audit.ErrClosed
	}
	sql, args := buildQuery(&p)
	rows, err := s.pool.Query(ctx, sql, append([]any{pgx.QueryExecModeCacheDescribe}, args...)...)
	if err != nil {
		return audit.Page{}, mapErr("audit: query", err)
	}
	recs, err := pgx.CollectRows(rows, scanRow)
	if err != nil {
		return audit.Page{}, mapErr("audit: query", err)
	}
	var page audit.Page
	if len(recs) > p.PageSize {
		recs = recs[:p.PageSize]
		page.NextPageToken = p.NextPageToken(recs[len(recs)-1].Seq)
	}
	page.Records = recs
	return page, nil
}

// Get implements audit.Store.
func (s *Store) Get(ctx context.Context, tenant, invocationID string) ([]audit.Stored, error) {
	if s.isClosed() {
		return nil, audit.ErrClosed
	}
	rows, err := s.pool.Query(ctx, "SELECT "+columnList+" FROM audit.records WHERE tenant = $1 AND invocation_id = $2 ORDER BY seq",
		tenant, invocationID)
	if err != nil {
		return nil, mapErr("audit: get", err)
	}
	recs, err := pgx.CollectRows(rows, scanRow)
	if err != nil {
		return nil, mapErr("audit: get", err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%w: invocation %q", audit.ErrNotFound, invocationID)
	}
	return recs, nil
}

// Verify implements audit.Store. It reads the head and the rows in one repeatable-read
// snapshot, streaming the rows, so a concurrent append cannot look like a broken chain and a
// long chain is never held in memory.
func (s *Store) Verify(ctx context.Context, tenant string) (audit.Report, error) {
	if s.isClosed() {
		return audit.Report{}, audit.ErrClosed
	}
	var rep audit.Report
	err := pg.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		v := audit.NewChainVerifier(tenant)
		var head audit.Head
		hasHead := true
		err := tx.QueryRow(ctx, "SELECT seq, hash FROM audit.heads WHERE tenant = $1", tenant).Scan(&head.Seq, &head.Hash)
		if pg.Classify(err) == pg.KindNotFound {
			hasHead, err = false, nil
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "SELECT "+columnList+" FROM audit.records WHERE tenant = $1 ORDER BY seq", tenant)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			row, err := scanRow(rows)
			if err != nil {
				return err
			}
			if !v.Add(&row) {
				break
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		rep = v.Finish(head, hasHead)
		return nil
	}, pg.WithIsolation(pgx.RepeatableRead), pg.ReadOnly())
	if err != nil {
		return audit.Report{}, mapErr("audit: verify", err)
	}
	return rep, nil
}

// PendingIntents implements audit.Store.
func (s *Store) UnresolvedUnknowns(ctx context.Context, before time.Time, limit int) ([]audit.Stored, error) {
	if s.isClosed() {
		return nil, audit.ErrClosed
	}
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.pool.Query(ctx, `SELECT `+rColumnList+` FROM audit.records r
		WHERE r.phase = 'outcome' AND r.outcome = 'unknown' AND r.time < $1
		  AND NOT EXISTS (SELECT FROM audit.records x WHERE x.tenant = r.tenant AND x.invocation_id = r.invocation_id AND x.phase = 'resolution')
		ORDER BY r.time, r.tenant, r.seq LIMIT $2`, before, limit)
	if err != nil {
		return nil, mapErr("audit: unresolved unknowns", err)
	}
	recs, err := pgx.CollectRows(rows, scanRow)
	if err != nil {
		return nil, mapErr("audit: unresolved unknowns", err)
	}
	return recs, nil
}

// PendingIntents implements audit.Store.
func (s *Store) PendingIntents(ctx context.Context, before time.Time, limit int) ([]audit.Stored, error) {
	if s.isClosed() {
		return nil, audit.ErrClosed
	}
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.pool.Query(ctx, `SELECT `+rColumnList+` FROM audit.pending p
		JOIN audit.records r ON r.tenant = p.tenant AND r.seq = p.seq
		WHERE p.time < $1 ORDER BY p.time, p.tenant, p.seq LIMIT $2`, before, limit)
	if err != nil {
		return nil, mapErr("audit: pending intents", err)
	}
	recs, err := pgx.CollectRows(rows, scanRow)
	if err != nil {
		return nil, mapErr("audit: pending intents", err)
	}
	return recs, nil
}
