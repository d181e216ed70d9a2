// Package manifestdiff compares two builds' manifests for what they
// promise, not for the wire: `buf breaking` says whether old clients still
// work; this says whether a change lowers a command's risk, drops or
// loosens its confirmation, weakens who approves, removes a permission, a
// sensitive flag, a separation of duties, a condition or a limit, loosens
// a limit, changes what a call does (side effects, reversibility,
// idempotency), or widens what an input may say. Every finding has a rule
// id and a severity (high, warn, info); an overrides file changes a rule's
// severity, for every command or one, or accepts it (ignore), with a
// reason. `mandate manifest diff` runs it (docs/governance-diff.md lists
// the rules, the overrides file and the exit codes).
//
// Manifests are read as JSON, not through internal/manifest's typed model:
// a key this package does not know (a newer build's) is still compared and
// reported (command.changed), never dropped.
package manifestdiff
