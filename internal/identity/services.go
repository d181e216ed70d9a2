package identity

// MCPBridgeService is the service identity of the MCP bridge. Services that
// treat calls relayed by the bridge differently (the executor records them
// on channel "mcp"; the confirm service accepts mcp_elicitation decisions
// only from it) compare Principal.Via with it. It lives here, below every
// service, so that none has to import another to know the name.
const MCPBridgeService = "mcpbridge"

// ExecutorService is the service identity of the executor. The audit
// service lets it alone append rows on its own authority (no user relayed),
// for the rows it spooled while the trail was unavailable.
const ExecutorService = "executor"

// ConfirmService is the service identity of the confirm service. The audit
// service lets it append, on its own authority, the rows of decision
// attempts (phase decision) and nothing else; nobody else appends those.
const ConfirmService = "confirm"
