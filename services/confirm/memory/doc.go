// Package memory is the in-process confirm Store, SessionStore and
// NoticeStore: the embedded default of `mandate dev` and of unit tests.
// Every state change happens under one mutex, which is what makes Decide and
// Redeem atomic, and what records a notice together with the change it
// reports; Watch is woken in-process. Nothing survives a restart, and two
// Stores share nothing: run several replicas on the Postgres store.
//
// The store stays bounded under sustained load: a challenge is dropped once
// it has been expired for Options.Retain (an hour by default), together with
// its notices, delivered or not; swept by Create at most once a minute, as
// spent sign-in tokens and expired sessions are swept by the calls that add
// them.
package memory
