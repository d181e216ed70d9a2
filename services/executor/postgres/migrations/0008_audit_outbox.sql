-- audit_spool is the executor's outbox of audit rows: every intent is inserted here before its
-- call is dispatched (and every dispatched call's outcome after the reply), and the relay
-- (FlushSpool) appends the rows to the audit trail, oldest first, and deletes them. The
-- reconciler asks which of a tenant's invocations still have a row here (Store.Spooling), so
-- that it never takes an intent whose outcome is on its way for a lost one.
CREATE INDEX audit_spool_invocation ON audit_spool (tenant, invocation_id);
