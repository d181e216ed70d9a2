package main

import (
	"cmp"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// The timeline answers "where does one call's time go" in the separate
// topology: the services are started again with tracing on, exporting to a
// sink in this process, and timelineCalls calls are made one at a time,
// each with its own trace (a W3C traceparent in _meta). Every span of those
// traces is placed by its start relative to the call's first span (the
// bridge's tools/call), and the median offset and duration of each span
// over the calls are printed in the order the spans start. Tracing costs a
// little, so this runs after the measured load, on servers of its own.

// span is one received span, reduced to what the timeline needs.
type span struct {
	service, kind, name string
	start, end          time.Time
}

// spanSink receives OTLP/HTTP trace exports (protobuf, as the services'
// otlptracehttp exporter sends them) and keeps the spans by trace id.
type spanSink struct {
	srv  *http.Server
	url  string
	mu   sync.Mutex
	byID map[string][]span
}

func startSpanSink() (*spanSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &spanSink{byID: map[string][]span{}, url: "http://" + ln.Addr().String() + "/v1/traces"}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *spanSink) close() { _ = s.srv.Close() }

func (s *spanSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.NotFound(w, r)
		return
	}
	var body io.Reader = http.MaxBytesReader(w, r.Body, 32<<20)
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		defer func() { _ = zr.Close() }()
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.add(&req)
	resp, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(resp)
}

func (s *spanSink) add(req *collectortrace.ExportTraceServiceRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				id := hex.EncodeToString(sp.GetTraceId())
				s.byID[id] = append(s.byID[id], span{
					service: service,
					kind:    spanKind(sp.GetKind()),
					name:    sp.GetName(),
					start:   time.Unix(0, int64(sp.GetStartTimeUnixNano())), //nolint:gosec // G115: nanoseconds since 1970 fit int64 until 2262.
					end:     time.Unix(0, int64(sp.GetEndTimeUnixNano())),   //nolint:gosec // G115: as above.
				})
			}
		}
	}
}

func (s *spanSink) trace(id string) []span {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.byID[id])
}

// spanKind names a span kind as the timeline prints it: server, client,
// internal, producer, consumer.
func spanKind(k tracepb.Span_SpanKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "SPAN_KIND_"))
}

// timelineRow is one span of the call, over all traced calls.
type timelineRow struct {
	label         string // service, kind and name
	seen          int    // calls whose trace has it
	offset, lasts time.Duration
}

// timelineOf places the spans of each call by their start relative to the
// call's first span and returns, for every span (service, kind, name) found
// in at least half of the calls, the median offset and duration, ordered by
// offset. A span that occurs more than once in one call (the audit
// service's append of the intent, then of the outcome) is told apart by its
// occurrence: "… (#2)".
func timelineOf(calls [][]span) []timelineRow {
	type acc struct{ offsets, durations []time.Duration }
	byLabel := map[string]*acc{}
	for _, spans := range calls {
		if len(spans) == 0 {
			continue
		}
		slices.SortStableFunc(spans, func(a, b span) int { return a.start.Compare(b.start) })
		t0 := spans[0].start
		seen := map[string]int{}
		for _, s := range spans {
			label := strings.TrimPrefix(s.service, "mandate-") + " " + s.kind + " " + s.name
			if seen[label]++; seen[label] > 1 {
				label += fmt.Sprintf(" (#%d)", seen[label])
			}
			a := byLabel[label]
			if a == nil {
				a = &acc{}
				byLabel[label] = a
			}
			a.offsets = append(a.offsets, s.start.Sub(t0))
			a.durations = append(a.durations, s.end.Sub(s.start))
		}
	}
	var rows []timelineRow
	for label, a := range byLabel {
		if 2*len(a.offsets) < len(calls) {
			continue
		}
		rows = append(rows, timelineRow{label: label, seen: len(a.offsets), offset: medianDuration(a.offsets), lasts: medianDuration(a.durations)})
	}
	slices.SortFunc(rows, func(a, b timelineRow) int {
		if c := cmp.Compare(a.offset, b.offset); c != 0 {
			return c
		}
		return strings.Compare(a.label, b.label)
	})
	return rows
}

