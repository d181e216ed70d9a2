// Package memory is the in-memory helpdesk Store: the embedded default of `mandate dev` and
// of unit tests, held to the same conformance suite (examples/helpdesk/helpdesktest) as the
// Postgres store. One lock guards everything: a transaction holds it exclusively from start to
// end, which makes every transaction serializable and gives ...ForUpdate its meaning for free;
// reads outside a transaction share it. A transaction writes in place and keeps an undo log,
// replayed when its callback fails, so a failed transaction leaves nothing behind. Records are
// deep-copied in and out, so callers cannot alter what the store holds.
package memory
