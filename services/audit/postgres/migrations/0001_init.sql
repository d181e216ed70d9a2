-- The audit trail: append-only rows, one gap-free sequence and hash chain per tenant.
-- Runs with search_path = audit (see internal/storage/migrate).

CREATE TABLE records (
	tenant                text        NOT NULL,
	seq                   bigint      NOT NULL CHECK (seq > 0),
	invocation_id         text        NOT NULL,
	phase                 text        NOT NULL CHECK (phase IN ('intent', 'outcome')),
	time                  timestamptz NOT NULL,
	channel               text        NOT NULL,
	command               text        NOT NULL,
	risk                  text        NOT NULL,
	side_effects          text[]      NOT NULL,
	idempotent            boolean     NOT NULL,
	reversible            boolean     NOT NULL,
	subject               text        NOT NULL,
	user_id               text        NOT NULL,
	actor_kind            text        NOT NULL,
	agent_id              text        NOT NULL,
	model                 text        NOT NULL,
	model_version         text        NOT NULL,
	conversation_id       text        NOT NULL,
	mcp_session_id        text        NOT NULL,
	-- Approval: all four NULL when the call was not approved; approver is set when it was.
	approval_challenge_id text,
	approver              text,
	approval_channel      text,
	approval_decided_at   timestamptz,
	outcome               text        NOT NULL,
	stage                 text        NOT NULL,
	code                  text        NOT NULL,
	message               text        NOT NULL,
	-- json, not jsonb: the text must come back byte for byte, since it is hashed.
	arguments             json,
	arguments_digest      text        NOT NULL,
	result_digest         text        NOT NULL,
	duration_ns           bigint      NOT NULL,
	trace_id              text        NOT NULL,
	manifest_digest       text        NOT NULL,
	prev_hash             bytea       NOT NULL,
	hash                  bytea       NOT NULL,
	PRIMARY KEY (tenant, seq),
	CHECK ((approver IS NULL) = (approval_challenge_id IS NULL))
);

-- Idempotency: one row per (tenant, invocation, phase). The writer checks first; this index is
-- the last line of defence against a concurrent replica. It also serves Get.
CREATE UNIQUE INDEX records_invocation ON records (tenant, invocation_id, phase);

-- Time-range queries ("last quarter") that have no more selective filter.
CREATE INDEX records_time ON records (tenant, time);

-- The compliance question: which high-risk commands ran, by whom, touching what, approved by
-- whom, in a time range. High-risk outcomes are a small part of the trail, so a partial index on
-- them is small and cheap to maintain; the planner bitmap-scans it by time range and filters
-- actor kind and side effects on the few rows it yields (see BenchmarkComplianceQuery).
CREATE INDEX records_high_risk ON records (tenant, time)
	WHERE risk IN ('L3', 'L4') AND phase = 'outcome';

-- "What did this agent do", "what happened in this conversation", "what did this approver
-- approve": newest first within the key.
CREATE INDEX records_agent ON records (tenant, agent_id, seq) WHERE agent_id <> '';
CREATE INDEX records_conversation ON records (tenant, conversation_id, seq) WHERE conversation_id <> '';
CREATE INDEX records_approver ON records (tenant, approver, seq) WHERE approver IS NOT NULL;

-- The chain head of each tenant, kept apart from the rows: the last row's seq and hash. Appends
-- lock it FOR UPDATE, which serialises appends per tenant across replicas; Verify compares it
-- with the last row, which catches deletion of the newest rows.
CREATE TABLE heads (
	tenant text   PRIMARY KEY,
	seq    bigint NOT NULL CHECK (seq >= 0),
	hash   bytea  NOT NULL
);

-- move_heads advances chain heads from the head the writer chained its rows onto (old_seqs,
-- old_hashes) to the new last rows. It first locks the heads FOR UPDATE in tenant order, which
-- waits for any transaction that holds them and then yields their latest committed version
-- (a plain UPDATE ... WHERE seq = old would test the version in its snapshot and skip the row
-- without waiting). It fails with serialization_failure (40001, "retry") unless every head is
-- exactly where the writer chained onto — seq AND hash: another writer may have appended rows
-- up to the same seq with different content. Holding these row locks until commit is what
-- serialises appends per tenant across processes.
CREATE FUNCTION move_heads(tenants text[], old_seqs bigint[], old_hashes bytea[], new_seqs bigint[], new_hashes bytea[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	h record;
	locked int := 0;
BEGIN
	FOR h IN
		SELECT heads.seq, heads.hash, u.old_seq, u.old_hash
		  FROM audit.heads
		  JOIN unnest(tenants, old_seqs, old_hashes) AS u(tenant, old_seq, old_hash) ON heads.tenant = u.tenant
		 ORDER BY heads.tenant
		   FOR UPDATE OF heads
	LOOP
		IF h.seq <> h.old_seq OR h.hash <> h.old_hash THEN
			RAISE EXCEPTION 'audit chain head moved concurrently' USING ERRCODE = 'serialization_failure';
		END IF;
		locked := locked + 1;
	END LOOP;
	IF locked <> cardinality(tenants) THEN
		RAISE EXCEPTION 'audit chain head missing' USING ERRCODE = 'serialization_failure';
	END IF;
	UPDATE audit.heads SET seq = u.new_seq, hash = u.new_hash
	  FROM unnest(tenants, new_seqs, new_hashes) AS u(tenant, new_seq, new_hash)
	 WHERE heads.tenant = u.tenant;
END
$$;

-- Intents that have no outcome yet, so that reconciliation reads a small table instead of
-- anti-joining the whole trail. Maintained in the append transaction.
CREATE TABLE pending (
	tenant        text        NOT NULL,
	invocation_id text        NOT NULL,
	seq           bigint      NOT NULL,
	time          timestamptz NOT NULL,
	PRIMARY KEY (tenant, invocation_id)
);
CREATE INDEX pending_time ON pending (time);

-- Append-only: rows cannot be changed or removed through SQL. This stops mistakes, not a
-- superuser (who can disable the trigger); the hash chain is what detects that.
CREATE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'audit records are append-only' USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER records_append_only BEFORE UPDATE OR DELETE ON records
	FOR EACH ROW EXECUTE FUNCTION refuse_change();
CREATE TRIGGER records_no_truncate BEFORE TRUNCATE ON records
	FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();
