//go:build race

package strictjson_test

// raceEnabled is set under the race detector, whose instrumentation
// allocates: allocation counts are not asserted there.
const raceEnabled = true
