// Package audittest is the conformance suite for audit.Store implementations. The memory and
// Postgres stores both run it from their tests with [Run], through an audit.Writer, so they are
// held to the same observable behaviour: gap-free per-tenant sequences and hash chains,
// idempotent appends (also under 64 concurrent identical appends), every query filter, stable
// keyset pagination with filter-bound tokens, tenant isolation of Query, Get, Watch and Verify,
// live tails, and reconciliation of intents without outcome.
package audittest
