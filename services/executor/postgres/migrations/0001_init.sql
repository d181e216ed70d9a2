-- The executor's state: idempotency records, the history of executed commands that separation
-- of duties is checked against, and the per-tenant outbox of domain events.
-- Runs with search_path = executor (see internal/storage/migrate).

-- One row per idempotency key, scoped Stripe-style by tenant, user and command. Reserve inserts
-- it in_flight (or replaces an expired one in the same statement); Finish completes it with the
-- response to replay; Release deletes it while in flight. A record expires ttl after it was
-- reserved, whatever its state. Responses are bytea so that they replay byte for byte.
CREATE TABLE idempotency (
	tenant        text        NOT NULL,
	user_id       text        NOT NULL,
	command       text        NOT NULL,
	key           text        NOT NULL,
	digest        text        NOT NULL,
	state         text        NOT NULL CHECK (state IN ('in_flight', 'finished')),
	reserved_at   timestamptz NOT NULL,
	expires_at    timestamptz NOT NULL,
	finished_at   timestamptz,
	invocation_id text,
	output        bytea,
	status        bytea,
	audit_id      text,
	PRIMARY KEY (tenant, user_id, command, key),
	CHECK (expires_at > reserved_at),
	CHECK ((state = 'finished') = (finished_at IS NOT NULL))
);

-- PurgeExpired deletes by expiry.
CREATE INDEX idempotency_expires ON idempotency (expires_at);

-- Successful runs of commands with a subject. One per invocation, so a repeated Finish adds
-- nothing.
CREATE TABLE executions (
	tenant        text        NOT NULL,
	invocation_id text        NOT NULL,
	user_id       text        NOT NULL,
	command       text        NOT NULL,
	subject       text        NOT NULL,
	time          timestamptz NOT NULL,
	PRIMARY KEY (tenant, invocation_id)
);

-- The separation-of-duties question: did this user run one of these commands on this subject?
CREATE INDEX executions_sod ON executions (tenant, user_id, subject, command);

-- The outbox: domain events of successful commands, numbered per tenant without gaps.
CREATE TABLE events (
	tenant        text        NOT NULL,
	seq           bigint      NOT NULL CHECK (seq > 0),
	invocation_id text        NOT NULL,
	command       text        NOT NULL,
	subject       text        NOT NULL,
	user_id       text        NOT NULL,
	agent_id      text        NOT NULL,
	result        bytea,
	time          timestamptz NOT NULL,
	-- Also the index of Events: WHERE tenant = $1 AND seq > $2 ORDER BY seq.
	PRIMARY KEY (tenant, seq)
);

-- One event per invocation, so a repeated Finish publishes nothing twice.
CREATE UNIQUE INDEX events_invocation ON events (tenant, invocation_id);

-- Each tenant's last assigned seq. Finish locks the row while it appends, which serialises
-- appends per tenant across replicas and keeps seq gap-free: a rolled-back Finish rolls its
-- increment back with it.
CREATE TABLE event_heads (
	tenant text   PRIMARY KEY,
	seq    bigint NOT NULL CHECK (seq >= 0)
);
