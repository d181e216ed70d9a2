-- A tenant's trust ceiling: the highest risk ('L0' … 'L4') up to which an answer given in an
-- app's own window counts as its user's decision ('' = the default, L2).
ALTER TABLE tenants ADD COLUMN trust_ceiling text NOT NULL DEFAULT ''
	CHECK (trust_ceiling IN ('', 'L0', 'L1', 'L2', 'L3', 'L4'));

-- The last time a user or an agent was disabled: every token issued and every approval asked
-- for before it stays void after they are enabled again. Only ever moves forward.
ALTER TABLE users ADD COLUMN revoked_at timestamptz;
ALTER TABLE agents ADD COLUMN revoked_at timestamptz;
