-- Audit rows the trail refused outright (not for being unavailable) after the executor had
-- tried them repeatedly: kept here instead of being dropped, listed and re-driven by an
-- operator through ExecutorService.ListDeadLetters / RedriveDeadLetters (`mandate audit
-- dead-letters`), which move them back to audit_spool.
CREATE TABLE audit_dead_letter (
	id            bigserial   PRIMARY KEY,
	tenant        text        NOT NULL,
	invocation_id text        NOT NULL,
	record        bytea       NOT NULL,
	spooled_at    timestamptz NOT NULL,
	dead_at       timestamptz NOT NULL,
	reason        text        NOT NULL
);

CREATE INDEX audit_dead_letter_tenant ON audit_dead_letter (tenant, id);
