-- Human confirmations: challenges and their grants, and the approval page's
-- one-time sign-in tokens and sessions. Runs with search_path = confirm.

CREATE TABLE challenges (
	id                  text        PRIMARY KEY,
	tenant              text        NOT NULL,
	command             text        NOT NULL,
	risk                text        NOT NULL,
	invocation_digest   text        NOT NULL CHECK (invocation_digest ~ '^[0-9a-f]{64}$'),
	invocation_id       text        NOT NULL,
	requester_user      text        NOT NULL,
	requester_agent     text        NOT NULL,
	approver_kind       text        NOT NULL CHECK (approver_kind IN ('REQUESTING_USER', 'PERMISSION_HOLDER')),
	approver_permission text        NOT NULL,
	prompt              jsonb       NOT NULL,
	-- EXPIRED is never stored: PENDING and APPROVED read as EXPIRED once expires_at has passed.
	state               text        NOT NULL CHECK (state IN ('PENDING', 'APPROVED', 'DECLINED', 'REDEEMED')),
	created_at          timestamptz NOT NULL,
	expires_at          timestamptz NOT NULL CHECK (expires_at > created_at),
	decided_by          text,
	decided_at          timestamptz,
	decision_channel    text,
	redeemed_at         timestamptz,
	UNIQUE (tenant, invocation_id),
	-- Every decision records who made it, when and where; only approved grants are redeemed.
	CONSTRAINT decision_recorded CHECK (
		(state = 'PENDING') = (decided_by IS NULL)
		AND (decided_by IS NULL) = (decided_at IS NULL)
		AND (decided_by IS NULL) = (decision_channel IS NULL)
		AND decided_by <> ''
	),
	CONSTRAINT redemption_recorded CHECK ((state = 'REDEEMED') = (redeemed_at IS NOT NULL))
);

CREATE INDEX challenges_pending ON challenges (tenant, created_at DESC) WHERE state = 'PENDING';

-- Every change wakes the watchers of the challenge, in this process and in every other replica.
CREATE FUNCTION notify_challenge() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('mandate_confirm', NEW.id);
	RETURN NULL;
END
$$;

CREATE TRIGGER challenges_notify AFTER UPDATE ON challenges
	FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
	EXECUTE FUNCTION notify_challenge();

-- Used one-time sign-in tokens, kept until they could no longer verify anyway.
CREATE TABLE login_tokens (
	jti        text        PRIMARY KEY,
	expires_at timestamptz NOT NULL
);

CREATE INDEX login_tokens_expiry ON login_tokens (expires_at);

-- Approval page sessions; the cookie value itself is never stored, only its SHA-256.
CREATE TABLE sessions (
	id_hash    text        PRIMARY KEY,
	tenant     text        NOT NULL,
	user_id    text        NOT NULL,
	csrf_token text        NOT NULL,
	created_at timestamptz NOT NULL,
	expires_at timestamptz NOT NULL
);

CREATE INDEX sessions_expiry ON sessions (expires_at);
