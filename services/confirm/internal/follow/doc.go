// Package follow is the watch machinery shared by the confirm stores: a
// [Hub] that wakes the subscribers of a challenge when it changed, and
// [Run], the loop that re-reads a challenge on every wake-up (and at its
// expiry) and sends it until it is no longer pending. Watchers receive only
// a wake-up through the Hub and read the challenge from the store, so a
// lost or duplicated wake-up costs at most a poll interval or a read.
package follow
