// Package memory is the in-memory executor.Store: the embedded default of mandate dev and the
// reference the Postgres store is held to by the conformance suite
// (services/executor/executortest). Everything lives behind one mutex, so each method is atomic
// like a transaction: Reserve decides and claims a key in one step, and Finish validates its
// parts before changing anything, so it records all of them or none. Byte slices are copied in
// and out, so callers cannot alter what the store holds. The clock is injectable (Options.Now),
// so expiry is tested without sleeping.
package memory
