// Package outbox takes the executor's domain events out of the building. A [Relay] reads each
// tenant's outbox (executor.Store) after its delivery cursor, in commit order, publishes every
// event to NATS JetStream as a CloudEvents 1.0 structured JSON message on the subject
// <prefix>.<tenant>.<command> with the invocation id as both the CloudEvent id and the
// Nats-Msg-Id, and moves the cursor once the stream acknowledged it. Delivery is at least once:
// a relay that dies between the ack and the cursor, or two relays on one database, publish an
// event twice, and JetStream's duplicate window drops the second copy, so consumers see each
// event once within that window (and de-duplicate on the id beyond it).
//
// The broker is optional and never on a call's path: commands commit their event to the store
// whatever the broker does, and the relay retries with backoff until the broker is back, then
// catches up in order. A [Purger] bounds the store's tables on a ticker, and [Tail] follows a
// tenant's events with an ephemeral ordered consumer.
//
// Subjects: the command's dots are kept as subject tokens (mandate.acme.ticket.refund), so
// consumers can filter by domain (mandate.acme.ticket.>). Characters a NATS token cannot hold
// ('.', '*', '>', whitespace, controls, non-ASCII) and '%' itself are percent-encoded in the
// tenant token and in each command token, so distinct tenants never share a subject.
package outbox
