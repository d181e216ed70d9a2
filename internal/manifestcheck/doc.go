// Package manifestcheck keeps Mandate's services from disagreeing about
// the commands: every call one Mandate service makes to another carries
// the digest of the caller's manifest in the x-mandate-manifest-digest
// metadata, and the receiving service refuses a digest other than its own
// with manifest.mismatch before it does anything. The executor refuses in
// its request_check stage, so the refusal is audited like every other;
// the catalog refuses at the edge of its API (Guard).
//
// A call without the header is accepted: it comes from a caller that has
// no manifest of its own (an agent, a user, an adopter's service calling
// the governed proxy, the REST gateway) or from a Mandate service of an
// earlier release during a rolling upgrade. Every Mandate service of this
// release sends it (clicore.ServiceDialer, the in-process channels of
// `mandate dev`).
package manifestcheck
