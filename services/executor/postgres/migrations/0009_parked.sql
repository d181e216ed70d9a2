-- Parked calls: what schema_validate decided for a call that confirmation_check refused with
-- confirmation.required, kept for its approved call (the same input, sent again with the
-- grant) to resume from instead of decoding, validating, encoding and redacting its arguments
-- again (docs/architecture/confirmation.md, "An approved call resumes"). One row per
-- challenge; dropped when the grant is redeemed, and by Purge once expired (at the challenge's
-- expiry, never more than 24 hours after it was parked). canonical holds the arguments as
-- the caller sent them, sensitive fields included, as the idempotency table's responses do.
-- Runs with search_path = executor (see internal/storage/migrate).
CREATE TABLE parked_call (
	tenant             text        NOT NULL,
	challenge_id       text        NOT NULL,
	command            text        NOT NULL,
	declaration_digest text        NOT NULL,
	input_digest       text        NOT NULL,
	canonical          bytea       NOT NULL,
	arguments          text        NOT NULL,
	withheld           text[]      NOT NULL,
	arguments_digest   text        NOT NULL,
	invocation_digest  text        NOT NULL,
	parked_at          timestamptz NOT NULL,
	expires_at         timestamptz NOT NULL,
	PRIMARY KEY (tenant, challenge_id),
	CHECK (expires_at > parked_at AND expires_at <= parked_at + interval '24 hours')
);

-- Purge deletes expired rows.
CREATE INDEX parked_call_expires ON parked_call (expires_at);
