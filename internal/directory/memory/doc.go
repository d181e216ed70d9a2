// Package memory is the in-memory directory Store: the default for mandate dev and for unit
// tests. Reads see immutable per-tenant states; Update works on copies of the tenants it touches
// and swaps them in at commit, so a failed Update leaves nothing behind. Changes are announced
// in-process and acknowledged before Update returns, so every Cache built on the store has
// already forgotten the old answers by then.
package memory
