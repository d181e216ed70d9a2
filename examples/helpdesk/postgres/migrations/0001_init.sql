-- The helpdesk sample domain: tickets, refunds, expense reports, per-tenant id counters and
-- idempotency keys. Every key starts with the tenant: tenants share nothing, not even ids.
-- Runs with search_path = helpdesk (see internal/storage/migrate).

-- Ids and tags use the "C" collation so that ordering and comparison are bytewise, as they are
-- in the in-memory store.
CREATE TABLE tickets (
	tenant         text COLLATE "C" NOT NULL,
	ticket_id      text COLLATE "C" NOT NULL,
	org            text        NOT NULL,
	subject        text        NOT NULL,
	status         text        NOT NULL CHECK (status IN ('open', 'pending', 'closed')),
	customer_email text        NOT NULL,
	-- What was paid; '' and 0 when nothing was. Refunds are in the paid currency.
	paid_currency  text        NOT NULL,
	paid_minor     bigint      NOT NULL CHECK (paid_minor >= 0),
	refunded_minor bigint      NOT NULL CHECK (refunded_minor >= 0),
	tags           text[] COLLATE "C" NOT NULL,
	created_at     timestamptz NOT NULL,
	PRIMARY KEY (tenant, ticket_id),
	-- The invariant the refund logic keeps, enforced once more where the money is booked.
	CONSTRAINT refunded_within_paid CHECK (refunded_minor <= paid_minor)
);

-- Search order: newest first.
CREATE INDEX tickets_search ON tickets (tenant, created_at DESC, ticket_id DESC);

CREATE TABLE refunds (
	tenant        text COLLATE "C" NOT NULL,
	refund_id     text COLLATE "C" NOT NULL,
	ticket_id     text COLLATE "C" NOT NULL,
	currency      text        NOT NULL,
	amount_minor  bigint      NOT NULL CHECK (amount_minor > 0),
	reason        text        NOT NULL,
	status        text        NOT NULL CHECK (status IN ('accepted', 'settled')),
	gateway_ref   text        NOT NULL,
	requested_by  text        NOT NULL,
	agent_id      text        NOT NULL,
	invocation_id text        NOT NULL,
	issued_at     timestamptz NOT NULL,
	PRIMARY KEY (tenant, refund_id),
	FOREIGN KEY (tenant, ticket_id) REFERENCES tickets (tenant, ticket_id)
);

CREATE INDEX refunds_by_ticket ON refunds (tenant, ticket_id, issued_at);

CREATE TABLE expense_reports (
	tenant             text COLLATE "C" NOT NULL,
	report_id          text COLLATE "C" NOT NULL,
	owner              text        NOT NULL,
	owner_org          text        NOT NULL,
	title              text        NOT NULL,
	state              text        NOT NULL CHECK (state IN ('draft', 'submitted', 'approved')),
	-- Lines are value objects, always read and written with their report.
	lines              jsonb       NOT NULL,
	labels             jsonb       NOT NULL,
	payroll_id         text        NOT NULL,
	bank_account_alias text        NOT NULL,
	submitted_by       text        NOT NULL,
	submitted_at       timestamptz,
	submit_note        text        NOT NULL,
	recall_reason      text        NOT NULL,
	approved_by        text        NOT NULL,
	approved_at        timestamptz,
	approval_comment   text        NOT NULL,
	created_at         timestamptz NOT NULL,
	PRIMARY KEY (tenant, report_id)
);

CREATE TABLE sequences (
	tenant text COLLATE "C" NOT NULL,
	name   text COLLATE "C" NOT NULL,
	last   bigint NOT NULL,
	PRIMARY KEY (tenant, name)
);

CREATE TABLE idempotency_keys (
	tenant     text COLLATE "C" NOT NULL,
	user_id    text COLLATE "C" NOT NULL,
	command    text COLLATE "C" NOT NULL,
	key        text COLLATE "C" NOT NULL,
	digest     text        NOT NULL,
	result_id  text        NOT NULL DEFAULT '',
	created_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (tenant, user_id, command, key)
);
