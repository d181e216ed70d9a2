-- A check (ExecutorService.Check: a call judged, never run) leaves a row of its own, phase
-- 'check', chained like every other; its outcome is the verdict.
ALTER TABLE records DROP CONSTRAINT records_phase_check;
ALTER TABLE records ADD CONSTRAINT records_phase_check CHECK (phase IN ('intent', 'outcome', 'resolution', 'check'));
