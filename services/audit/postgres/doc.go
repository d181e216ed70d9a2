// Package postgres is the PostgreSQL audit Store. Its tables live in the audit schema and are
// created by the embedded [Migrations]: records (the rows; primary key (tenant, seq), unique
// (tenant, invocation_id, phase)), heads (each tenant's chain head: seq and hash of its last
// row), and pending (intents without outcome, for reconciliation). A trigger refuses UPDATE,
// DELETE and TRUNCATE on records; the hash chain, checked by Verify, is what detects changes
// made around it.
//
// One AppendBatch is one transaction: the rows (one INSERT from an array per column), the pending
// bookkeeping, and move_heads, a small SQL function that locks the batch's head rows FOR UPDATE
// and advances them only if they are still exactly (seq and hash) where the rows were chained
// onto, failing with SQLSTATE 40001 otherwise. The head row locks serialise appends per tenant
// across replicas. The Store predicts each tenant's head from its own commits, so the common
// append needs no read before it writes; a wrong prediction (another replica appended) or an
// already stored key (a retried append, caught by the unique index) aborts the transaction, and
// the batch is redone on the locking path, which locks the heads first, reads the stored rows of
// the batch's keys and chains only what is new. Both paths lock a tenant's head before writing its
// rows, in tenant order, so replicas never deadlock. The locking path's reads, whose plan depends on
// the trail's size, run with plan_cache_mode = force_custom_plan: a generic plan cached while the
// trail is small would otherwise survive its growth. The fast path's statements keep their cached
// plans: move_heads and clear_pending (small SQL functions) probe heads and pending by key, and
// the INSERTs have no plan to choose. The common append is one round trip: its statements are pipelined
// behind a single Sync, which without BEGIN makes them one implicit transaction.
//
// Watch tails a tenant by Seq: it reads new rows whenever a notification for the tenant
// arrives (NOTIFY mandate_audit, sent after the commit, at most one per Options.AnnounceEvery
// from each Store, so a remote watcher hears of a row up to 20ms late; heard on a dedicated LISTEN
// connection shared by the Store's watchers, started with the first and stopped with the
// last), when this Store itself committed rows for it, and every WatchPoll as a safety net for
// notifications lost while the listener reconnects or a writer crashed between commit and
// NOTIFY.
package postgres
