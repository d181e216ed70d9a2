// Package executortest is the conformance suite for executor.Store implementations. The memory
// and Postgres stores both run it from their tests with [Run], so they are held to the same
// observable behaviour: Stripe-style idempotency (a new key is reserved, a running duplicate is
// refused as in flight, a finished call's response — success or failure — is replayed, a key
// reused with a different input is refused, a released key is free again, an expired key is
// reusable, keys are scoped by tenant, user and command), exactly one winner among 64 concurrent
// reservations of one key, the separation-of-duties history, the per-tenant gap-free event
// outbox, and a Finish that records all of its parts or none and can be repeated safely.
package executortest
