// Package postgres is the PostgreSQL confirm Store, SessionStore and
// NoticeStore. Its tables live in the confirm schema and are created by the
// embedded [Migrations]: challenges (one row per challenge, unique per
// tenant and invocation), login_tokens (used one-time sign-in tokens),
// sessions (approval page sessions, keyed by the SHA-256 of the cookie) and
// notices (the webhook relay's outbox).
//
// Every state change is one conditional UPDATE … RETURNING whose WHERE
// clause carries the whole precondition (state, digest, expires_at > now()),
// so of any number of concurrent Decide or Redeem calls on one challenge —
// from any number of replicas — exactly one changes the row; the others are
// then told why by re-reading it. Time is the database's: created_at,
// expires_at and every expiry check use now(), so replicas with skewed
// clocks agree on what has expired.
//
// Notices are written by the statement that makes the change they report
// (a data-modifying WITH), so a challenge is never opened or decided without
// its notice. ExpireDue and ClaimNotices each lock their rows with FOR
// UPDATE SKIP LOCKED and write them in the same statement: concurrent
// callers in any number of replicas take disjoint rows without waiting for
// one another. A challenge's expiry_noticed flag, not the notice (dropped
// once delivered), makes its expired notice once-only.
//
// A trigger sends NOTIFY mandate_confirm with the challenge id whenever a
// challenge's state changes. Watch listens on a dedicated connection shared
// by all watchers of the Store (started with the first, stopped with the
// last), re-reads the challenge when its id is announced, when its expiry is
// due, and every WatchPoll as a safety net for notifications lost while the
// listener reconnects.
package postgres
