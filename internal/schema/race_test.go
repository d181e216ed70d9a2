//go:build race

package schema_test

// raceEnabled is set under the race detector, whose instrumentation
// allocates: allocation counts are not asserted there.
const raceEnabled = true
