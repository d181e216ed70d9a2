-- An operator's verdict on an invocation whose outcome is unknown (mandate audit resolve) is a
-- row of its own, phase 'resolution', chained like every other.
ALTER TABLE records DROP CONSTRAINT records_phase_check;
ALTER TABLE records ADD CONSTRAINT records_phase_check CHECK (phase IN ('intent', 'outcome', 'resolution'));
