// Package postgres is the PostgreSQL executor.Store, safe to share between replicas. Its tables
// live in the executor schema and are created by the embedded [Migrations]: idempotency (one
// row per tenant, user, command and key), executions (successful runs, indexed for the
// separation-of-duties question), events (the outbox, primary key (tenant, seq)),
// event_heads (each tenant's last seq), event_cursors (each tenant's last seq the relay
// delivered) and limit_spend (what each holder spent against each bucket of a declared limit,
// until it lapses).
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
// Spend is one round trip: a batch of two statements in one implicit transaction. The first
// takes a transaction-scoped advisory lock per bucket (a 64-bit hash of tenant and bucket), in
// key order, so that Spends of several buckets cannot deadlock; the second, whose snapshot is
// taken once the locks are held, sums the other holders' live spends, decides, and upserts the
// holder's rows when everything fits (or is forced). Only an item that does not fit reads its
// bucket's rows, for RetryAfter. Refund deletes the holder's rows; Purge deletes lapsed ones.
//
// Times come from Options.Now, not from the database, so that expiry is testable with a fake
// clock; replicas' clocks only need to agree to well within the idempotency window. Limit
// spends are the exception: their windows can be short, so Spend times them with the database's
// clock (clock_timestamp()), which every replica shares; Purge compares them with its
// PurgePolicy.Now.
package postgres
