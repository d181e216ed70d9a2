-- Idempotency reservations are leases. Reserve records the invocation that claimed a key and
-- how long its claim holds without an outcome (the call's deadline and a margin); a claim whose
-- lease ran out is abandoned (its executor died), and only the backend's receipt can say
-- whether that invocation ran. NULL: no lease (in flight until expiry).
ALTER TABLE idempotency ADD COLUMN lease_until timestamptz;
