// Package postgres is the PostgreSQL audit Store. Its tables live in the audit schema and are
// created by the embedded [Migrations]: records (the rows; primary key (tenant, seq), unique
// (tenant, invocation_id, phase)), heads (each tenant's chain head) and pending (intents
// without outcome, for reconciliation). A trigger refuses UPDATE, DELETE and TRUNCATE on
// records; the hash chain, checked by Verify, is what detects changes made around it.
//
// AppendBatch runs one transaction: it locks the heads of the batch's tenants FOR UPDATE (in
// tenant order, so replicas never deadlock and appends to one tenant are serialised across
// processes), reads the rows the batch's keys already have, chains the new rows onto the heads
// in Go, writes them with COPY, moves the heads, maintains pending and sends NOTIFY
// mandate_audit with each tenant that got rows, all before COMMIT. A unique violation (a
// writer that does not take the head lock got in first) re-runs the transaction. Statements
// inside the transaction are pipelined, so a batch costs five round trips whatever its size.
//
// Watch tails a tenant by Seq: it reads new rows whenever a notification for the tenant
// arrives (on a dedicated LISTEN connection shared by all watchers of the Store, started with
// the first and stopped with the last), when this Store itself committed rows for it, and
// every WatchPoll as a safety net for notifications lost while the listener reconnects.
package postgres
