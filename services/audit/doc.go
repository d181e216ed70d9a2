// Package audit is Mandate's audit trail: the domain types of an audit row ([Record], [Stored]),
// the [Store] interface that the memory and Postgres implementations satisfy, the [Writer] that
// group-commits concurrent appends, the per-tenant hash chain ([ComputeHash], [ChainVerifier]),
// the reconciliation of intents that never got an outcome ([Writer.Reconcile], [Reconciler]) and
// the query types ([Filter], [Page]).
//
// Every command attempt leaves rows here: an intent row before the backend is called and an
// outcome row after it (a call refused before dispatch gets only an outcome row). Rows are
// append-only; each tenant's rows form a gap-free sequence (Seq 1, 2, 3, …) and a hash chain
// (Hash = SHA-256(PrevHash || canonical encoding of the row, Seq included)) whose head is kept
// apart from the rows, so that editing, deleting or truncating rows is detected by Verify. An
// append is idempotent on (Tenant, InvocationID, Phase): retrying returns the row already stored.
//
// The package knows nothing about transports; the gRPC/REST layer maps its errors
// ([ErrInvalid], [ErrUnavailable], [ErrNotFound], [ErrInvalidPageToken], [ErrClosed]) in one
// place.
package audit
