-- Appends whose statements keep their cached plans.
--
-- move_heads, rewritten so that it needs no custom plan: one primary-key probe per tenant, in
-- tenant order, instead of a join of the heads with the arrays. A join's plan depends on the
-- size of heads, so appends planned it afresh on every call (plan_cache_mode =
-- force_custom_plan); a probe by key is the same plan at any size, so its cached plan serves
-- every append. Same signature and contract as before: lock each head FOR UPDATE (waiting for
-- a transaction that holds it, then seeing its latest committed version), fail with
-- serialization_failure (40001) unless it is exactly where the writer chained onto, advance it.
-- Heads are locked in tenant order, as the locking path does, so appends never deadlock.
CREATE OR REPLACE FUNCTION move_heads(tenants text[], old_seqs bigint[], old_hashes bytea[], new_seqs bigint[], new_hashes bytea[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	u record;
	cur_seq bigint;
	cur_hash bytea;
BEGIN
	FOR u IN
		SELECT * FROM unnest(tenants, old_seqs, old_hashes, new_seqs, new_hashes)
			AS a(tenant, old_seq, old_hash, new_seq, new_hash)
		 ORDER BY a.tenant
	LOOP
		SELECT heads.seq, heads.hash INTO cur_seq, cur_hash
		  FROM audit.heads WHERE heads.tenant = u.tenant FOR UPDATE;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'audit chain head missing' USING ERRCODE = 'serialization_failure';
		END IF;
		IF cur_seq <> u.old_seq OR cur_hash <> u.old_hash THEN
			RAISE EXCEPTION 'audit chain head moved concurrently' USING ERRCODE = 'serialization_failure';
		END IF;
		UPDATE audit.heads SET seq = u.new_seq, hash = u.new_hash WHERE heads.tenant = u.tenant;
	END LOOP;
END
$$;

-- clear_pending removes the pending entries of the given (tenant, invocation_id) pairs, one
-- primary-key probe each, for the same reason: a DELETE joining pending with the arrays had to be
-- planned on every append (its plan depends on the size of pending), and planning it cost
-- several times more than running it.
CREATE FUNCTION clear_pending(tenants text[], invocation_ids text[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1 .. coalesce(cardinality(tenants), 0) LOOP
		DELETE FROM audit.pending WHERE pending.tenant = tenants[i] AND pending.invocation_id = invocation_ids[i];
	END LOOP;
END
$$;
