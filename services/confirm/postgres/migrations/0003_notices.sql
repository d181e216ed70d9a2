-- Notices: the outbox of the webhook relay, one row per challenge opened, decided or expired,
-- written in the same transaction as the change it reports and dropped once delivered.
-- Runs with search_path = confirm.

CREATE TABLE notices (
	id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	kind         text        NOT NULL CHECK (kind IN ('challenge.opened', 'challenge.decided', 'challenge.expired')),
	tenant       text        NOT NULL,
	challenge_id text        NOT NULL REFERENCES challenges (id) ON DELETE CASCADE,
	-- When it happened: the challenge's created_at, decided_at or expires_at.
	at           timestamptz NOT NULL,
	-- Failed delivery attempts so far.
	attempts     integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
	-- The next attempt: due at or after it. A claim moves it a lease ahead, a failure a backoff.
	next_at      timestamptz NOT NULL,
	-- Why the last attempt failed or why delivery was given up (confirm.MaxNoticeReason bytes at most).
	reason       text        NOT NULL DEFAULT '' CHECK (octet_length(reason) <= 500),
	-- Given-up notices are kept for an operator and never claimed again.
	given_up     boolean     NOT NULL DEFAULT false,
	-- Each kind happens to a challenge once; the index also serves the foreign key.
	UNIQUE (challenge_id, kind)
);

-- Claiming reads the due notices by next_at.
CREATE INDEX notices_due ON notices (next_at) WHERE NOT given_up;

-- Expiry is no write, so the expired notice is recorded by a sweep (ExpireDue), once per
-- challenge: this flag, set in the statement that records the notice, outlives the notice,
-- which is dropped once delivered.
ALTER TABLE challenges ADD COLUMN expiry_noticed boolean NOT NULL DEFAULT false;

-- Challenges that expired before notices existed are not announced now.
UPDATE challenges SET expiry_noticed = true WHERE state = 'PENDING' AND expires_at <= now();

-- The sweep's work: pending challenges without an expired notice, by expiry. Rows leave the
-- index when decided or noticed, so it holds only the open ones.
CREATE INDEX challenges_expiry_due ON challenges (expires_at) WHERE state = 'PENDING' AND NOT expiry_noticed;
