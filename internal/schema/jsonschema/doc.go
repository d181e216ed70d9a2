// Package jsonschema projects a protobuf message, its buf.validate rules,
// its comments and its Mandate field options into a JSON Schema (draft
// 2020-12) for tool descriptors. It runs at build time (internal/compile);
// no runtime package imports it (internal/archtest).
//
// Input schemas describe what internal/schema's decoder accepts: the
// canonical spellings, integer ranges and numeric rules come from that
// package, and a test validates generated instances with both the schema
// and the decoder and compares the verdicts.
package jsonschema
