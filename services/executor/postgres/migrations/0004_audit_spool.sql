-- Audit rows the executor could not hand to the audit trail while it was unavailable (the bytes
-- of their JSON encoding): kept here, durably like the outbox, and appended once the trail is
-- back, then deleted. Every attempt leaves its row, however long the audit service is down.
CREATE TABLE audit_spool (
	id            bigserial   PRIMARY KEY,
	tenant        text        NOT NULL,
	invocation_id text        NOT NULL,
	record        bytea       NOT NULL,
	spooled_at    timestamptz NOT NULL
);
