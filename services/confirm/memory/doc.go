// Package memory is the in-process confirm Store and SessionStore: the
// embedded default of `mandate dev` and of unit tests. Every state change
// happens under one mutex, which is what makes Decide and Redeem atomic;
// Watch is woken in-process. Nothing survives a restart, and two Stores
// share nothing: run several replicas on the Postgres store.
package memory
