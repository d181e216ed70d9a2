package api_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mandate-dev/mandate/services/executor"
)

// meteredStart starts the topology with the executor's metrics going to a
// manual reader, so the test reads them without touching the global
// provider.
func meteredStart(t *testing.T, st stores, opts ...func(*executor.Config)) (*env, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	e := start(t, st, append([]func(*executor.Config){func(c *executor.Config) { c.MeterProvider = mp }}, opts...)...)
	return e, reader
}

// collect reads the executor's metrics: the count of each calls series by
// its attributes ("command channel outcome stage code"), the duration
// observations by "command outcome".
func collect(t *testing.T, reader *sdkmetric.ManualReader) (calls map[string]int64, durations map[string]uint64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	calls, durations = map[string]int64{}, map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != "mandate/executor" {
			t.Errorf("metrics of scope %q", sm.Scope.Name)
			continue
		}
		for _, m := range sm.Metrics {
			switch m.Name {
			case executor.MetricCalls:
				sum, ok := m.Data.(metricdata.Sum[int64])
				if !ok || !sum.IsMonotonic {
					t.Fatalf("%s is %T, want a monotonic int64 sum", m.Name, m.Data)
				}
				for _, dp := range sum.DataPoints {
					calls[key(dp.Attributes, executor.AttrCommand, executor.AttrChannel, executor.AttrOutcome, executor.AttrStage, executor.AttrCode)] += dp.Value
				}
			case executor.MetricDuration:
				for _, dp := range seconds(t, m).DataPoints {
					if dp.Attributes.Len() != 2 {
						t.Errorf("%s has attributes %v, want command and outcome only", m.Name, dp.Attributes.ToSlice())
					}
					durations[key(dp.Attributes, executor.AttrCommand, executor.AttrOutcome)] += dp.Count
				}
			case executor.MetricSpooled:
				sum, ok := m.Data.(metricdata.Sum[int64])
				if !ok || !sum.IsMonotonic {
					t.Fatalf("%s is %T, want a monotonic int64 sum", m.Name, m.Data)
				}
				for _, dp := range sum.DataPoints {
					calls["spooled"] += dp.Value
				}
			case executor.MetricResumed:
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					calls["resumed"] += dp.Value
				}
			case executor.MetricRelayLag:
				// One series, no attributes (TestTheRelayRecordsHowLongRowsWaited).
				for _, dp := range seconds(t, m).DataPoints {
					if dp.Attributes.Len() != 0 {
						t.Errorf("%s has attributes %v, want none", m.Name, dp.Attributes.ToSlice())
					}
				}
			default:
				t.Errorf("unexpected metric %q", m.Name)
			}
		}
	}
	return calls, durations
}

// key joins the values of keys in set, "-" for an absent one, and fails on
// attributes beyond keys (the series' cardinality is what it declares).
func key(set attribute.Set, keys ...string) string {
	var b bytes.Buffer
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		if v, ok := set.Value(attribute.Key(k)); ok {
			b.WriteString(v.AsString())
		} else {
			b.WriteByte('-')
		}
	}
	if set.Len() > len(keys) {
		b.WriteString(" +extra")
	}
	return b.String()
}

// seconds is m, which must be a float64 histogram in seconds.
func seconds(t *testing.T, m metricdata.Metrics) metricdata.Histogram[float64] {
	t.Helper()
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok || m.Unit != "s" {
		t.Fatalf("%s is %T in %q, want a float64 histogram in seconds", m.Name, m.Data, m.Unit)
	}
	return h
}

// TestExecutorCountsEveryCallOnce: each Execute moves
// mandate.executor.calls once, in the series of how it ended — executed,
// refused (with the refusing stage and code), replayed, failed — and
// records its duration by command and outcome.
func TestExecutorCountsEveryCallOnce(t *testing.T) { eachStore(t, testExecutorCountsEveryCallOnce) }

