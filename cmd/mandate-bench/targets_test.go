package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// perCall is a measurement of 100 calls that cost cpu, pg and allocs
// each, with p50 as its median latency.
func perCall(cpu, pg time.Duration, allocs uint64, p50 time.Duration) measurement {
	return measurement{calls: 100, elapsed: time.Second, cpu: 100 * cpu, pgCPU: 100 * pg, mallocs: 100 * allocs, p50: p50}
}

const us = time.Microsecond

// targetRows are a run's rows on protocol p: at 16 callers the separate
// topology at over × its reference over the service (rounds), with cpu,
// pg and allocs per call against 1.6 ms + 0.1 ms and 737, and mandate dev
// at dev × the in-memory reference; at one caller, p50 gov against 1 ms.
func targetRows(p string, over []float64, cpu, pg time.Duration, allocs uint64, gov time.Duration, dev []float64) []row {
	return []row{
		{protocol: p, callers: 1, ratios: map[string][]float64{shapeDev: {1}},
			governed:    map[string]measurement{shapeTopo: perCall(cpu, pg, allocs, gov)},
			overService: perCall(1600*us, 100*us, 737, time.Millisecond), overRatios: []float64{0.4}},
		{protocol: p, callers: 16, ratios: map[string][]float64{shapeDev: dev},
			governed:    map[string]measurement{shapeTopo: perCall(cpu, pg, allocs, 9*time.Millisecond)},
			overService: perCall(1600*us, 100*us, 737, 3*time.Millisecond), overRatios: over},
	}
}

// TestTargetsOf: each target of issue #28 is read from the run's own
// numbers on the first protocol — the median round for a ratio, the value
// as printed against its bound — and is n/a, with why, when the run could
// not measure it: no topology, no Postgres CPU, no commit from a timeline.
func TestTargetsOf(t *testing.T) {
	// Far from every target on another protocol, which must not be read.
	other := targetRows("2025-11-25", []float64{0.1}, 9*time.Millisecond, 5*time.Millisecond, 5000, 50*time.Millisecond, []float64{0.1})

	met := targetInputs{protocol: "2026-07-28", commit: 940 * us,
		rows: append(targetRows("2026-07-28", []float64{0.9, 0.7, 0.8}, 2*time.Millisecond, 300*us, 900, 2440*us, []float64{0.96, 0.94, 0.99}), other...)}
	want := []targetRow{
		{"separate processes + Postgres vs the reference over the service, calls/s, c=16", "≥ 0.75×", "0.80×", "yes"},
		{"CPU per governed call, all processes + Postgres, vs the reference over the service, c=16", "≤ 1.50×", "1.35× (2.30 ms vs 1.70 ms)", "yes"},
		{"Postgres CPU per governed call, c=16", "≤ 0.35 ms", "0.30 ms", "yes"},
		{"separate processes + Postgres, one caller, p50", "≤ ref + one commit (0.94 ms) + 0.50 ms = ref + 1.44 ms", "ref + 1.44 ms (2.44 ms vs 1.00 ms)", "yes"},
		{"allocations per call vs the reference over the service, c=16", "≤ 1.30×", "1.22× (900 vs 737)", "yes"},
		{"`mandate dev` vs the in-memory reference, calls/s, c=16", "≥ 0.95×", "0.96×", "yes"},
	}
	if got := targetsOf(met); !slices.Equal(got, want) {
		t.Errorf("all met:\n got %q\nwant %q", got, want)
	}

	// Just past every bound.
	missed := met
	missed.rows = append(targetRows("2026-07-28", []float64{0.74, 0.9, 0.6}, 2300*us, 360*us, 970, 2460*us, []float64{0.94}), other...)
	for i, r := range targetsOf(missed) {
		if r.met != "no" {
			t.Errorf("row %d (%s): %q met %q, want no", i, r.measure, r.now, r.met)
		}
	}

	// What rounds to the bound, as printed, meets it.
	edge := met
	edge.rows = targetRows("2026-07-28", []float64{0.749}, 2*time.Millisecond, 300*us, 900, 2440*us, []float64{0.9499})
	if got := targetsOf(edge); got[0].now != "0.75×" || got[0].met != "yes" || got[5].now != "0.95×" || got[5].met != "yes" {
		t.Errorf("at the bounds: %q, %q", got[0], got[5])
	}

	// No timeline: the p50 is printed without the commit term, its verdict is n/a.
	noCommit := met
	noCommit.commit, noCommit.noCommit = 0, "-timeline 0"
	got := targetsOf(noCommit)
	if r := got[3]; r.target != "≤ ref + one commit + 0.50 ms" || r.now != "ref + 1.44 ms (2.44 ms vs 1.00 ms), without the commit term: -timeline 0" || r.met != "n/a" {
		t.Errorf("without a commit: %q", r)
	}
	if !slices.Equal(got[:3], want[:3]) || !slices.Equal(got[4:], want[4:]) {
		t.Errorf("without a commit, the other rows changed: %q", got)
	}

	// No Postgres CPU read: that row alone is n/a.
	noPg := met
	noPg.rows = targetRows("2026-07-28", []float64{0.8}, 2*time.Millisecond, 0, 900, 2440*us, []float64{0.96})
	if r := targetsOf(noPg)[2]; r.met != "n/a" || !strings.HasPrefix(r.now, "n/a (no CPU of the run's database") {
		t.Errorf("without Postgres CPU: %q", r)
	}

	// No topology: everything but mandate dev is n/a, with the reason.
	noTopo := targetInputs{protocol: "2026-07-28", noTopology: "no Postgres answered", noCommit: "no separate topology to trace",
		rows: []row{
			{protocol: "2026-07-28", callers: 1, ratios: map[string][]float64{shapeDev: {0.9}}, governed: map[string]measurement{}},
			{protocol: "2026-07-28", callers: 16, ratios: map[string][]float64{shapeDev: {0.97}}, governed: map[string]measurement{}},
		}}
	got = targetsOf(noTopo)
	for _, r := range got[:5] {
		if r.now != "n/a (no Postgres answered)" || r.met != "n/a" {
			t.Errorf("without a topology: %q", r)
		}
	}
	if r := got[5]; r.now != "0.97×" || r.met != "yes" {
		t.Errorf("mandate dev without a topology: %q", r)
	}
}
