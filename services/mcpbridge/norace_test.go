//go:build !race

package mcpbridge

// raceEnabled is set under the race detector, whose instrumentation
// allocates: allocation counts are not asserted there.
const raceEnabled = false
