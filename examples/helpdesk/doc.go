// Package helpdesk is the sample business backend Mandate is shown and tested with
// (docs/architecture/topology.md): a gRPC server implementing helpdesk.v1.HelpdeskService over
// tenant-scoped tickets, refunds, expense reports and customer erasures. It is an ordinary backend, not part of Mandate: it trusts Mandate's executor
// to authorise, confirm, de-duplicate and audit each call, and only enforces what the business
// itself owns — tenant isolation, state guards (submit only a draft, recall only before
// approval), money invariants (never refund more than was paid, never mix currencies), who
// may act on whose report, and that an erased customer's email leaves every ticket of the tenant
// (replaced by a tombstone naming the erasure, whose receipt never keeps the email).
//
// It is built on Mandate's exported packages only, as a backend outside Mandate's module is:
// pkg/backend for who is calling and how to refuse, pkg/receipt for effect receipts. It serves
// only calls relayed by a Mandate service (a service token calling on behalf of the user; a
// pkg/backend Guard admits only those); a user or an agent calling it directly is refused at
// scope_check with scope.not_via_executor. Refusals are *backend.Error values whose stage and
// code the executor passes on unchanged; the codes are the Code* constants of this package.
//
// Every effectful command (refund, create, submit, recall and approve a report, erase a customer)
// records an effect receipt (pkg/receipt) keyed by the invocation id in the same transaction as
// its effect: a redelivered invocation returns the recorded response without acting again, and
// the backend serves mandate.v1.ReceiptService so that the executor can ask whether an invocation
// ran (a miss fences the id: a later delivery of it is refused with receipt.fenced). Reads need
// no receipt.
//
// Layers, top down: [Backend] (gRPC handlers: decode, call the domain, map the error), the
// domain logic (unexported, transport-free), the [Store] interface with closure transactions
// (implemented by examples/helpdesk/memory and examples/helpdesk/postgres and held to one
// conformance suite, examples/helpdesk/helpdesktest), and the [PaymentGateway] that refunds go
// through; [Gateway] is the in-process fake that counts what it was asked to move so that a test
// can prove that no money moved. [Seed] loads the demo data every declared example runs against.
package helpdesk
