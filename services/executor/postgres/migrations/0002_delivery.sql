-- Delivery state of the outbox relay, and the indexes purging needs.
-- Runs with search_path = executor (see internal/storage/migrate).

-- Each tenant's relay cursor: the seq of the last event delivered to the broker. Relays deliver
-- a tenant's events in seq order and move the cursor forward only (GREATEST), so a slower
-- replica's report never moves it back. A separate table, not a column of event_heads, so that
-- the relay never waits for (or holds up) the head lock that Finish takes.
CREATE TABLE event_cursors (
	tenant       text        PRIMARY KEY,
	seq          bigint      NOT NULL CHECK (seq >= 0),
	delivered_at timestamptz NOT NULL
);

-- Purge deletes old events by commit time.
CREATE INDEX events_time ON events (time);
