// Package catalog answers "which tools may this principal see" and reviews
// the manifest they come from. It knows nothing about transports: services/
// catalog/api serves it over gRPC and REST, the MCP bridge lists its tools.
//
// # Visibility
//
// A principal sees the intersection of the published commands of the
// manifest (draft commands are never listed), the commands its tenant is
// entitled to (required_feature) and the commands its user may run (every
// declared permission held). An agent sees exactly the set of the user it
// acts for. A principal the directory calls inactive (unknown tenant or
// user, disabled user, unregistered, mismatched or disabled agent) sees the
// empty set: [Catalog.Tools] reports it as an inactive, empty [ToolSet]
// rather than as an error, because an MCP session of a disabled user must
// show no tools, not fail. Operations about one command ([Catalog.Tool],
// [Catalog.CommandSlice]) refuse an invisible command with
// command.not_found, exactly as if it did not exist, so that a caller
// learns nothing about commands it may not run.
//
// # Caching and freshness
//
// Resolutions are cached per principal, keyed by (tenant, user, agent), in
// a [directory.Cache] the Catalog owns; the directory store's change
// announcements drop a tenant's entries before the writer's Update returns.
// The visible set is then derived from the resolution's content (features
// and permissions), and memoised by that content: the memo can never be
// stale, so a disabled user's next call sees the empty set at once. Every
// directory change of a tenant wakes that tenant's [Catalog.Watch] streams,
// which compute their set again and send an event only when it differs.
//
// # Review
//
// [Review] is a pure function of a manifest: deterministic findings with
// stable rule ids (see [Rules]), and [ToPrompt] renders them, with the
// declarations they are about, as a prompt a model can narrate. The review
// is served as the governed command `ops.review`, so only calls relayed by
// a Mandate service (the executor) are answered.
package catalog
