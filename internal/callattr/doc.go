// Package callattr validates the attributes a caller attaches to a command
// call besides its arguments — conversation id, idempotency key, approval
// grant id, MCP session id, W3C trace context — and renders an offending
// value so that it can be recorded safely.
//
// Every channel (gRPC metadata, REST headers, MCP `_meta`) hands these
// values to the executor unchanged; the executor checks them with [Check]
// and refuses a call whose attributes are malformed, and that refusal is
// itself audited. [Mark] turns any string into one an audit row can hold:
// valid UTF-8, no control or bidi characters, bounded, and visibly marked
// as a caller's invalid value, so an attempt never vanishes because its
// metadata could not be written down.
package callattr
