// Package memory is the in-memory audit Store: the embedded default of mandate dev and the
// reference the Postgres store is held to by the conformance suite (services/audit/audittest).
// Each tenant's rows live in a ring indexed by Seq, with the chain head kept beside them; an
// AppendBatch checks and chains the whole batch under one lock and publishes it only when
// every record is in, so it is atomic like a transaction. Rows are deep-copied in and out, so
// callers cannot alter what the store holds; AppendBatch returns a new row as the caller's own
// record (sharing its slices, as the Postgres store does) with fresh copies of the hashes,
// which saves copying every record twice. Watch wakes readers in-process.
//
// With Options.MaxRows the store keeps only each tenant's newest rows (mandate dev keeps
// 50,000 per tenant by default, --audit-retain). Past the bound every new row evicts the
// tenant's oldest, so memory stays flat under sustained load. What holds after eviction:
//
//   - Seq keeps counting; evicted numbers are never reused, and the chain goes on from the
//     head as before.
//   - Verify walks the kept rows only: it starts at the oldest kept row and trusts the
//     PrevHash that row was chained with (a row's Hash covers its PrevHash, so that cannot be
//     edited unnoticed), then checks every link up to the head. Report.Rows counts the rows
//     walked, Report.Head is the real head.
//   - Query, Get and Watch see the kept rows. A Watch from an evicted Seq starts at the
//     oldest kept row, like the executor's Events after a purge; a reader that falls further
//     behind than the bound skips the rows evicted meanwhile.
//   - An append of a kept row's (Tenant, InvocationID, Phase) still returns the stored row; an
//     evicted row's key is forgotten and would be appended anew.
//   - Reconciliation loses nothing: an intent still without an outcome, and an unknown
//     outcome still without a resolution, are held aside when they leave the window. They stay
//     listed by PendingIntents and UnresolvedUnknowns, answer Get and dedupe their retries
//     until their outcome (or resolution) arrives; then they go. Their number follows the
//     calls still open or unsettled, not the load: a call's outcome normally follows its
//     intent at once.
package memory
