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
