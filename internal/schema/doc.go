// Package schema is the one place where Mandate decides what a valid command
// input is. It projects a protobuf message, its buf.validate rules, its
// comments and its Mandate field options into a JSON Schema (draft 2020-12)
// for tool descriptors, and it decodes JSON inputs into dynamic messages with
// the same contract: proto field names only, no nulls, canonical scalar forms,
// then protojson and protovalidate. Each violation carries a JSON pointer into
// the input.
//
// Results go the other way through MarshalOutput, protojson's encoding with
// proto field names at a fraction of its cost on dynamic messages.
//
// The schema and the decoder are kept in agreement by a test that validates
// generated instances with both and compares the verdicts.
package schema
