-- Retention: a challenge is deleted (its notices with it, by the foreign key) once it expired
-- longer ago than the store's retention (Store.PurgeExpired, postgres.Options.Retain); until then
-- it reads as EXPIRED. The purge reads the oldest expiries first.
-- Runs with search_path = confirm.

CREATE INDEX challenges_expires_at ON challenges (expires_at);
