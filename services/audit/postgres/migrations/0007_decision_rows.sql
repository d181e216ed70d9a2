-- Every attempt to decide a confirmation challenge (approve or decline, accepted or refused)
-- leaves a row of its own, phase 'decision', appended by the confirm service and chained like
-- every other; its outcome is approved, declined or refused.
ALTER TABLE records DROP CONSTRAINT records_phase_check;
ALTER TABLE records ADD CONSTRAINT records_phase_check CHECK (phase IN ('intent', 'outcome', 'resolution', 'check', 'decision'));
