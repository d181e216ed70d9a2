-- For a client-attested approval, the tenant's trust ceiling when the approved call ran
-- ('L0' … 'L4'); NULL for every other row. Rows that carry one are hashed with the v2
-- canonical encoding; every earlier row keeps its v1 hash.
ALTER TABLE records ADD COLUMN approval_trust_ceiling text;
