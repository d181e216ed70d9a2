// Package mcpbridge serves Mandate's governed commands to agents over the
// Model Context Protocol (Streamable HTTP, protocol revisions 2025-06-18 and
// 2025-11-25), with the official Go SDK.
//
// # Authentication
//
// Every request carries a bearer token that the identity Verifier checks
// (signature, lifetime, issuer, audience). A missing or bad token gets
// 401 with a WWW-Authenticate header naming the RFC 9728 protected-resource
// metadata, which Bridge.MetadataHandler serves. The verified Principal
// travels in the SDK's TokenInfo; each session is pinned to the principal
// that opened it.
//
// # Tools
//
// Each principal (tenant, user, agent) gets its own *mcp.Server whose tools
// are the catalog's visible tools for it, with the descriptor's input and
// output schemas passed through as raw JSON. The set is brought up to date
// on every HTTP request, so open sessions of that principal receive
// notifications/tools/list_changed when it changes.
//
// A tools/call for any published command goes to the executor, whether or
// not the caller sees it listed: the pipeline, not the listing, decides and
// audits. Only a name that is no published command is answered with
// JSON-RPC -32602. The call's `_meta` may carry `mandate.dev/conversation`,
// `mandate.dev/idempotency_key` and `mandate.dev/approval` (a grant id).
// A success returns the result JSON as structuredContent plus a text block;
// a refusal is an isError result whose structuredContent holds the code,
// stage, message, retriable, remedy and invocation id of the refusal (and,
// for confirmation.required, the challenge id and approval URL, with text
// telling the agent to have its user approve and to retry with the grant).
//
// # Resources
//
// `mandate://manifest` is the manifest verbatim (it takes ops.read), and
// `mandate://command/{code}` is one command's entry of the manifest, for
// commands the principal may see.
package mcpbridge
