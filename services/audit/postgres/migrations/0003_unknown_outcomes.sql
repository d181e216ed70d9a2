-- The executor settles unknown outcomes from its backends' receipts (resolution rows): find the
-- unknown outcome rows without a scan of the trail.
CREATE INDEX records_unknown ON records (time) WHERE phase = 'outcome' AND outcome = 'unknown';
