// Package memory is the in-memory audit Store: the embedded default of mandate dev and the
// reference the Postgres store is held to by the conformance suite (services/audit/audittest).
// Each tenant's rows live in a slice indexed by Seq-1, with the chain head kept beside them; an
// AppendBatch checks and chains the whole batch under one lock and publishes it only when
// every record is in, so it is atomic like a transaction. Rows are deep-copied in and out, so
// callers cannot alter what the store holds. Watch wakes readers in-process.
package memory
