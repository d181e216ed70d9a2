-- Declared limits, one row per bucket (budget_check at the cost of one row update): a bucket's
-- spends are summed per lapse instant instead of kept one row per call. Migration 0006 wrote a
-- row per call and holder into limit_spend, with four index entries, and deleted it when it
-- lapsed; a governed call with a limit paid more for that than the limit was worth. Now a
-- spend adds its amount to the bucket's entry for the instant it lapses, its window rounded up
-- to a 64th of the window (executor.SpendGrain), so a bucket holds at most about 65 entries
-- however many calls spend in it, and a spend is one HOT update of one row.
--
-- What a call spent (its receipt: buckets, amounts, lapse instants) is kept by the executor
-- for Refund and, for a call with an idempotency key, on the key's record, so that Reclaim
-- gives back the spend of a call its backend fenced (it never ran) when a retry takes the
-- key over.
--
-- Runs with search_path = executor (see internal/storage/migrate).

CREATE TABLE limit_bucket_v2 (
	tenant  text     NOT NULL,
	bucket  text     NOT NULL,
	-- The instants the bucket's spends lapse, in microseconds since the Unix epoch, ascending
	-- and distinct, and what lapses at each (positive). A spend counts strictly before its
	-- instant. A bucket without a live spend keeps no row (once a writer or Purge meets it).
	lapses  bigint[] NOT NULL,
	amounts bigint[] NOT NULL,
	PRIMARY KEY (tenant, bucket),
	CHECK (cardinality(lapses) = cardinality(amounts) AND cardinality(lapses) > 0)
) WITH (fillfactor = 70); -- room on the page, so that a spend is a HOT update

-- The live spends of 0006 carry over, summed per bucket and instant.
INSERT INTO limit_bucket_v2 (tenant, bucket, lapses, amounts)
SELECT tenant, bucket, array_agg(l ORDER BY l), array_agg(a ORDER BY l)
FROM (
	SELECT tenant, bucket, (extract(epoch FROM lapses_at) * 1000000)::bigint AS l, sum(amount)::bigint AS a
	FROM limit_spend
	WHERE lapses_at > now() AND amount > 0
	GROUP BY 1, 2, 3
) s
GROUP BY tenant, bucket;

DROP FUNCTION limit_reserve_spend(bigint[], text, text, text, text, text, timestamptz, timestamptz, text,
	timestamptz, text, text[], bigint[], bigint[], bigint[], boolean);
DROP FUNCTION limit_spend_apply(text, text, text[], bigint[], bigint[], bigint[], boolean, boolean);
DROP TABLE limit_spend;
DROP TABLE limit_bucket;
ALTER TABLE limit_bucket_v2 RENAME TO limit_bucket;
ALTER INDEX limit_bucket_v2_pkey RENAME TO limit_bucket_pkey;

-- A keyed call's receipt: what it spent of its command's limits, noted when it spent (Spend or
-- ReserveSpending with the key) and given back by Reclaim.
ALTER TABLE idempotency
	ADD COLUMN spent_buckets text[],
	ADD COLUMN spent_amounts bigint[],
	ADD COLUMN spent_lapses  bigint[];

-- limit_lock takes the transaction-scoped advisory locks of tenant's buckets, in key order (so
-- that two callers never wait on each other in a cycle; two buckets whose keys collide only
-- serialise each other). PL/pgSQL rather than SQL: its plans are kept for the session.
CREATE FUNCTION limit_lock(p_tenant text, p_buckets text[]) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
	k bigint;
BEGIN
	IF cardinality(p_buckets) = 1 THEN
		PERFORM pg_advisory_xact_lock(hashtextextended(length(p_tenant) || ':' || p_tenant || p_buckets[1], 7350010));
		RETURN;
	END IF;
	FOR k IN SELECT DISTINCT hashtextextended(length(p_tenant) || ':' || p_tenant || b, 7350010)
			FROM unnest(p_buckets) AS u(b) ORDER BY 1 LOOP
		PERFORM pg_advisory_xact_lock(k);
	END LOOP;
END
$fn$;

