// Package api serves mandate.v1.CatalogService over gRPC (and REST through
// the gateway): thin handlers that take the verified principal from the
// context, call the catalog domain (services/catalog) and translate its
// tools, findings and events into mandate.v1 messages. Refusals are
// *failure.Error values from the domain and reach the client through
// internal/failure unchanged; anything else is logged and hidden behind a
// generic internal error. Tool descriptors travel as canonical JSON strings
// and the manifest and its slices as bytes, so nothing is re-encoded on the
// way.
package api
