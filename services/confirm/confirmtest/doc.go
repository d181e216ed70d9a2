// Package confirmtest holds the conformance suite every confirm.Store and
// confirm.SessionStore implementation must pass ([Run]), and fixtures the
// confirm packages' tests share: declarations covering each approver policy
// ([Commands]), the policy directory they run against ([Policy]) and
// helpers to build challenges and digests.
package confirmtest