-- limit_micros is t in microseconds since the Unix epoch.
CREATE FUNCTION limit_micros(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $fn$ SELECT (extract(epoch FROM t) * 1000000)::bigint $fn$;

-- limit_lapse is when a spend made at p_t (microseconds) with a window of p_w microseconds stops
-- counting: p_t + p_w rounded up to a multiple of the grain, ceil(p_w / 64) (executor.SpendLapses).
-- One expression, so that the planner inlines it (as limit_micros).
CREATE FUNCTION limit_lapse(p_t bigint, p_w bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $fn$
	SELECT ((p_t + p_w + greatest((p_w + 63) / 64, 1) - 1) / greatest((p_w + 63) / 64, 1)) * greatest((p_w + 63) / 64, 1)
$fn$;

-- limit_add is a bucket's entries (p_lapses, p_amounts) without those lapsed at p_tu and with
-- p_amount added at p_lapse (merged into the entry for that instant, or inserted in order);
-- p_amount 0 only drops the lapsed entries. No statement inside: a call is a few microseconds.
CREATE FUNCTION limit_add(p_lapses bigint[], p_amounts bigint[], p_tu bigint, p_lapse bigint, p_amount bigint,
	OUT o_lapses bigint[], OUT o_amounts bigint[])
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
	added boolean := p_amount = 0;
BEGIN
	o_lapses := '{}';
	o_amounts := '{}';
	FOR j IN 1 .. coalesce(cardinality(p_lapses), 0) LOOP
		CONTINUE WHEN p_lapses[j] <= p_tu;
		IF NOT added AND p_lapses[j] >= p_lapse THEN
			added := true;
			IF p_lapses[j] = p_lapse THEN
				o_lapses := o_lapses || p_lapses[j];
				o_amounts := o_amounts || least(p_amounts[j]::numeric + p_amount, 9223372036854775807)::bigint;
				CONTINUE;
			END IF;
			o_lapses := o_lapses || p_lapse;
			o_amounts := o_amounts || p_amount;
		END IF;
		o_lapses := o_lapses || p_lapses[j];
		o_amounts := o_amounts || p_amounts[j];
	END LOOP;
	IF NOT added THEN
		o_lapses := o_lapses || p_lapse;
		o_amounts := o_amounts || p_amount;
	END IF;
END
$fn$;

-- limit_spend_apply decides and records a Spend (Store.Spend, and ReserveSpending after its
-- claim) at p_t, under the buckets' locks (limit_lock) the caller took in the same
-- transaction. For each item (p_buckets … p_windows, windows in microseconds) the bucket's
-- spends that lapse after p_t are what it holds. When every item fits, or p_force, and not
-- p_dry, each positive amount is added to its bucket's entry for limit_lapse(p_t, window), and
-- the lapsed entries of the buckets written are dropped. With p_user (a keyed call: tenant,
-- p_user, p_command, p_key), what was recorded is appended to the key's record. It returns, in
-- item order: what the bucket held (saturated to bigint), whether the item fits, p_t, the
-- instant the amount lapses when it was recorded, and — only for an item that does not fit and
-- could (amount <= max), for RetryAfter — the bucket's live entries.
CREATE FUNCTION limit_spend_apply(
	p_tenant text, p_t timestamptz, p_buckets text[], p_amounts bigint[], p_maxes bigint[], p_windows bigint[],
	p_force boolean, p_dry boolean, p_user text, p_command text, p_key text)
RETURNS TABLE (o_used bigint, o_fits boolean, o_now timestamptz, o_lapse bigint, o_amounts bigint[], o_lapses bigint[])
LANGUAGE plpgsql AS $fn$
DECLARE
	m     record;
	tu    bigint := executor.limit_micros(p_t);
	n     int := coalesce(array_length(p_buckets, 1), 0);
	used  numeric[] := '{}';
	ok    boolean := true;
	write boolean;
	bl    bigint[];
	ba    bigint[];
	nl    bigint[];
	na    bigint[];
	lapse bigint;
	u     numeric;
	rb    text[] := '{}';
	ra    bigint[] := '{}';
	rl    bigint[] := '{}';
BEGIN
	FOR i IN 1 .. n LOOP
		bl := NULL;
		SELECT b.lapses, b.amounts INTO bl, ba FROM executor.limit_bucket b
			WHERE b.tenant = p_tenant AND b.bucket = p_buckets[i];
		u := 0;
		FOR j IN 1 .. coalesce(cardinality(bl), 0) LOOP
			IF bl[j] > tu THEN
				u := u + ba[j];
			END IF;
		END LOOP;
		used[i] := u;
		IF u + p_amounts[i] > p_maxes[i] THEN
			ok := false;
		END IF;
	END LOOP;
	write := NOT p_dry AND (p_force OR ok);
	FOR i IN 1 .. n LOOP
		lapse := NULL;
		IF write THEN
			IF n > 1 THEN -- one item (the usual case): bl and ba still hold its bucket
				bl := NULL;
				SELECT b.lapses, b.amounts INTO bl, ba FROM executor.limit_bucket b
					WHERE b.tenant = p_tenant AND b.bucket = p_buckets[i];
			END IF;
			IF p_amounts[i] > 0 THEN
				lapse := executor.limit_lapse(tu, p_windows[i]);
			END IF;
			m := executor.limit_add(bl, ba, tu, coalesce(lapse, 0), p_amounts[i]);
			nl := m.o_lapses;
			na := m.o_amounts;
			IF cardinality(nl) = 0 THEN
				-- An empty bucket keeps no row: a caller varying a group field leaves none behind.
				IF bl IS NOT NULL THEN
					DELETE FROM executor.limit_bucket b WHERE b.tenant = p_tenant AND b.bucket = p_buckets[i];
				END IF;
			ELSIF bl IS NULL THEN
				INSERT INTO executor.limit_bucket (tenant, bucket, lapses, amounts) VALUES (p_tenant, p_buckets[i], nl, na);
			ELSIF nl IS DISTINCT FROM bl OR na IS DISTINCT FROM ba THEN
				UPDATE executor.limit_bucket b SET lapses = nl, amounts = na
					WHERE b.tenant = p_tenant AND b.bucket = p_buckets[i];
			END IF;
			IF lapse IS NOT NULL THEN
				rb := rb || p_buckets[i];
				ra := ra || p_amounts[i];
				rl := rl || lapse;
			END IF;
		END IF;
		o_used := least(used[i], 9223372036854775807)::bigint;
		o_fits := used[i] + p_amounts[i] <= p_maxes[i];
		o_now := p_t;
		o_lapse := lapse;
		o_amounts := NULL;
		o_lapses := NULL;
		IF NOT o_fits AND p_amounts[i] <= p_maxes[i] THEN
			bl := NULL;
			SELECT b.lapses, b.amounts INTO bl, ba FROM executor.limit_bucket b
				WHERE b.tenant = p_tenant AND b.bucket = p_buckets[i];
			o_amounts := '{}';
			o_lapses := '{}';
			FOR j IN 1 .. coalesce(cardinality(bl), 0) LOOP
				IF bl[j] > tu AND bl[j] <> coalesce(lapse, -1) THEN
					o_lapses := o_lapses || bl[j];
					o_amounts := o_amounts || ba[j];
				ELSIF bl[j] = lapse AND ba[j] > p_amounts[i] THEN
					-- A forced spend shares its entry with others': theirs count.
					o_lapses := o_lapses || bl[j];
					o_amounts := o_amounts || (ba[j] - p_amounts[i]);
				END IF;
			END LOOP;
		END IF;
		RETURN NEXT;
	END LOOP;
	IF p_user IS NOT NULL AND cardinality(rb) > 0 THEN
		UPDATE executor.idempotency i SET
			spent_buckets = coalesce(i.spent_buckets, '{}') || rb,
			spent_amounts = coalesce(i.spent_amounts, '{}') || ra,
			spent_lapses = coalesce(i.spent_lapses, '{}') || rl
		WHERE i.tenant = p_tenant AND i.user_id = p_user AND i.command = p_command AND i.key = p_key;
	END IF;
END
$fn$;

-- limit_reserve_spend is ReserveSpending in one statement: it takes the buckets' locks, claims
-- the idempotency key as sqlReserve does (a new record, or one that expired), and only when it
-- did, decides and records the spend as limit_spend_apply does, noting what it recorded on the
-- key's record. It returns one row per item, o_won true, when it claimed the key; one row with
-- o_won false and nothing else when it did not (the caller reads the record).
CREATE FUNCTION limit_reserve_spend(
	p_tenant text, p_user text, p_command text, p_key text, p_digest text,
	p_now timestamptz, p_expires timestamptz, p_invocation text, p_lease timestamptz,
	p_buckets text[], p_amounts bigint[], p_maxes bigint[], p_windows bigint[], p_force boolean)
RETURNS TABLE (o_won boolean, o_used bigint, o_fits boolean, o_now timestamptz, o_lapse bigint, o_amounts bigint[], o_lapses bigint[])
LANGUAGE plpgsql AS $fn$
DECLARE
	won boolean := false;
BEGIN
	PERFORM executor.limit_lock(p_tenant, p_buckets);
	INSERT INTO executor.idempotency AS i
		(tenant, user_id, command, key, digest, state, reserved_at, expires_at, invocation_id, lease_until)
	VALUES (p_tenant, p_user, p_command, p_key, p_digest, 'in_flight', p_now, p_expires, p_invocation, p_lease)
	ON CONFLICT (tenant, user_id, command, key) DO UPDATE SET
		digest = EXCLUDED.digest, state = 'in_flight',
		reserved_at = EXCLUDED.reserved_at, expires_at = EXCLUDED.expires_at,
		finished_at = NULL, invocation_id = EXCLUDED.invocation_id, lease_until = EXCLUDED.lease_until,
		output = NULL, status = NULL, audit_id = NULL,
		spent_buckets = NULL, spent_amounts = NULL, spent_lapses = NULL
	WHERE i.expires_at <= EXCLUDED.reserved_at
	RETURNING true INTO won;
	IF NOT coalesce(won, false) THEN
		o_won := false;
		RETURN NEXT;
		RETURN;
	END IF;
	RETURN QUERY SELECT true, a.o_used, a.o_fits, a.o_now, a.o_lapse, a.o_amounts, a.o_lapses
		FROM executor.limit_spend_apply(p_tenant, clock_timestamp(), p_buckets, p_amounts, p_maxes, p_windows,
			p_force, false, p_user, p_command, p_key) AS a;
END
$fn$;

-- limit_spend_one is Spend and ReserveSpending of a single item (every call of a command with
-- one limit, the usual case) in one function and as few statements as it takes: the bucket's
-- lock, one read of its row, the key's claim (p_claim, with the receipt in the claimed row) or
-- the receipt appended to the key's record (p_user without p_claim), and one write of the
-- bucket's row. limit_spend_apply decides the same way; this one only saves the work of the
-- general case (nested calls, result sets, a second read). It returns o_won false and nothing
-- else when p_claim did not claim the key; otherwise what limit_spend_apply returns for its item,
-- with the bucket's live entries before the call for RetryAfter.
CREATE FUNCTION limit_spend_one(
	p_tenant text, p_bucket text, p_amount bigint, p_max bigint, p_window bigint, p_force boolean, p_dry boolean,
	p_claim boolean, p_user text, p_command text, p_key text, p_digest text,
	p_now timestamptz, p_expires timestamptz, p_invocation text, p_lease timestamptz,
	OUT o_won boolean, OUT o_used bigint, OUT o_fits boolean, OUT o_now timestamptz, OUT o_lapse bigint,
	OUT o_amounts bigint[], OUT o_lapses bigint[])
LANGUAGE plpgsql AS $fn$
DECLARE
	m      record;
	t      timestamptz;
	tu     bigint;
	bl     bigint[];
	ba     bigint[];
	nl     bigint[] := '{}';
	na     bigint[] := '{}';
	u      numeric := 0;
	live   int := 0;
	rec    boolean;
	lapse  bigint;
BEGIN
	PERFORM pg_advisory_xact_lock(hashtextextended(length(p_tenant) || ':' || p_tenant || p_bucket, 7350010));
	t := clock_timestamp();
	tu := executor.limit_micros(t);
	SELECT b.lapses, b.amounts INTO bl, ba FROM executor.limit_bucket b WHERE b.tenant = p_tenant AND b.bucket = p_bucket;
	FOR j IN 1 .. coalesce(cardinality(bl), 0) LOOP
		IF bl[j] > tu THEN
			u := u + ba[j];
			live := live + 1;
		END IF;
	END LOOP;
	o_now := t;
	o_used := least(u, 9223372036854775807)::bigint;
	o_fits := u + p_amount <= p_max;
	rec := NOT p_dry AND p_amount > 0 AND (o_fits OR p_force);
	IF rec THEN
		lapse := executor.limit_lapse(tu, p_window);
	END IF;
	IF p_claim THEN
		INSERT INTO executor.idempotency AS i
			(tenant, user_id, command, key, digest, state, reserved_at, expires_at, invocation_id, lease_until,
			 spent_buckets, spent_amounts, spent_lapses)
		VALUES (p_tenant, p_user, p_command, p_key, p_digest, 'in_flight', p_now, p_expires, p_invocation, p_lease,
			CASE WHEN rec THEN ARRAY[p_bucket] END, CASE WHEN rec THEN ARRAY[p_amount] END, CASE WHEN rec THEN ARRAY[lapse] END)
		ON CONFLICT (tenant, user_id, command, key) DO UPDATE SET
			digest = EXCLUDED.digest, state = 'in_flight',
			reserved_at = EXCLUDED.reserved_at, expires_at = EXCLUDED.expires_at,
			finished_at = NULL, invocation_id = EXCLUDED.invocation_id, lease_until = EXCLUDED.lease_until,
			output = NULL, status = NULL, audit_id = NULL,
			spent_buckets = EXCLUDED.spent_buckets, spent_amounts = EXCLUDED.spent_amounts, spent_lapses = EXCLUDED.spent_lapses
		WHERE i.expires_at <= EXCLUDED.reserved_at
		RETURNING true INTO o_won;
		IF NOT coalesce(o_won, false) THEN
			o_won := false;
			o_used := NULL;
			o_fits := NULL;
			o_now := NULL;
			RETURN;
		END IF;
	ELSE
		o_won := true;
		IF rec AND p_user IS NOT NULL THEN
			UPDATE executor.idempotency i SET
				spent_buckets = coalesce(i.spent_buckets, '{}') || p_bucket,
				spent_amounts = coalesce(i.spent_amounts, '{}') || p_amount,
				spent_lapses = coalesce(i.spent_lapses, '{}') || lapse
			WHERE i.tenant = p_tenant AND i.user_id = p_user AND i.command = p_command AND i.key = p_key;
		END IF;
	END IF;
	IF NOT o_fits AND p_amount <= p_max THEN
		o_amounts := '{}';
		o_lapses := '{}';
		FOR j IN 1 .. coalesce(cardinality(bl), 0) LOOP
			IF bl[j] > tu THEN
				o_lapses := o_lapses || bl[j];
				o_amounts := o_amounts || ba[j];
			END IF;
		END LOOP;
	END IF;
	IF rec THEN
		o_lapse := lapse;
		m := executor.limit_add(bl, ba, tu, lapse, p_amount);
		nl := m.o_lapses;
		na := m.o_amounts;
		IF bl IS NULL THEN
			INSERT INTO executor.limit_bucket (tenant, bucket, lapses, amounts) VALUES (p_tenant, p_bucket, nl, na);
		ELSE
			UPDATE executor.limit_bucket b SET lapses = nl, amounts = na WHERE b.tenant = p_tenant AND b.bucket = p_bucket;
		END IF;
	ELSIF NOT p_dry AND bl IS NOT NULL AND live < cardinality(bl) THEN
		-- Nothing recorded, but lapsed entries met: dropped, as a write would.
		IF live = 0 THEN
			DELETE FROM executor.limit_bucket b WHERE b.tenant = p_tenant AND b.bucket = p_bucket;
		ELSE
			m := executor.limit_add(bl, ba, tu, 0, 0);
			nl := m.o_lapses;
			na := m.o_amounts;
			UPDATE executor.limit_bucket b SET lapses = nl, amounts = na WHERE b.tenant = p_tenant AND b.bucket = p_bucket;
		END IF;
	END IF;
END
$fn$;

-- limit_refund gives back a receipt in p_tenant (Store.Refund, Reclaim): under the buckets'
-- locks, each amount comes off its bucket's entry for its instant, never below zero, when that
-- entry still counts at the database's clock; the buckets' lapsed entries are dropped with it.
CREATE FUNCTION limit_refund(p_tenant text, p_buckets text[], p_amounts bigint[], p_lapses bigint[]) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
	tu bigint := executor.limit_micros(clock_timestamp());
	bl bigint[];
	ba bigint[];
	nl bigint[];
	na bigint[];
	a  bigint;
BEGIN
	PERFORM executor.limit_lock(p_tenant, p_buckets);
	FOR i IN 1 .. coalesce(array_length(p_buckets, 1), 0) LOOP
		bl := NULL;
		SELECT b.lapses, b.amounts INTO bl, ba FROM executor.limit_bucket b
			WHERE b.tenant = p_tenant AND b.bucket = p_buckets[i];
		CONTINUE WHEN bl IS NULL;
		nl := '{}';
		na := '{}';
		FOR j IN 1 .. cardinality(bl) LOOP
			CONTINUE WHEN bl[j] <= tu;
			a := ba[j];
			IF bl[j] = p_lapses[i] THEN
				a := greatest(a - p_amounts[i], 0);
			END IF;
			IF a > 0 THEN
				nl := nl || bl[j];
				na := na || a;
			END IF;
		END LOOP;
		IF cardinality(nl) = 0 THEN
			DELETE FROM executor.limit_bucket b WHERE b.tenant = p_tenant AND b.bucket = p_buckets[i];
		ELSE
			UPDATE executor.limit_bucket b SET lapses = nl, amounts = na
				WHERE b.tenant = p_tenant AND b.bucket = p_buckets[i];
		END IF;
	END LOOP;
END
$fn$;

-- limit_purge drops the entries lapsed at p_now of up to p_limit buckets that hold one, under
-- each bucket's lock, deleting a bucket left without a live entry; it returns how many entries
-- it dropped. The buckets are found by a scan (limit_bucket has a row per live bucket, not per
-- spend).
CREATE FUNCTION limit_purge(p_now timestamptz, p_limit int) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
	tu bigint := executor.limit_micros(p_now);
	n  bigint := 0;
	r  record;
	bl bigint[];
	ba bigint[];
	k  int;
BEGIN
	FOR r IN SELECT b.tenant, b.bucket FROM executor.limit_bucket b WHERE b.lapses[1] <= tu LIMIT p_limit LOOP
		PERFORM executor.limit_lock(r.tenant, ARRAY[r.bucket]);
		bl := NULL;
		SELECT b.lapses, b.amounts INTO bl, ba FROM executor.limit_bucket b
			WHERE b.tenant = r.tenant AND b.bucket = r.bucket;
		CONTINUE WHEN bl IS NULL;
		k := 0;
		WHILE k < cardinality(bl) AND bl[k + 1] <= tu LOOP
			k := k + 1;
		END LOOP;
		CONTINUE WHEN k = 0;
		n := n + k;
		IF k = cardinality(bl) THEN
			DELETE FROM executor.limit_bucket b WHERE b.tenant = r.tenant AND b.bucket = r.bucket;
		ELSE
			UPDATE executor.limit_bucket b SET lapses = bl[k + 1:], amounts = ba[k + 1:]
				WHERE b.tenant = r.tenant AND b.bucket = r.bucket;
		END IF;
	END LOOP;
	RETURN n;
END
$fn$;
