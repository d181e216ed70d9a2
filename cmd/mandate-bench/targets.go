package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// The targets of issue #28, each read from a run's own numbers by
// targetsOf. Each is a bound on a ratio (×) or a duration.
const (
	targetOverService = 0.75                   // governed / ungoverned over the service, calls/s, c=16: at least
	targetCPU         = 1.5                    // CPU per call, all processes + Postgres, vs over the service, c=16: at most
	targetPostgres    = 350 * time.Microsecond // Postgres CPU per governed call, c=16: at most
	targetOneCaller   = 500 * time.Microsecond // one caller's p50 over the reference's, beyond one commit: at most
	targetAllocs      = 1.3                    // allocations per call vs over the service, c=16: at most
	targetDev         = 0.95                   // mandate dev / in-memory reference, calls/s, c=16: at least
)

// targetInputs is what one command's targets are read from.
type targetInputs struct {
	rows     []row  // the command's rows, every protocol
	protocol string // the targets read the rows of this protocol (the first of -protocols)
	// noTopology says why the run has no separate topology ("" when it has
	// one): every target of it is then n/a.
	noTopology string
	// commit is one local commit of the intent: the median of the
	// executor's audit stage in the command's timeline. noCommit says why
	// there is none ("" when there is).
	commit   time.Duration
	noCommit string
}

// targetRow is one line of the targets table; met is yes, no or n/a.
type targetRow struct {
	measure, target, now, met string
}

// targetsOf computes the targets table from a run's numbers, as the
// tables above them print them: the median round's ratio for a
// throughput, every call's p50 for a latency, CPU and allocations over
// every round's calls. A target is met when the value as printed (to two
// decimals) is within its bound. A target the run cannot compute is "n/a",
// with the reason in place of its value.
func targetsOf(in targetInputs) []targetRow {
	one, hasOne := rowOf(in.rows, in.protocol, 1)
	sixteen, hasSixteen := rowOf(in.rows, in.protocol, 16)
	// topo reports whether r has the separate topology and its reference
	// over the service, or why not.
	topo := func(r row, has bool) (measurement, measurement, string) {
		switch g, ok := r.governed[shapeTopo]; {
		case in.noTopology != "":
			return measurement{}, measurement{}, in.noTopology
		case !has || !ok || g.calls == 0 || r.overService.calls == 0:
			return measurement{}, measurement{}, "not measured"
		default:
			return g, r.overService, ""
		}
	}
	var out []targetRow
	// add adds a row whose value and verdict value computes, unless why
	// says why it cannot be computed.
	add := func(measure, target, why string, value func() (now, met string)) {
		if why != "" {
			out = append(out, targetRow{measure, target, "n/a (" + why + ")", "n/a"})
			return
		}
		now, met := value()
		out = append(out, targetRow{measure, target, now, met})
	}

	g, o, why := topo(sixteen, hasSixteen)
	add(shapeTopo+" vs the reference over the service, calls/s, c=16", fmt.Sprintf("≥ %.2f×", targetOverService), why, func() (string, string) {
		v := median(sixteen.overRatios)
		return fmt.Sprintf("%.2f×", v), yesNo(round2(v) >= targetOverService)
	})
	add("CPU per governed call, all processes + Postgres, vs the reference over the service, c=16", fmt.Sprintf("≤ %.2f×", targetCPU), why, func() (string, string) {
		gov, ref := g.cpuPerCall()+g.pgPerCall(), o.cpuPerCall()+o.pgPerCall()
		v := float64(gov) / float64(ref)
		return fmt.Sprintf("%.2f× (%s vs %s)", v, ms(gov), ms(ref)), yesNo(round2(v) <= targetCPU)
	})
	pgWhy := why
	if pgWhy == "" && g.pgCPU == 0 {
		pgWhy = "no CPU of the run's database's Postgres backends was read from /proc"
	}
	add("Postgres CPU per governed call, c=16", "≤ "+ms(targetPostgres), pgWhy, func() (string, string) {
		return ms(g.pgPerCall()), yesNo(roundMs(g.pgPerCall()) <= roundMs(targetPostgres))
	})

	g1, o1, why1 := topo(one, hasOne)
	oneTarget := "≤ ref + one commit + " + ms(targetOneCaller)
	if in.noCommit == "" {
		oneTarget = fmt.Sprintf("≤ ref + one commit (%s) + %s = ref + %s", ms(in.commit), ms(targetOneCaller), ms(in.commit+targetOneCaller))
	}
	add(shapeTopo+", one caller, p50", oneTarget, why1, func() (string, string) {
		d := g1.p50 - o1.p50
		now := fmt.Sprintf("ref + %s (%s vs %s)", ms(d), ms(g1.p50), ms(o1.p50))
		if in.noCommit != "" {
			// Without the commit term, whether it is met is not known.
			return now + ", without the commit term: " + in.noCommit, "n/a"
		}
		return now, yesNo(roundMs(d) <= roundMs(in.commit+targetOneCaller))
	})

	add("allocations per call vs the reference over the service, c=16", fmt.Sprintf("≤ %.2f×", targetAllocs), why, func() (string, string) {
		v := g.allocsPerCall() / o.allocsPerCall()
		return fmt.Sprintf("%.2f× (%.0f vs %.0f)", v, g.allocsPerCall(), o.allocsPerCall()), yesNo(round2(v) <= targetAllocs)
	})

	devWhy := ""
	if !hasSixteen || len(sixteen.ratios[shapeDev]) == 0 {
		devWhy = "not measured"
	}
	add("`mandate dev` vs the in-memory reference, calls/s, c=16", fmt.Sprintf("≥ %.2f×", targetDev), devWhy, func() (string, string) {
		v := median(sixteen.ratios[shapeDev])
		return fmt.Sprintf("%.2f×", v), yesNo(round2(v) >= targetDev)
	})
	return out
}

// rowOf is the row of protocol at callers.
func rowOf(rows []row, protocol string, callers int) (row, bool) {
	i := slices.IndexFunc(rows, func(r row) bool { return r.protocol == protocol && r.callers == callers })
	if i < 0 {
		return row{}, false
	}
	return rows[i], true
}

// median is the median of vs, as medianRange prints it.
func median(vs []float64) float64 {
	rs := slices.Sorted(slices.Values(vs))
	if len(rs)%2 == 0 {
		return (rs[len(rs)/2-1] + rs[len(rs)/2]) / 2
	}
	return rs[len(rs)/2]
}

// round2 is v to two decimals, as the tables print it.
func round2(v float64) float64 { return math.Round(v*100) / 100 }

// roundMs is d in milliseconds to two decimals, as ms prints it.
func roundMs(d time.Duration) float64 { return round2(float64(d.Microseconds()) / 1000) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// printTargets writes cmd's targets table.
func printTargets(out io.Writer, cmd command, in targetInputs) {
	fmt.Fprintf(out, "\nTargets of issue #28, %s (MCP %s; ratios: the median round's; p50: every call's; CPU and allocations: every round's calls):\n\n",
		cmd.tool, in.protocol)
	fmt.Fprintln(out, "| measure | target | now | met |")
	fmt.Fprintln(out, "|---|---|---|---|")
	for _, r := range targetsOf(in) {
		fmt.Fprintf(out, "| %s | %s | %s | %s |\n", r.measure, r.target, r.now, r.met)
	}
}
