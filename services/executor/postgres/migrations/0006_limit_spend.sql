-- Declared per-command limits (budget_check): what each call spent against a bucket (a rate or
-- a budget over a sliding window), shared by every executor on the database.
-- Runs with search_path = executor (see internal/storage/migrate).

-- One row per holder (the call's idempotency key or invocation) and bucket: a retry under the
-- same holder replaces its row, never adds one. Spend serialises a bucket with a
-- transaction-scoped advisory lock on a hash of tenant and bucket, sums the other holders' rows
-- that have not lapsed and, when everything fits (or a human forced it), upserts the holder's
-- rows; times come from the database clock, so replicas with skewed clocks agree. A row counts
-- strictly before lapses_at; Purge deletes it from then on.
CREATE TABLE limit_spend (
	tenant    text        NOT NULL,
	bucket    text        NOT NULL,
	holder    text        NOT NULL,
	amount    bigint      NOT NULL CHECK (amount >= 0),
	spent_at  timestamptz NOT NULL,
	lapses_at timestamptz NOT NULL,
	PRIMARY KEY (tenant, bucket, holder),
	CHECK (lapses_at > spent_at)
);

-- Spend sums a bucket's live spends: WHERE tenant = $1 AND bucket = $2 AND lapses_at > now,
-- answered from the index alone (holder and amount included).
CREATE INDEX limit_spend_live ON limit_spend (tenant, bucket, lapses_at) INCLUDE (holder, amount);

-- Refund gives back everything a holder spent in a tenant.
CREATE INDEX limit_spend_holder ON limit_spend (tenant, holder);

-- Purge deletes lapsed spends.
CREATE INDEX limit_spend_lapses ON limit_spend (lapses_at);

-- A bucket's total: the sum of the amounts of every row limit_spend holds for it, lapsed or
-- not; a bucket whose total is 0 has no row (Spend, Refund and Purge delete it). Every change to limit_spend changes it in the same transaction, under the bucket's
-- advisory lock (Spend, Refund, Purge), so a Spend reads one row instead of summing the
-- bucket's spends, and removes the lapsed ones as it meets them.
CREATE TABLE limit_bucket (
	tenant text    NOT NULL,
	bucket text    NOT NULL,
	used   numeric NOT NULL CHECK (used >= 0),
	PRIMARY KEY (tenant, bucket)
);

-- limit_spend_apply decides and records a Spend (Store.Spend, and ReserveSpending after its
-- reservation), under the buckets' advisory locks the caller took in the same transaction.
-- For each item (p_buckets … p_windows, windows in microseconds) the other holders' spends
-- that have not lapsed at the database's clock are the bucket's total, less its lapsed spends
-- (deleted here, unless p_dry) and the holder's own. When every item fits, or p_force, and not
-- p_dry, it upserts p_holder's spend of each bucket. It returns, in item order, what the
-- others spent (saturated to bigint), whether the item fits, the clock, and — only for an item
-- that does not fit and could (amount <= max), for RetryAfter — the others' live spends'
-- amounts and lapses in lapse order. The items' buckets are distinct (executor.ValidSpending).
CREATE FUNCTION limit_spend_apply(
	p_tenant text, p_holder text, p_buckets text[], p_amounts bigint[], p_maxes bigint[], p_windows bigint[],
	p_force boolean, p_dry boolean)
RETURNS TABLE (o_used bigint, o_fits boolean, o_now timestamptz, o_amounts bigint[], o_lapses timestamptz[])
LANGUAGE plpgsql AS $fn$
DECLARE
	t     timestamptz := clock_timestamp();
	n     int := coalesce(array_length(p_buckets, 1), 0);
	total numeric[] := '{}';
	own   numeric[] := '{}';
	gone  numeric;
	ok    boolean := true;
	write boolean;
BEGIN
	FOR i IN 1 .. n LOOP
		IF p_dry THEN
			gone := (SELECT coalesce(sum(s.amount), 0) FROM executor.limit_spend s
				WHERE s.tenant = p_tenant AND s.bucket = p_buckets[i] AND s.lapses_at <= t);
		ELSE
			WITH d AS (DELETE FROM executor.limit_spend s
				WHERE s.tenant = p_tenant AND s.bucket = p_buckets[i] AND s.lapses_at <= t RETURNING s.amount)
			SELECT coalesce(sum(d.amount), 0) INTO gone FROM d;
		END IF;
		total[i] := coalesce((SELECT b.used FROM executor.limit_bucket b
			WHERE b.tenant = p_tenant AND b.bucket = p_buckets[i]), 0) - gone;
		own[i] := coalesce((SELECT s.amount FROM executor.limit_spend s
			WHERE s.tenant = p_tenant AND s.bucket = p_buckets[i] AND s.holder = p_holder AND s.lapses_at > t), 0);
		IF total[i] - own[i] + p_amounts[i] > p_maxes[i] THEN
			ok := false;
		END IF;
	END LOOP;
	write := NOT p_dry AND (p_force OR ok);
	FOR i IN 1 .. n LOOP
		IF write THEN
			INSERT INTO executor.limit_spend AS l (tenant, bucket, holder, amount, spent_at, lapses_at)
			VALUES (p_tenant, p_buckets[i], p_holder, p_amounts[i], t, t + p_windows[i] * interval '1 microsecond')
			ON CONFLICT (tenant, bucket, holder) DO UPDATE SET
				amount = EXCLUDED.amount, spent_at = EXCLUDED.spent_at, lapses_at = EXCLUDED.lapses_at;
		END IF;
		IF NOT p_dry THEN
			gone := CASE WHEN write THEN total[i] - own[i] + p_amounts[i] ELSE total[i] END;
			IF gone = 0 THEN
				-- An empty bucket keeps no row: a caller varying a group field leaves none behind.
				DELETE FROM executor.limit_bucket b WHERE b.tenant = p_tenant AND b.bucket = p_buckets[i];
			ELSE
				INSERT INTO executor.limit_bucket AS b (tenant, bucket, used) VALUES (p_tenant, p_buckets[i], gone)
				ON CONFLICT (tenant, bucket) DO UPDATE SET used = EXCLUDED.used;
			END IF;
		END IF;
		o_used := least(total[i] - own[i], 9223372036854775807)::bigint;
		o_fits := total[i] - own[i] + p_amounts[i] <= p_maxes[i];
		o_now := t;
		o_amounts := NULL;
		o_lapses := NULL;
		IF NOT o_fits AND p_amounts[i] <= p_maxes[i] THEN
			SELECT array_agg(s.amount ORDER BY s.lapses_at, s.holder), array_agg(s.lapses_at ORDER BY s.lapses_at, s.holder)
			INTO o_amounts, o_lapses
			FROM executor.limit_spend s
			WHERE s.tenant = p_tenant AND s.bucket = p_buckets[i] AND s.lapses_at > t AND s.holder <> p_holder;
			o_amounts := coalesce(o_amounts, '{}');
			o_lapses := coalesce(o_lapses, '{}');
		END IF;
		RETURN NEXT;
	END LOOP;
END
$fn$;

-- limit_reserve_spend is ReserveSpending in one statement: it takes the buckets' advisory locks
-- (p_keys, sorted and distinct), claims the idempotency key as sqlReserve does (a new record,
-- or one that expired), and only when it did, decides and records the spend as
-- limit_spend_apply does. It returns one row per item, o_won true, when it claimed the key;
-- one row with o_won false and nothing else when it did not (the caller reads the record).
CREATE FUNCTION limit_reserve_spend(
	p_keys bigint[], p_tenant text, p_user text, p_command text, p_key text, p_digest text,
	p_now timestamptz, p_expires timestamptz, p_invocation text, p_lease timestamptz,
	p_holder text, p_buckets text[], p_amounts bigint[], p_maxes bigint[], p_windows bigint[], p_force boolean)
RETURNS TABLE (o_won boolean, o_used bigint, o_fits boolean, o_now timestamptz, o_amounts bigint[], o_lapses timestamptz[])
LANGUAGE plpgsql AS $fn$
DECLARE
	won boolean := false;
BEGIN
	PERFORM pg_advisory_xact_lock(k) FROM unnest(p_keys) AS l(k);
	INSERT INTO executor.idempotency AS i
		(tenant, user_id, command, key, digest, state, reserved_at, expires_at, invocation_id, lease_until)
	VALUES (p_tenant, p_user, p_command, p_key, p_digest, 'in_flight', p_now, p_expires, p_invocation, p_lease)
	ON CONFLICT (tenant, user_id, command, key) DO UPDATE SET
		digest = EXCLUDED.digest, state = 'in_flight',
		reserved_at = EXCLUDED.reserved_at, expires_at = EXCLUDED.expires_at,
		finished_at = NULL, invocation_id = EXCLUDED.invocation_id, lease_until = EXCLUDED.lease_until,
		output = NULL, status = NULL, audit_id = NULL
	WHERE i.expires_at <= EXCLUDED.reserved_at
	RETURNING true INTO won;
	IF NOT coalesce(won, false) THEN
		o_won := false;
		RETURN NEXT;
		RETURN;
	END IF;
	RETURN QUERY SELECT true, a.o_used, a.o_fits, a.o_now, a.o_amounts, a.o_lapses
		FROM executor.limit_spend_apply(p_tenant, p_holder, p_buckets, p_amounts, p_maxes, p_windows, p_force, false) AS a;
END
$fn$;
