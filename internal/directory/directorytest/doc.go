// Package directorytest is the conformance suite for directory.Store implementations. Every
// implementation runs it from its own tests with [Run], so the memory and Postgres stores are
// held to the same observable behaviour: resolution rules, tenant isolation, atomic and
// idempotent Apply, and change announcements that reach a Cache before Update returns.
package directorytest
