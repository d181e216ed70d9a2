package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandate-dev/mandate/services/confirm"
)

// ExpireDue implements confirm.NoticeStore. One statement: it locks up to
// limit pending, expired challenges without an expired notice (skipping
// those another sweep holds), flags them and records their notices, so
// concurrent sweeps in any number of replicas record each notice once.
func (s *Store) ExpireDue(ctx context.Context, limit int) (int, error) {
	if s.isClosed() {
		return 0, errClosed
	}
	if limit <= 0 {
		return 0, nil
	}
	// id = ANY (ARRAY(…)): the rows are locked once, by an init plan, then
	// updated through the primary key. (As id IN (…) the planner may make
	// the locking subquery the inner side of a join and rescan it per row,
	// each rescan skipping the rows taken so far and locking more than
	// limit.) FOR UPDATE re-checks its WHERE against the latest version of
	// a row it locks, so a row decided or flagged meanwhile is left out,
	// and nothing changes a locked row before the statement commits.
	tag, err := s.pool.Exec(ctx, `WITH due AS (
			UPDATE confirm.challenges SET expiry_noticed = true
			WHERE id = ANY (ARRAY(
				SELECT id FROM confirm.challenges
				WHERE state = 'PENDING' AND NOT expiry_noticed AND expires_at <= now()
				ORDER BY expires_at, id LIMIT $1
				FOR UPDATE SKIP LOCKED
			))
			RETURNING tenant, id, expires_at
		)
		INSERT INTO confirm.notices (kind, tenant, challenge_id, at, next_at)
		SELECT 'challenge.expired', tenant, id, expires_at, now() FROM due ORDER BY expires_at, id`, limit)
	if err != nil {
		return 0, mapErr("record expired notices", err)
	}
	return int(tag.RowsAffected()), nil
}

// ClaimNotices implements confirm.NoticeStore. One statement: the due
// notices are locked (skipping those another claimer is taking), moved a
// lease ahead and returned with their challenges as stored now.
func (s *Store) ClaimNotices(ctx context.Context, limit int, lease time.Duration) ([]confirm.Notice, error) {
	if lease < time.Microsecond {
		return nil, confirm.Invalid("lease", "must be positive")
	}
	if s.isClosed() {
		return nil, errClosed
	}
	if limit <= 0 {
		return nil, nil
	}
	// Locked once by an init plan, as in ExpireDue.
	rows, err := s.pool.Query(ctx, `WITH claimed AS (
			UPDATE confirm.notices SET next_at = now() + $2::bigint * interval '1 microsecond'
			WHERE id = ANY (ARRAY(
				SELECT id FROM confirm.notices
				WHERE NOT given_up AND next_at <= now()
				ORDER BY id LIMIT $1
				FOR UPDATE SKIP LOCKED
			))
			RETURNING id AS notice_id, kind, tenant AS notice_tenant, challenge_id, at, attempts
		)
		SELECT claimed.notice_id, claimed.kind, claimed.at, claimed.attempts, `+columns+`
		FROM claimed JOIN confirm.challenges ON challenges.id = claimed.challenge_id AND challenges.tenant = claimed.notice_tenant
		ORDER BY claimed.notice_id`, limit, lease.Microseconds())
	if err != nil {
		return nil, mapErr("claim notices", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (confirm.Notice, error) { return scanNotice(r) })
	return out, mapErr("claim notices", err)
}

// scanNotice reads a notice's id, kind, at and attempts followed by its
// challenge's columns.
func scanNotice(row pgx.Row) (confirm.Notice, error) {
	var (
		n    confirm.Notice
		kind string
	)
	c, err := scan(rowPrefix{row: row, dest: []any{&n.ID, &kind, &n.At, &n.Attempts}})
	if err != nil {
		return n, err
	}
	n.Kind, n.At, n.Challenge = confirm.NoticeKind(kind), n.At.UTC(), c
	n.Tenant, n.ChallengeID = c.Tenant, c.ID
	return n, nil
}

// rowPrefix is a row whose first columns go to dest, the rest to Scan's.
type rowPrefix struct {
	row  pgx.Row
	dest []any
}

func (r rowPrefix) Scan(dest ...any) error { return r.row.Scan(append(r.dest, dest...)...) }

// NoticeDelivered implements confirm.NoticeStore.
func (s *Store) NoticeDelivered(ctx context.Context, id int64) error {
	if s.isClosed() {
		return errClosed
	}
	_, err := s.pool.Exec(ctx, "DELETE FROM confirm.notices WHERE id = $1", id)
	return mapErr("drop delivered notice", err)
}

// NoticeFailed implements confirm.NoticeStore.
func (s *Store) NoticeFailed(ctx context.Context, id int64, after time.Duration, reason string) error {
	if s.isClosed() {
		return errClosed
	}
	_, err := s.pool.Exec(ctx, `UPDATE confirm.notices
		SET attempts = attempts + 1, next_at = now() + $2::bigint * interval '1 microsecond', reason = $3
		WHERE id = $1 AND NOT given_up`, id, max(after, 0).Microseconds(), confirm.NoticeReason(reason))
	return mapErr("record failed notice", err)
}

// NoticeGiveUp implements confirm.NoticeStore.
func (s *Store) NoticeGiveUp(ctx context.Context, id int64, reason string) error {
	if s.isClosed() {
		return errClosed
	}
	_, err := s.pool.Exec(ctx, "UPDATE confirm.notices SET given_up = true, reason = $2 WHERE id = $1",
		id, confirm.NoticeReason(reason))
	return mapErr("give up notice", err)
}

// PurgeExpired implements confirm.Purger: it deletes up to limit
// challenges that expired longer ago than Options.Retain, oldest expiry
// first, with their notices (delivered, pending or given up: the foreign
// key cascades). Concurrent purges in any number of replicas skip each
// other's rows. A challenge expired that long ago can no longer change
// state, be redeemed or be released.
func (s *Store) PurgeExpired(ctx context.Context, limit int) (int, error) {
	if s.isClosed() {
		return 0, errClosed
	}
	if limit <= 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM confirm.challenges WHERE id = ANY (ARRAY(
			SELECT id FROM confirm.challenges
			WHERE expires_at < now() - $1 * interval '1 microsecond'
			ORDER BY expires_at LIMIT $2
			FOR UPDATE SKIP LOCKED))`, s.opts.Retain.Microseconds(), limit)
	if err != nil {
		return 0, mapErr("purge expired challenges", err)
	}
	return int(tag.RowsAffected()), nil
}
