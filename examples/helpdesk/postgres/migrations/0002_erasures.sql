-- Receipts of customer erasures (customer.erase). The erased customer's email is not kept
-- here: the tickets that carried it now carry the tombstone 'erased:' || erasure_id.

CREATE TABLE erasures (
	tenant         text COLLATE "C" NOT NULL,
	erasure_id     text COLLATE "C" NOT NULL,
	reason         text        NOT NULL,
	tickets_erased integer     NOT NULL CHECK (tickets_erased >= 0),
	requested_by   text        NOT NULL,
	agent_id       text        NOT NULL,
	invocation_id  text        NOT NULL,
	erased_at      timestamptz NOT NULL,
	PRIMARY KEY (tenant, erasure_id)
);

-- An erasure finds the customer's tickets by email, compared case-insensitively.
CREATE INDEX tickets_by_customer ON tickets (tenant, lower(customer_email));
