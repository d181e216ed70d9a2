// Package manifest is the typed command model every Mandate service reads:
// the build's manifest (canonical JSON, one entry per command: declaration,
// RPC binding and JSON Schemas) paired with the descriptor set the executor
// decodes inputs with. Load refuses a malformed manifest and a manifest that
// does not match its descriptor set, so a service never runs on half a
// contract.
package manifest
