// Package confirm holds Mandate's human confirmations: the domain types of a
// [Challenge] (one pending request for a human's yes or no about one exact
// invocation) and of the [Grant] it turns into, the rules of who may see,
// decide and redeem a challenge ([Service]), the approval [Prompt] rendered
// from the command's declaration and the request ([RenderPrompt]), and the
// [Store] and [SessionStore] interfaces that the memory and Postgres
// implementations satisfy (held to the same behaviour by confirmtest).
//
// A challenge moves PENDING → APPROVED | DECLINED | EXPIRED, and an approved
// one moves APPROVED → REDEEMED exactly once, for the invocation digest it
// was opened for and before it expires: consent never carries over to other
// arguments, another principal or a second call. Agents never approve; the
// command's declared approver policy says which human may (the requesting
// user, or — four eyes — another active user of the tenant holding a named
// permission). Nothing crosses tenants: a challenge of another tenant does
// not exist for the caller.
//
// The package knows nothing about transports. Refusals are [*Error] values
// with stable codes (confirmation.*, schema.invalid, …) that the gRPC/REST
// layer and the approval page map to wire errors through internal/failure.
package confirm