func testExecutorCountsEveryCallOnce(t *testing.T, st stores) {
	outbox := &spoolDown{}
	e, reader := meteredStart(t, st, func(c *executor.Config) {
		outbox.Store = c.Store
		c.Store = outbox
	})
	alice := as(token(t, "acme", "alice", ""))

	// executed, over gRPC and over REST.
	if _, err := e.execute(t, alice, "ticket.search", `{"query":"charged twice"}`); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+e.exec.HTTPAddr()+"/v1/commands/ticket.search:execute",
		bytes.NewBufferString(`{"input":{"query":"charged twice"}}`))
	req.Header.Set("Authorization", "Bearer "+token(t, "acme", "alice", ""))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("REST search: %s", resp.Status)
	}
	// refused at permission_check: the agent lacks payment.refund.
	_, err = e.execute(t, as(token(t, "acme", "alice", "support-bot")), "ticket.refund", refundInput)
	if ce := refusal(err); ce.GetStage() != "permission_check" || ce.GetCode() != "authorization.permission_denied" {
		t.Fatalf("refund by support-bot: %v", err)
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("the payment gateway counted %d refunds", n)
	}
	// refused before the command is known: reported as "unknown".
	if _, err = e.execute(t, alice, "ticket.delete", `{}`); refusal(err).GetCode() != "command.not_found" {
		t.Fatalf("ticket.delete: %v", err)
	}
	// executed, then replayed by its idempotency key.
	if _, err := e.execute(t, alice, "expense.report.create", createInput, withKey("metrics-1")); err != nil {
		t.Fatal(err)
	}
	replay, err := e.execute(t, alice, "expense.report.create", createInput, withKey("metrics-1"))
	if err != nil || !replay.GetReplayed() {
		t.Fatalf("replay: %v %v", replay, err)
	}
	// Outcome rows of dispatched and replayed calls are written after the
	// reply: let all 9 rows above land before the store goes away, so that
	// only the next call's row is held.
	for deadline := time.Now().Add(10 * time.Second); e.rowCount(t, "acme") < 9 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	// failed: the executor's store takes no intent, so nothing is
	// dispatched.
	outbox.down.Store(true)
	if _, err = e.execute(t, alice, "ticket.search", `{}`); refusal(err).GetCode() != "audit.unavailable" {
		t.Fatalf("search without a durable intent: %v", err)
	}

	calls, durations := collect(t, reader)
	wantCalls := map[string]int64{
		"ticket.search grpc executed - -":                                             1,
		"ticket.search rest executed - -":                                             1,
		"ticket.refund grpc refused permission_check authorization.permission_denied": 1,
		"unknown grpc refused load_definition command.not_found":                      1,
		"expense.report.create grpc executed - -":                                     1,
		"expense.report.create grpc replayed idempotency_check idempotency.replayed":  1,
		"ticket.search grpc failed audit audit.unavailable":                           1,
		// That attempt's row is held for the trail (the store takes none).
		"spooled": 1,
	}
	for k, n := range wantCalls {
		if calls[k] != n {
			t.Errorf("calls{%s} = %d, want %d", k, calls[k], n)
		}
	}
	for k, n := range calls {
		if _, ok := wantCalls[k]; !ok {
			t.Errorf("unexpected series calls{%s} = %d", k, n)
		}
	}
	wantDurations := map[string]uint64{
		"ticket.search executed":         2,
		"ticket.refund refused":          1,
		"unknown refused":                1,
		"expense.report.create executed": 1,
		"expense.report.create replayed": 1,
		"ticket.search failed":           1,
	}
	for k, n := range wantDurations {
		if durations[k] != n {
			t.Errorf("duration{%s} has %d observations, want %d", k, durations[k], n)
		}
	}
	if len(durations) != len(wantDurations) {
		t.Errorf("duration series %v, want %v", durations, wantDurations)
	}
}

// TestTheRelayRecordsHowLongRowsWaited: every row the relay appends to the
// trail is one observation of mandate.executor.audit.relay_lag, from its
// commit in the outbox to the trail's answer — here each search's intent
// and outcome, with a linger of 100ms, which the intent waits out in full.
func TestTheRelayRecordsHowLongRowsWaited(t *testing.T) {
	const linger = 100 * time.Millisecond
	e, reader := meteredStart(t, memoryStores, func(c *executor.Config) {
		c.SpoolInterval = time.Hour
		c.RelayLinger = linger
	})
	const calls = 3
	for range calls {
		inv, err := searchAs(t, e.pipeline)
		if err != nil {
			t.Fatal(err)
		}
		waitRows(t, e.audit, "acme", inv, 2)
	}
	// The trail holds a row before the relay has its answer, so the last
	// observations can trail the rows by a moment: poll for them.
	var lag *metricdata.HistogramDataPoint[float64]
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		lag = relayLag(t, reader)
		if (lag != nil && lag.Count >= 2*calls) || time.Now().After(deadline) {
			break
		}
	}
	if lag == nil {
		t.Fatalf("no %s", executor.MetricRelayLag)
	}
	maxLag, _ := lag.Max.Value()
	if lag.Count != 2*calls || maxLag < linger.Seconds() {
		t.Fatalf("%s: %d rows, longest %.3fs; want %d rows, the longest at least the linger", executor.MetricRelayLag, lag.Count, maxLag, 2*calls)
	}
}

// relayLag is the one data point of mandate.executor.audit.relay_lag, or nil.
func relayLag(t *testing.T, reader *sdkmetric.ManualReader) *metricdata.HistogramDataPoint[float64] {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == executor.MetricRelayLag {
				if h, ok := m.Data.(metricdata.Histogram[float64]); ok && len(h.DataPoints) == 1 {
					return &h.DataPoints[0]
				}
			}
		}
	}
	return nil
}
