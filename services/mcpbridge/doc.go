// Package mcpbridge serves Mandate's governed commands to agents over the
// Model Context Protocol (Streamable HTTP, protocol revisions 2025-06-18 and
// 2025-11-25 with sessions, and 2026-07-28 without them when
// Config.StateKey is set), with the official Go SDK.
//
// # The other services
//
// The bridge keeps no data and knows the other services only by their API:
// its ports (Executor, Catalog, Confirmer) are the parts of the generated
// mandatev1 gRPC clients it calls, bound over the network for the separate
// bridge and over a server's in-process channel in mandate dev. Each call
// relays the caller's raw token under the bridge's service credentials, so
// every service answers for the caller; policy (who may answer a
// confirmation by form) and rendering (the prompt's argument lines, the
// review's prompt) are the owning service's.
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
// output schemas passed through as raw JSON. A goroutine per principal
// follows the catalog's Watch of its set (relaying the newest token seen
// for it, reconnecting with backoff), so open sessions receive
// notifications/tools/list_changed when it changes (a role removed, the
// user disabled) with no request in flight; while that watch is down,
// each request reads the set itself. A principal's server is dropped once
// it has no open session and Config.IdleTimeout has passed; Close ends
// the sessions and the watches.
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
// # Confirmation through elicitation
//
// When the executor answers confirmation.required and a confirm service is
// configured, a client that declared form elicitation is asked with
// elicitation/create showing the confirm service's prompt (rendered from
// the declaration, sensitive values withheld), asking for nothing else —
// but only where the confirm service says the session may answer by form:
// the directory marks the session's agent as running in a client its user
// operates (host: interactive; a user acting directly counts too), the
// requesting user is the approver and the command is below L4. A headless
// agent's runtime could answer the form itself, so its user confirms on
// the approval page, signed in. Accept records the approval as the
// session's user on channel mcp_elicitation and the call runs again with
// the grant. Decline or cancel record a decline: cancel is treated as "not approved",
// closing the challenge so that its approval URL cannot approve the call
// later. The call then runs again with the grant so that the executor
// itself refuses it (confirmation.refused, audited); the backend is never
// called. Where someone else must approve (four eyes) or the command is
// L4, a client that declared URL elicitation is sent the approval page
// (elicitationId = challenge id), and the result is the
// confirmation.required refusal; every other client gets that refusal with
// the approval URL. If elicitation fails, the challenge stays pending.
//
// # Tasks
//
// A 2025-11-25 client that sends a tools/call with params.task (the
// protocol's experimental tasks) gets a CreateTaskResult at once. A call
// refused confirmation.required becomes a working task. The task follows
// the challenge (ConfirmService.Await), then runs the call again with the
// challenge as its grant through the executor, and ends completed or
// failed with the executor's answer (declined, expired). Where the
// confirmation form would have been shown, the task is input_required and
// sends it, related to the task, on the session's standalone stream.
// tasks/get, tasks/result (which blocks until the end), tasks/list and
// tasks/cancel are answered for the principal that created the task
// alone; anyone else gets "task not found", recorded as task.not_found. At
// most Config.MaxTasks tasks per principal wait (task.too_many). The SDK
// knows no tasks, so tasks.go works on the HTTP request and splices the
// capability and the tools' execution.taskSupport into its results. A
// task lives on the replica that created it; with Config.AdvertiseURL its
// id names that replica, and the others forward requests for it there.
// On 2026-07-28, a client whose request capabilities name the tasks
// extension (SEP-2663) gets such a task instead of the approval-URL
// refusal (tasks2026.go).
//
// # Protocol 2026-07-28
//
// With Config.StateKey set, a request whose Mcp-Protocol-Version header is
// 2026-07-28 or later goes to a stateless Streamable HTTP transport over
// the same per-principal servers and authentication (server/discover, no
// initialize, no session; capabilities come in each request's `_meta`);
// older clients keep their sessions. Lists and resources are marked
// cacheScope "private": they differ per principal; tools/list_changed
// reaches such a client on its subscriptions/listen stream. A client of that
// revision cannot be sent elicitation/create; instead, where the form
// above would be shown, the tools/call result is input_required, with the
// form under inputRequests "confirm" and a requestState sealed with
// HMAC-SHA256 under StateKey that binds a digest of the principal, the
// tool, a SHA-256 of the arguments in canonical JSON, the challenge id and
// an expiry (10 minutes, or the challenge's own expiry if sooner). The
// client asks its user and calls again, under a new request id, with the
// answer in inputResponses and the requestState. The bridge checks the
// seal, the binding and the expiry, records the answer (ConfirmService
// Decide on channel mcp_elicitation: a challenge is decided once, so a state is good for one retry) and runs
// the call with the grant, which the executor redeems once. A state that
// fails any check, or was used before, is refused with
// confirmation.invalid_state and nothing is decided. URL mode is not used
// on this revision: four-eyes, L4 and clients without form elicitation
// get the approval-URL refusal.
//
// # Replicas
//
// With Config.AdvertiseURL set (and StateKey), the bridge runs as several
// replicas behind a plain round-robin balancer. A session of the 2024–2025
// revisions, and a call waiting for its elicitation answer, live in the
// memory of the replica that initialised the session; its id names that
// replica's advertised URL, with an HMAC-SHA256 under StateKey. A replica
// that receives an authenticated request for another's session forwards
// it there unchanged (streams flushed as they come), marked with
// ForwardedHeader (an HMAC of the session id) so that the owner serves it
// and never forwards it again. An id the replicas did not seal is answered
// 404 and never forwarded; so is a session whose owner cannot be reached
// within ForwardDialTimeout, and clients then initialise a new session.
//
// # Review narration
//
// ops.review with narrate: true runs through the executor like any
// command; then, if the client declared sampling, the bridge asks the
// client's own model (sampling/createMessage) to narrate the review's
// prompt, which the catalog rendered into the review's output, and returns
// its text and model
// in `_meta` `mandate.dev/narration` and a text block. A client without
// sampling gets the deterministic rendering and a note. Mandate holds no
// model API key.
//
// # Trace context
//
// A W3C `traceparent` (and `tracestate`) in a tools/call's `_meta`
// parents the call's "tools/call <tool>" span, so the executor's spans and
// the audit rows carry the client's trace id.
//
// # Resources
//
// `mandate://manifest` is the manifest verbatim (it takes ops.read), and
// `mandate://command/{code}` is one command's entry of the manifest, for
// commands the principal may see.
package mcpbridge
