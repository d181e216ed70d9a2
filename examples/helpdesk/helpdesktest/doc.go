// Package helpdesktest is the conformance suite of helpdesk.Store: one set of tests, run by
// examples/helpdesk/memory and examples/helpdesk/postgres against their own store, that pins
// down what the domain relies on — round trips without loss, tenant isolation, search order
// and keyset pagination, all-or-nothing transactions (also on panic), row locks that keep
// concurrent read-modify-write transactions from losing updates, per-tenant id sequences, and
// idempotency keys claimed exactly once under concurrency.
package helpdesktest
