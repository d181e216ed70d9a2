// Package strictjson checks that a request body is exactly one strict JSON
// value before any lenient parser reads it: valid UTF-8 throughout, no
// object with two members of the same name, nesting no deeper than a
// limit, and nothing but whitespace after the value.
//
// encoding/json, protojson and the MCP SDK each forgive some of these in
// their own way (one duplicate silently wins, invalid UTF-8 becomes U+FFFD,
// a deep document exhausts a recursion limit deep inside a handler and
// surfaces as an internal error), so a server that let them decide would
// answer one hostile body differently on each channel. The REST gateway
// (internal/server) and the MCP endpoint (services/mcpbridge) both run
// Check first and refuse what it refuses; the refusal names one of the
// Rule* ids, which are the violation rule ids internal/schema uses for the
// same faults in a command's input.
package strictjson
