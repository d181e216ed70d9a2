// Package feed is the live-tail machinery shared by the audit stores: a [Hub] that wakes the
// readers of a tenant when rows were committed, and [Tail], the loop that reads a tenant's rows
// by Seq and sends them on a channel. Readers never receive rows through the Hub itself, only
// a wake-up, so a slow reader falls behind and catches up from the store instead of losing
// rows, and a lost wake-up costs at most one poll interval.
package feed
