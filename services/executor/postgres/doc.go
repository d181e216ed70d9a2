// Package postgres is the PostgreSQL executor.Store, safe to share between replicas. Its tables
// live in the executor schema and are created by the embedded [Migrations]: idempotency (one
// row per tenant, user, command and key), executions (successful runs, indexed for the
// separation-of-duties question), events (the outbox, primary key (tenant, seq)),
// event_heads (each tenant's last seq) and event_cursors (each tenant's last seq the relay
// delivered).
//
// Reserve is one upsert, INSERT … ON CONFLICT DO UPDATE … WHERE the existing record has
// expired, so claiming a new key and replacing an expired one are both atomic across replicas:
// exactly one of any number of concurrent callers gets the row back. The others read the record
// that won and answer from it (replay, in flight or reused); if it vanished or expired in
// between (a Release, a purge), they try again, a bounded number of times.
//
// Finish is one transaction, sent as one pipelined batch: complete the in-flight record, insert
// the execution, lock the tenant's event head and append the event at head+1. Executions and
// events are unique per invocation, so a Finish retried after a lost commit reply records
// nothing twice and consumes no seq. Locks are always taken in the order idempotency row,
// execution, event head, so concurrent Finishes do not deadlock.
//
// The relay reads the backlog (heads past their cursor), a tenant's events after its cursor in
// seq order, and moves the cursor forward with GREATEST semantics, so replicas relaying at once
// never move it back. Purge deletes expired idempotency records and old delivered events in one
// transaction; executions are kept, since separation of duties is checked against them.
//
// Times come from Options.Now, not from the database, so that expiry is testable with a fake
// clock; replicas' clocks only need to agree to well within the idempotency window.
package postgres
