// Package backend is the SDK of a business backend that Mandate's executor dispatches to
// (docs/architecture/topology.md, docs/architecture/identity.md). It is built on the packages
// Mandate's own services use, so a backend outside this module trusts the executor by exactly
// the rules Mandate applies, without re-implementing them.
//
// [New] builds a [Guard] from a [Config] (the service secret, the key source of users' tokens,
// issuer and audience): its gRPC interceptors serve only calls relayed by the executor — the
// executor's service token in `authorization` and the end user's token in
// `x-mandate-on-behalf-of` — plus the executor's receipt questions (its service token alone, on
// mandate.v1.ReceiptService only), and refuse everything else with Unauthenticated or
// PermissionDenied and a stable code; health and reflection stay public. Behind the Guard a
// handler reads who it serves with [CallerFrom], and [pkg/receipt] (effect receipts, the
// ReceiptService) works unchanged. A handler refuses with [Refuse]: a gRPC status carrying the
// stage and code in a mandate.v1.CommandError and a google.rpc.ErrorInfo, which the executor
// passes on to the agent unchanged for the stages a backend refuses at. [Previews] serves
// mandate.v1.PreviewService: one function per command ([HandlePreview]) that runs the command's
// guards without effect, so that the executor refuses a call the backend would refuse before
// a human is asked to approve it, and shows the approver what it would do ([Effect]).
package backend