func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Sorted(slices.Values(ds))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// traceTimeline starts the separate topology again on d with its spans
// exported to a sink, makes n calls of cmd one at a time, each in a trace of its
// own, stops the services (which flushes their spans) and returns the
// timeline with the calls' median latency as the client saw it.
func traceTimeline(ctx context.Context, parent *fleet, d benchDB, cmd command, protocol string, n int) ([]timelineRow, time.Duration, error) {
	sink, err := startSpanSink()
	if err != nil {
		return nil, 0, err
	}
	defer sink.close()
	dir := filepath.Join(parent.dir, "timeline-"+cmd.name)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, 0, err
	}
	f := &fleet{dir: dir, env: append(slices.Clip(parent.env),
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="+sink.url,
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf",
		"OTEL_TRACES_SAMPLER=parentbased_always_on",
		"OTEL_BSP_SCHEDULE_DELAY=200",
	)}
	defer func() { _ = f.stop() }() // on an early return; stopping twice is harmless
	t, err := startTopology(ctx, f, d)
	if err != nil {
		return nil, 0, err
	}
	client, done := t.httpClient(1)
	defer done()
	cs, err := t.connect(ctx, client, protocol)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = cs.Close() }()
	for range warmupCalls {
		if err := cmd.call(ctx, cs, nil); err != nil {
			return nil, 0, fmt.Errorf("warm-up call: %w", err)
		}
	}
	ids := make([]string, n)
	latencies := make([]time.Duration, n)
	for i := range ids {
		// Trace ids of this run's own: the pid, the command and the call's
		// number.
		ids[i] = fmt.Sprintf("%016x%08x%08x", os.Getpid(), slices.IndexFunc(allCommands, func(c command) bool { return c.name == cmd.name }), i+1)
		t0 := time.Now()
		if err := cmd.call(ctx, cs, mcp.Meta{"traceparent": "00-" + ids[i] + "-00000000000000a1-01"}); err != nil {
			return nil, 0, err
		}
		latencies[i] = time.Since(t0)
	}
	_ = cs.Close()
	// Stopping flushes every service's buffered spans.
	if err := f.stop(); err != nil {
		return nil, 0, err
	}
	calls := make([][]span, n)
	traced := 0
	for i, id := range ids {
		calls[i] = sink.trace(id)
		if len(calls[i]) > 0 {
			traced++
		}
	}
	if 2*traced < n {
		return nil, 0, fmt.Errorf("spans of only %d of %d calls arrived; -keep-logs keeps the services' logs (%s)", traced, n, dir)
	}
	return timelineOf(calls), medianDuration(latencies), nil
}

// printTimeline writes cmd's timeline as a table.
func printTimeline(out io.Writer, cmd command, rows []timelineRow, calls int, p50 time.Duration, protocol string) {
	fmt.Fprintf(out, "\nOne call at a time, traced: where a call of %s's time goes (%s, separate processes + Postgres; median of %d calls, client p50 %s):\n\n",
		cmd.tool, protocol, calls, ms(p50))
	fmt.Fprintln(out, "| span (service kind name) | starts at | lasts |")
	fmt.Fprintln(out, "|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(out, "| %s | %s | %s |\n", r.label, ms(r.offset), ms(r.lasts))
	}
	fmt.Fprintln(out, "\nOffsets are from the bridge's first span of the call; a hop between processes is the gap between a client span's start and its server span's.")
	fmt.Fprintln(out, "The outcome row (audit_outcome) is appended after the reply: it starts after the call has returned to the client.")
}

// auditStageSpan is the executor's audit stage in the timeline: the intent
// made durable in the executor's own store, one local commit.
const auditStageSpan = "executor internal audit"

// commitOf is the median duration of the audit stage over the traced
// calls: what "one commit" is in the targets (see targetsOf).
func commitOf(rows []timelineRow) (time.Duration, bool) {
	i := slices.IndexFunc(rows, func(r timelineRow) bool { return r.label == auditStageSpan })
	if i < 0 {
		return 0, false
	}
	return rows[i].lasts, true
}
