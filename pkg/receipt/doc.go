// Package receipt gives a Go business backend exactly-once effects under Mandate's executor
// (docs/architecture/pipeline.md, "Reconciliation through receipts"). The executor dispatches every command call with an
// invocation id; a backend that uses this package records an effect receipt keyed by that id —
// the gRPC method and the binary response — in the same database transaction as the effect
// itself, so the receipt exists exactly when the effect committed. A redelivery of the same
// invocation (the executor retrying after a lost answer) finds the receipt and gets the recorded
// result back instead of acting again ([Effect], [Replay]). When the executor does not know how a
// dispatch ended, its reconciler asks the backend's mandate.v1.ReceiptService ([Handler]):
// EXECUTED with the result, or NOT_EXECUTED — and on a miss GetReceipt records NOT_EXECUTED in
// the same transaction as it looks (a fence), so a delivery still in flight can never commit its
// effect afterwards ([ErrFenced], refused with receipt.fenced) and the answer stays true.
//
// The store runs inside the backend's own transactions: [Postgres] on a pgx.Tx, whose table the
// backend creates by copying [SchemaSQL] into one of its numbered migrations, and [Memory] for
// in-memory backends and tests; both pass one conformance suite. [FromContext] reads the
// invocation the executor relayed and refuses a call that did not come through a trusted Mandate
// service; the ReceiptService itself answers Mandate services only.
package receipt
