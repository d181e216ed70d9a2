-- A tenant's own ceilings and windows for the limits commands declare, keyed
-- '<command code>/<limit id>': {"max": 10000, "window": "12h0m0s"}, each field optional (absent:
-- the manifest's value), the window a Go duration string. '{}' when the tenant overrides none.
ALTER TABLE tenants ADD COLUMN limits jsonb NOT NULL DEFAULT '{}'
	CHECK (jsonb_typeof(limits) = 'object');
