// Package edgelimit bounds what one principal may ask of Mandate at its
// edge — the MCP bridge and the REST gateway — so that an agent that loops
// cannot exhaust the services behind them (docs/architecture/limits.md).
//
// A Limiter keeps a token bucket per key (golang.org/x/time/rate): the key
// of an authenticated principal (Key: tenant, user, agent), or, for a
// request whose credentials do not verify, one of AnonymousShards buckets
// chosen by a hash of the client's address (AnonymousKey) — never a string
// the caller chose. The buckets live in a map bounded by Config.MaxKeys;
// past it the least recently used bucket is forgotten (its principal
// starts again with a full bucket), so a flood of any shape holds at most
// MaxKeys buckets.
//
// A refusal is rate.limited (429, retriable, with the seconds until a
// token is back: Retry-After). A Recorder writes the audit row of each
// refusal of an authenticated principal, through the audit service's API;
// its rows are bounded by a limiter of their own: past RowBurst rows in a
// burst a principal's further refusals are counted, and one row per
// principal and flush says how many there were. Refusals of requests that
// did not authenticate name no tenant and leave no row (the trail is kept
// per tenant); they are logged and counted.
package edgelimit
