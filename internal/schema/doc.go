// Package schema is the one place where Mandate decides, at run time, what
// a valid command input is. It decodes JSON inputs into dynamic messages:
// proto field names only, no nulls, canonical scalar forms, then protojson
// and protovalidate. Each violation carries a JSON pointer into the input.
//
// Results go the other way through MarshalOutput, protojson's encoding with
// proto field names at a fraction of its cost on dynamic messages, and
// TranscodeOutput, which writes the same JSON straight from the wire bytes
// where it can. Redact withholds the sensitive values of an input.
//
// The build-time projection of a message into a JSON Schema for tool
// descriptors is package internal/schema/jsonschema, which imports this
// one for what both must read alike (the canonical spellings, the integer
// ranges, the numeric rules, field_behavior REQUIRED; rules.go); nothing
// that runs a command imports it (internal/archtest).
package schema
