package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// warmupCalls run before the counters are read, after one call per caller.
const warmupCalls = 50

// measurement is one server measured under one load shape.
type measurement struct {
	calls    int
	elapsed  time.Duration
	p50      time.Duration
	p99      time.Duration
	protocol string // negotiated
	cpu      time.Duration
	pgCPU    time.Duration
	mallocs  uint64
	byProc   []procCost      // each server's share, in target order
	latency  []time.Duration // every call's, sorted
}

// merge adds o's calls to m: m and o measured the same target, one after
// the other (or m is empty).
func (m measurement) merge(o measurement) measurement {
	if m.calls == 0 {
		return o
	}
	m.calls += o.calls
	m.elapsed += o.elapsed
	m.cpu += o.cpu
	m.pgCPU += o.pgCPU
	m.mallocs += o.mallocs
	m.byProc = slices.Clone(m.byProc)
	for i := range m.byProc {
		m.byProc[i].cpu += o.byProc[i].cpu
		m.byProc[i].mallocs += o.byProc[i].mallocs
	}
	m.latency = slices.Sorted(slices.Values(append(slices.Clip(m.latency), o.latency...)))
	m.p50 = m.latency[len(m.latency)/2]
	m.p99 = m.latency[len(m.latency)*99/100]
	return m
}

// procCost is one server's CPU and allocations over a measured run.
type procCost struct {
	name    string
	cpu     time.Duration
	mallocs uint64
}

func (m measurement) rate() float64 { return float64(m.calls) / m.elapsed.Seconds() }

func (m measurement) cpuPerCall() time.Duration { return m.cpu / time.Duration(m.calls) }

func (m measurement) pgPerCall() time.Duration { return m.pgCPU / time.Duration(m.calls) }

func (m measurement) allocsPerCall() float64 { return float64(m.mallocs) / float64(m.calls) }

// target is an MCP endpoint and the processes whose counters it charges.
type target struct {
	name     string
	endpoint string
	token    string
	procs    []*proc
	database string // charge the CPU of this Postgres database's backends too
}

// drive opens one MCP session per caller, warms up, and makes n calls of
// cmd spread over the callers, reading the servers' counters
// around the measured calls. With profile set (-profile), each server writes
// a CPU profile of the measured calls.
func drive(ctx context.Context, t target, cmd command, protocol string, callers, n int, profile bool) (measurement, error) {
	client, done := t.httpClient(callers)
	defer done()

	sessions := make([]*mcp.ClientSession, callers)
	defer func() {
		for _, cs := range sessions {
			if cs != nil {
				_ = cs.Close()
			}
		}
	}()
	for i := range sessions {
		cs, err := t.connect(ctx, client, protocol)
		if err != nil {
			return measurement{}, err
		}
		sessions[i] = cs
		if err := cmd.call(ctx, cs, nil); err != nil {
			return measurement{}, fmt.Errorf("warm-up call to %s: %w", t.endpoint, err)
		}
	}
	if _, err := spread(ctx, sessions, cmd, warmupCalls); err != nil {
		return measurement{}, err
	}

	before, err := readAll(ctx, t.procs)
	if err != nil {
		return measurement{}, err
	}
	var pgBefore time.Duration
	if t.database != "" {
		pgBefore = postgresCPU(t.database)
	}
	if profile {
		for _, p := range t.procs {
			if err := p.profile(ctx, fmt.Sprintf("%s-%s-%s-c%d-%s.pprof", t.name, cmd.name, protocol, callers, p.name)); err != nil {
				return measurement{}, err
			}
		}
	}
	began := time.Now()
	latencies, err := spread(ctx, sessions, cmd, n)
	elapsed := time.Since(began)
	if err != nil {
		return measurement{}, fmt.Errorf("%s: %w", t.endpoint, err)
	}
	if profile {
		for _, p := range t.procs {
			if err := p.profile(ctx, ""); err != nil {
				return measurement{}, err
			}
		}
	}
	after, err := readAll(ctx, t.procs)
	if err != nil {
		return measurement{}, err
	}
	m := measurement{calls: n, elapsed: elapsed, protocol: sessions[0].InitializeResult().ProtocolVersion}
	for i, p := range t.procs {
		c := procCost{name: p.name, cpu: after[i].CPU - before[i].CPU, mallocs: after[i].Mallocs - before[i].Mallocs}
		m.cpu += c.cpu
		m.mallocs += c.mallocs
		m.byProc = append(m.byProc, c)
	}
	if t.database != "" {
		m.pgCPU = postgresCPU(t.database) - pgBefore
	}
	slices.Sort(latencies)
	m.latency = latencies
	m.p50 = latencies[len(latencies)/2]
	m.p99 = latencies[len(latencies)*99/100]
	return m, nil
}

// httpClient is an HTTP client that sends t's token, keeping up to two idle
// connections per caller; done closes them.
func (t target) httpClient(callers int) (client *http.Client, done func()) {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = callers * 2
	return &http.Client{Transport: bearer{t.token, transport}, Timeout: 30 * time.Second}, transport.CloseIdleConnections
}

// connect opens an MCP session with t over client, asking for protocol.
func (t target) connect(ctx context.Context, client *http.Client, protocol string) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "mandate-bench", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: t.endpoint, HTTPClient: client, DisableStandaloneSSE: true},
		&mcp.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", t.endpoint, err)
	}
	return cs, nil
}

// spread makes n calls of cmd over the sessions, one goroutine each, and
// returns every call's latency.
func spread(ctx context.Context, sessions []*mcp.ClientSession, cmd command, n int) ([]time.Duration, error) {
	var (
		next   atomic.Int64
		wg     sync.WaitGroup
		failed atomic.Pointer[error]
		per    = make([][]time.Duration, len(sessions))
	)
	for i, cs := range sessions {
		wg.Go(func() {
			own := make([]time.Duration, 0, n/len(sessions)+1)
			for next.Add(1) <= int64(n) {
				t0 := time.Now()
				if err := cmd.call(ctx, cs, nil); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				own = append(own, time.Since(t0))
			}
			per[i] = own
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return nil, *err
	}
	return slices.Concat(per...), nil
}

// bearer adds a bearer token to every request sent through base.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}
