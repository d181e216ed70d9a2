package postgres

// SQL of the Store. Every table is schema-qualified: the pool's search_path is not ours.
const (
	// sqlReserve claims a key: it inserts a new record, or replaces an expired one, and returns
	// a row only when it did either. ON CONFLICT makes the two atomic against concurrent
	// callers, whose statements wait for the winner's row and then find it live.
	// $1-$4 key, $5 digest, $6 now, $7 expiry, $8 invocation, $9 lease end (NULL: none).
	sqlReserve = `INSERT INTO executor.idempotency AS i
		(tenant, user_id, command, key, digest, state, reserved_at, expires_at, invocation_id, lease_until)
	VALUES ($1, $2, $3, $4, $5, 'in_flight', $6, $7, $8, $9)
	ON CONFLICT (tenant, user_id, command, key) DO UPDATE SET
		digest = EXCLUDED.digest, state = 'in_flight',
		reserved_at = EXCLUDED.reserved_at, expires_at = EXCLUDED.expires_at,
		finished_at = NULL, invocation_id = EXCLUDED.invocation_id, lease_until = EXCLUDED.lease_until,
		output = NULL, status = NULL, audit_id = NULL
	WHERE i.expires_at <= EXCLUDED.reserved_at
	RETURNING true`

	// sqlReadRecord reads the record that a losing sqlReserve met. $5 is now.
	sqlReadRecord = `SELECT digest, state = 'finished', expires_at <= $5,
		state = 'in_flight' AND lease_until IS NOT NULL AND lease_until <= $5,
		coalesce(invocation_id, ''), output, status, coalesce(audit_id, '')
	FROM executor.idempotency
	WHERE tenant = $1 AND user_id = $2 AND command = $3 AND key = $4`

	// sqlRenew extends the lease of invocation $5's claim, still in flight and unexpired at
	// $6, to $7.
	sqlRenew = `UPDATE executor.idempotency SET lease_until = $7
	WHERE tenant = $1 AND user_id = $2 AND command = $3 AND key = $4
	  AND invocation_id = $5 AND state = 'in_flight' AND expires_at > $6`

	// sqlReclaim hands a record that belongs to invocation $5 — finished, or in flight past
	// its lease — to a new claim. $6 now, $7 expiry, $8 new invocation, $9 lease end, $10
	// digest.
	// What previous spent of its command's limits (the record's receipt, as the statement's
	// snapshot has it; only previous's own calls write it, and previous is dead or fenced) is
	// given back by limit_refund in the same statement, only when the record was handed over.
	// (Not read FOR UPDATE: a row locked and updated by one statement is skipped by one of
	// the two.)
	sqlReclaim = `WITH o AS (
		SELECT spent_buckets, spent_amounts, spent_lapses FROM executor.idempotency
		WHERE tenant = $1 AND user_id = $2 AND command = $3 AND key = $4),
	u AS (UPDATE executor.idempotency SET
		state = 'in_flight', reserved_at = $6, expires_at = $7, finished_at = NULL,
		invocation_id = $8, lease_until = $9, output = NULL, status = NULL, audit_id = NULL,
		spent_buckets = NULL, spent_amounts = NULL, spent_lapses = NULL
	WHERE tenant = $1 AND user_id = $2 AND command = $3 AND key = $4
		AND invocation_id = $5 AND digest = $10 AND expires_at > $6
		AND (state = 'finished' OR (lease_until IS NOT NULL AND lease_until <= $6))
	RETURNING true AS won)
	SELECT u.won, executor.limit_refund($1, o.spent_buckets, o.spent_amounts, o.spent_lapses) IS NULL
	FROM u, o`

	// sqlSettle replaces the saved response of the record of invocation $6. $5 now, $7-$9
	// the response.
	sqlSettle = `UPDATE executor.idempotency SET
		state = 'finished', finished_at = coalesce(finished_at, $5),
		output = $7, status = $8, audit_id = coalesce(nullif($9, ''), audit_id)
	WHERE tenant = $1 AND user_id = $2 AND command = $3 AND key = $4 AND invocation_id = $6`

	// sqlRelease drops a reservation that is still in flight.
	sqlRelease = `DELETE FROM executor.idempotency
	WHERE tenant = $1 AND user_id = $2 AND command = $3 AND key = $4 AND state = 'in_flight'`

	// sqlComplete saves the response of an in-flight reservation; a finished record keeps
	// its first response. $5 now, $6-$9 the response.
	sqlComplete = `UPDATE executor.idempotency SET
		state = 'finished', finished_at = $5,
		invocation_id = $6, output = $7, status = $8, audit_id = $9
	WHERE tenant = $1 AND user_id = $2 AND command = $3 AND key = $4 AND state = 'in_flight'`

	// sqlInsertExecution records a run once per invocation.
	sqlInsertExecution = `INSERT INTO executor.executions
		(tenant, invocation_id, user_id, command, subject, time)
	VALUES ($1, $2, $3, $4, $5, $6)
	ON CONFLICT (tenant, invocation_id) DO NOTHING`

	// sqlLockHead creates the tenant's event head if needed and locks it until COMMIT. The
	// no-op update is what takes the lock on an existing row; a concurrent Finish for the
	// tenant waits here, and the statements after it see that Finish's event.
	sqlLockHead = `INSERT INTO executor.event_heads AS h (tenant, seq) VALUES ($1, 0)
	ON CONFLICT (tenant) DO UPDATE SET seq = h.seq`

	// sqlAppendEvent appends the event at head+1 and moves the head, unless the invocation
	// already has an event (a repeated Finish): then neither happens. $1 tenant, $2-$8 the
	// event.
	sqlAppendEvent = `WITH ins AS (
		INSERT INTO executor.events
			(tenant, seq, invocation_id, command, subject, user_id, agent_id, result, time)
		SELECT h.tenant, h.seq + 1, $2, $3, $4, $5, $6, $7, $8
		FROM executor.event_heads h WHERE h.tenant = $1
		ON CONFLICT (tenant, invocation_id) DO NOTHING
		RETURNING seq
	)
	UPDATE executor.event_heads h SET seq = ins.seq FROM ins WHERE h.tenant = $1`

	// sqlExecuted answers the separation-of-duties question with the executions_sod index.
	sqlExecuted = `SELECT EXISTS (
		SELECT FROM executor.executions
		WHERE tenant = $1 AND user_id = $2 AND subject = $3 AND command = ANY($4::text[]))`

	// sqlEvents reads a page of a tenant's outbox along its primary key.
	sqlEvents = `SELECT seq, tenant, command, subject, invocation_id, user_id, agent_id, result, time
	FROM executor.events
	WHERE tenant = $1 AND seq > $2
	ORDER BY seq
	LIMIT $3`

	// sqlSpool keeps an audit row for later. $1 tenant, $2 invocation, $3 record, $4 time.
	sqlSpool = `INSERT INTO executor.audit_spool (tenant, invocation_id, record, spooled_at) VALUES ($1, $2, $3, $4)`

	// sqlAsyncCommit lets the transaction it opens commit without waiting for its WAL flush
	// (Store.lazily: a key's claim and release, SpoolRows of a lazy batch, Unspool).
	sqlAsyncCommit = `SELECT set_config('synchronous_commit', 'off', true)`

	// sqlSpoolRows keeps several audit rows, in their order: $1 tenants, $2 invocations,
	// $3 records, $4 times, one element per row.
	sqlSpoolRows = `INSERT INTO executor.audit_spool (tenant, invocation_id, record, spooled_at)
	SELECT t, i, r, at FROM unnest($1::text[], $2::text[], $3::bytea[], $4::timestamptz[]) WITH ORDINALITY AS u(t, i, r, at, n)
	ORDER BY n
	RETURNING id`

	// sqlSpooled reads the oldest spooled rows.
	sqlSpooled = `SELECT id, tenant, invocation_id, record, spooled_at FROM executor.audit_spool ORDER BY id LIMIT $1`

	// sqlUnspool drops delivered spooled rows.
	sqlUnspool = `DELETE FROM executor.audit_spool WHERE id = ANY($1::bigint[])`

	// sqlSpooling lists which of tenant $1's invocations $2 have a row in the spool
	// (audit_spool_invocation).
	sqlSpooling = `SELECT DISTINCT invocation_id FROM executor.audit_spool WHERE tenant = $1 AND invocation_id = ANY($2::text[])`

	// sqlBury keeps a row in the dead letter and unspools $7 (0: none) in one statement.
	sqlBury = `WITH gone AS (DELETE FROM executor.audit_spool WHERE id = $7)
	INSERT INTO executor.audit_dead_letter (tenant, invocation_id, record, spooled_at, dead_at, reason)
	VALUES ($1, $2, $3, $4, $5, $6)`

	// sqlDeadLetters reads tenant $1's oldest dead-lettered rows.
	sqlDeadLetters = `SELECT id, tenant, invocation_id, record, spooled_at, dead_at, reason
	FROM executor.audit_dead_letter WHERE tenant = $1 ORDER BY id LIMIT $2`

	// sqlRedrive moves tenant $1's dead-lettered rows $2 (NULL: all) back to the spool, in
	// their order, in one statement.
	sqlRedrive = `WITH moved AS (
		DELETE FROM executor.audit_dead_letter
		WHERE tenant = $1 AND ($2::bigint[] IS NULL OR id = ANY($2::bigint[]))
		RETURNING id, tenant, invocation_id, record, spooled_at)
	INSERT INTO executor.audit_spool (tenant, invocation_id, record, spooled_at)
	SELECT tenant, invocation_id, record, spooled_at FROM moved ORDER BY id`

	// sqlResolveForget drops the idempotency record of an invocation an
	// operator resolved as never run, and gives back what it spent of its
	// limits (its receipt, limit_refund). $1 tenant, $2 invocation. It
	// returns how many records it dropped.
	sqlResolveForget = `WITH d AS (DELETE FROM executor.idempotency WHERE tenant = $1 AND invocation_id = $2
		RETURNING spent_buckets, spent_amounts, spent_lapses)
	SELECT count(*), coalesce(bool_and(executor.limit_refund($1, d.spent_buckets, d.spent_amounts, d.spent_lapses) IS NULL), true)
	FROM d`

	// sqlResolveSettle finishes the idempotency record of an invocation an
	// operator resolved as run. $3 now, $4-$6 the response.
	sqlResolveSettle = `UPDATE executor.idempotency SET
		state = 'finished', finished_at = coalesce(finished_at, $3), lease_until = NULL,
		output = $4, status = $5, audit_id = coalesce(nullif($6, ''), audit_id)
	WHERE tenant = $1 AND invocation_id = $2`

	// sqlPurgeExpired deletes expired idempotency records.
	sqlPurgeExpired = `DELETE FROM executor.idempotency WHERE expires_at <= $1`

	// sqlBacklog lists the tenants whose head is past their cursor.
	sqlBacklog = `SELECT h.tenant, coalesce(c.seq, 0), h.seq
	FROM executor.event_heads h LEFT JOIN executor.event_cursors c ON c.tenant = h.tenant
	WHERE h.seq > coalesce(c.seq, 0)
	ORDER BY h.tenant`

	// sqlMarkDelivered moves a tenant's cursor forward to $2, never back and never past the
	// head. $3 is now.
	sqlMarkDelivered = `INSERT INTO executor.event_cursors AS c (tenant, seq, delivered_at)
	SELECT h.tenant, least($2::bigint, h.seq), $3 FROM executor.event_heads h WHERE h.tenant = $1
	ON CONFLICT (tenant) DO UPDATE SET seq = EXCLUDED.seq, delivered_at = EXCLUDED.delivered_at
	WHERE c.seq < EXCLUDED.seq`

	// sqlPurgeSpends drops the entries lapsed at $1 (the purger's clock; a skew between it and
	// the database's, which times the spends, moves the purge by as much) of up to $2 buckets,
	// under each bucket's lock, by limit_purge (migration 0007); it returns how many.
	sqlPurgeSpends = `SELECT executor.limit_purge($1, $2)`

	// sqlSpendLock serialises the buckets of a Spend: limit_lock (migration 0007) takes the
	// transaction-scoped advisory locks of tenant $1's buckets $2 in key order, so that
	// Spends of several buckets never wait on each other in a cycle. Sent in one implicit
	// transaction with sqlSpend, which takes its snapshot (and its clock) once they are held.
	sqlSpendLock = `SELECT executor.limit_lock($1, $2::text[])`

	// sqlSpend decides and records a Spend, under sqlSpendLock, by limit_spend_apply
	// (migration 0007) at the database's clock: $1 tenant, $2-$5 the items' buckets, amounts,
	// maxes and windows in microseconds, $6 force, $7 dry run, $8-$10 the key's user, command
	// and key (NULL without one). It returns, in item order, what the bucket held, whether
	// the item fits, the clock, the instant a recorded amount lapses, and the live entries of
	// an item that does not fit and could.
	sqlSpend = `SELECT o_used, o_fits, o_now, o_lapse, o_amounts, o_lapses
	FROM executor.limit_spend_apply($1, clock_timestamp(), $2::text[], $3::bigint[], $4::bigint[], $5::bigint[],
		$6, $7, $8, $9, $10)`

	// sqlReserveSpend is ReserveSpending in one statement, by limit_reserve_spend (migration
	// 0007): $1-$9 the claim as sqlReserve takes it (tenant, user, command, key, digest, now,
	// expiry, invocation, lease end), $10-$13 the items, $14 force.
	sqlReserveSpend = `SELECT o_won, o_used, o_fits, o_now, o_lapse, o_amounts, o_lapses
	FROM executor.limit_reserve_spend($1, $2, $3, $4, $5, $6, $7, $8, $9,
		$10::text[], $11::bigint[], $12::bigint[], $13::bigint[], $14)`

	// sqlSpendOne is Spend ($8 false) or ReserveSpending ($8 true) of one item, by
	// limit_spend_one (migration 0007) in one statement: $1 tenant, $2-$5 the item's bucket,
	// amount, max and window in microseconds, $6 force, $7 dry run, $9-$11 the key's user,
	// command and key (NULL without one), $12-$16 the claim's digest, now, expiry, invocation
	// and lease end. Its row is collectBalances' with o_won first.
	sqlSpendOne = `SELECT o_won, o_used, o_fits, o_now, o_lapse, o_amounts, o_lapses
	FROM executor.limit_spend_one($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)`

	// sqlRefund gives back a receipt in tenant $1 ($2 buckets, $3 amounts, $4 lapse instants
	// in microseconds) by limit_refund (migration 0007).
	sqlRefund = `SELECT executor.limit_refund($1, $2::text[], $3::bigint[], $4::bigint[])`

	// sqlPurgeEvents deletes events committed at or before $1 that were delivered, or, with
	// $2, whether delivered or not.
	sqlPurgeEvents = `DELETE FROM executor.events e
	WHERE e.time <= $1 AND ($2 OR e.seq <= coalesce(
		(SELECT c.seq FROM executor.event_cursors c WHERE c.tenant = e.tenant), 0))`

	// sqlPark parks a call, replacing the challenge's row. $1 tenant, $2 challenge, $3 command,
	// $4 declaration digest, $5 input digest, $6 canonical bytes, $7 arguments, $8 withheld,
	// $9 arguments digest, $10 invocation digest, $11 now, $12 expiry.
	sqlPark = `INSERT INTO executor.parked_call AS p
		(tenant, challenge_id, command, declaration_digest, input_digest, canonical, arguments, withheld,
		 arguments_digest, invocation_digest, parked_at, expires_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
	ON CONFLICT (tenant, challenge_id) DO UPDATE SET
		command = EXCLUDED.command, declaration_digest = EXCLUDED.declaration_digest,
		input_digest = EXCLUDED.input_digest, canonical = EXCLUDED.canonical,
		arguments = EXCLUDED.arguments, withheld = EXCLUDED.withheld,
		arguments_digest = EXCLUDED.arguments_digest, invocation_digest = EXCLUDED.invocation_digest,
		parked_at = EXCLUDED.parked_at, expires_at = EXCLUDED.expires_at`

	// sqlParked reads the challenge's row, unexpired at $3.
	sqlParked = `SELECT command, declaration_digest, input_digest, canonical, arguments, withheld,
		arguments_digest, invocation_digest, expires_at
	FROM executor.parked_call WHERE tenant = $1 AND challenge_id = $2 AND expires_at > $3`

	// sqlUnpark drops the challenge's row.
	sqlUnpark = `DELETE FROM executor.parked_call WHERE tenant = $1 AND challenge_id = $2`

	// sqlPurgeParked deletes the rows expired at $1.
	sqlPurgeParked = `DELETE FROM executor.parked_call WHERE expires_at <= $1`
)
