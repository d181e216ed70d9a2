package api_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/executor"
)

// TestTwoRelaysAreWokenByTheirRows: with two executors on one store, each
// with a caller of its own, every call's rows reach the trail without
// either relay's tick (an hour away): a relay woken by its rows that finds
// the other holding the store's relay lease tries again within
// milliseconds. The test logs how long after each call returned its
// outcome row could be read from the trail: p50 and p99 over the calls of
// both (no assertion on time: the machine is shared).
func TestTwoRelaysAreWokenByTheirRows(t *testing.T) { eachStore(t, testTwoRelaysAreWokenByTheirRows) }

func testTwoRelaysAreWokenByTheirRows(t *testing.T, st stores) {
	var base executor.Config
	e := start(t, st, func(c *executor.Config) {
		c.SpoolInterval = time.Hour
		base = *c
	})
	other, err := executor.New(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	const calls = 150
	var (
		mu   sync.Mutex
		lags []time.Duration
		wg   sync.WaitGroup
	)
	for _, ex := range []*executor.Executor{e.pipeline, other} {
		wg.Go(func() {
			for range calls {
				inv, err := searchAs(t, ex)
				if err != nil {
					t.Error(err)
					return
				}
				returned := time.Now()
				rows := waitRows(t, e.audit, "acme", inv, 2)
				lag := time.Since(returned)
				if len(rows) != 2 || rows[0].Phase != audit.PhaseIntent || rows[1].Phase != audit.PhaseOutcome || rows[0].Seq >= rows[1].Seq {
					t.Errorf("rows of %s: %+v, want the intent, then the outcome", inv, rows)
					return
				}
				mu.Lock()
				lags = append(lags, lag)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	slices.Sort(lags)
	t.Logf("%s: two relays: a call's outcome row readable in the trail after it returned: p50 %v, p99 %v, max %v (%d calls, two callers, one per executor)",
		st, lags[len(lags)/2], lags[len(lags)*99/100], lags[len(lags)-1], len(lags))
}
