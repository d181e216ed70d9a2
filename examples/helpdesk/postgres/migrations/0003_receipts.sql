-- Effect receipts (github.com/mandate-dev/mandate/pkg/receipt): one row per invocation, written
-- in the transaction of its effect (executed), or by GetReceipt when there was none (not_executed,
-- a fence). Copy this file into a numbered migration of the backend's schema; it runs with
-- search_path set to that schema, and receipt.NewPostgres(schema) reads and writes the table.
CREATE TABLE receipts (
	invocation_id text COLLATE "C" PRIMARY KEY
		CHECK (invocation_id <> '' AND octet_length(invocation_id) <= 128),
	state         text        NOT NULL CHECK (state IN ('executed', 'not_executed')),
	-- The gRPC full method and its binary protobuf response; '' and empty when not executed.
	method        text        NOT NULL,
	result        bytea       NOT NULL,
	recorded_at   timestamptz NOT NULL,
	CONSTRAINT receipts_method_iff_executed CHECK ((state = 'executed') = (method <> ''))
);

-- Receipts are kept for as long as the executor may ask; a purge deletes old ones by time.
CREATE INDEX receipts_by_time ON receipts (recorded_at);
