// Package page serves the approval page: the out-of-band place where a
// human reads a challenge's prompt and approves or declines it, rendered on
// the server and working without JavaScript. The HTML is written by a
// small writer of its own (html.go) that escapes every value as
// html/template would, rather than by html/template, which would keep
// every exported method of the confirm binary alive (see html.go).
//
// Humans sign in with a one-time link (GET /approve/login?t=…) whose token
// is a short-lived HS256 JWT ([LoginURL] mints it; its purpose claim is
// mandate_login, its audience [LoginAudience], and it carries no `sub`, so
// no bearer-token verifier accepts it as a user token). The page redeems
// the token once (its jti is recorded in the SessionStore) and hands out a
// session cookie (random, HttpOnly, SameSite=Strict, Path=/approve) whose
// SHA-256 keys the session in the database, so any replica serves it. Login
// tokens are only minted for users, never for agents, so an agent has no
// way to sign in here.
//
// Every form carries the session's synchronizer CSRF token, checked on
// POST (403 otherwise), together with Origin and Sec-Fetch-Site when the
// browser sends them. Every response carries a strict Content-Security-Policy,
// X-Frame-Options DENY, Referrer-Policy no-referrer and Cache-Control
// no-store. Visitors without a session see a "sign in with your link" page
// (401), never a prompt. Decisions go through confirm.Service like any
// other, so the approver policy applies unchanged, and are recorded with
// the channel approval_page. Sensitive values never appear: they were
// withheld before the challenge was opened.
//
// The trail page (TrailPath, /approve/audit) shows holders of audit.read
// their tenant's audit trail, read from the audit service's API as the
// signed-in user: see trail.go and docs/architecture/audit-chain.md.
package page
