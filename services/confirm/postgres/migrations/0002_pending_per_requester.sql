-- How many challenges a requester holds open is read on every Open (the per-requester cap):
-- an index over the pending ones, by requester.
CREATE INDEX challenges_pending_requester ON challenges (tenant, requester_user, requester_agent) WHERE state = 'PENDING';
