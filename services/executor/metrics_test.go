package executor

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/manifest"
)

func newTestMetrics(tb testing.TB) (*metrics, *sdkmetric.ManualReader) {
	tb.Helper()
	set, err := manifest.Embedded()
	if err != nil {
		tb.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	m, err := newMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), set)
	if err != nil {
		tb.Fatal(err)
	}
	return m, reader
}

// TestCodesBeyondTheSeriesBoundAreOther: a backend may report any code;
// once maxSeries series exist, calls ending with a new code are counted
// under "other", and nothing else changes (command, channel, stage kept).
func TestCodesBeyondTheSeriesBoundAreOther(t *testing.T) {
	m, reader := newTestMetrics(t)
	const calls = 2 * maxSeries
	for i := range calls {
		m.record(context.Background(), Call{Code: "ticket.refund", Channel: "mcp"},
			ending{outcome: contract.OutcomeRefused, stage: "state_check", code: fmt.Sprintf("ticket.state_%d", i)}, time.Millisecond)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var series, other, total int64
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != MetricCalls {
				continue
			}
			for _, dp := range mt.Data.(metricdata.Sum[int64]).DataPoints {
				series++
				total += dp.Value
				code, _ := dp.Attributes.Value(AttrCode)
				cmd, _ := dp.Attributes.Value(AttrCommand)
				stage, _ := dp.Attributes.Value(AttrStage)
				if cmd.AsString() != "ticket.refund" || stage.AsString() != "state_check" {
					t.Fatalf("series %v", dp.Attributes.ToSlice())
				}
				if code.AsString() == otherCode {
					other = dp.Value
				}
			}
		}
	}
	// The executed series of every command and channel exist from the
	// start (not counted until used); the rest of the bound went to codes.
	prebuilt := int64(len(m.commands) * len(channels))
	if wantSeries := maxSeries - prebuilt + 1; series != wantSeries || total != calls || other != calls-(wantSeries-1) {
		t.Fatalf("%d series (want %d), %d calls (want %d), %d under %q", series, wantSeries, total, calls, other, otherCode)
	}
}

// TestUnknownCommandAndChannel: what the manifest and the executor do not
// know is reported as "unknown", not as the caller spelled it.
func TestUnknownCommandAndChannel(t *testing.T) {
	m, reader := newTestMetrics(t)
	m.record(context.Background(), Call{Code: "drop table", Channel: "carrier-pigeon"},
		ending{outcome: contract.OutcomeRefused, stage: StageLoad, code: "command.not_found"}, time.Millisecond)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	want := attribute.NewSet(attribute.String(AttrCommand, unknown), attribute.String(AttrChannel, unknown),
		attribute.String(AttrOutcome, "refused"), attribute.String(AttrStage, StageLoad), attribute.String(AttrCode, "command.not_found"))
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != MetricCalls {
				continue
			}
			dps := mt.Data.(metricdata.Sum[int64]).DataPoints
			if len(dps) != 1 || !dps[0].Attributes.Equals(&want) || dps[0].Value != 1 {
				t.Fatalf("series %+v", dps)
			}
			return
		}
	}
	t.Fatalf("no %s", MetricCalls)
}

// BenchmarkRecordExecuted is the cost Execute pays for its metrics on the
// common path: a prebuilt series.
func BenchmarkRecordExecuted(b *testing.B) {
	m, _ := newTestMetrics(b)
	call := Call{Code: "ticket.search", Channel: "mcp"}
	end := ending{outcome: contract.OutcomeExecuted}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		m.record(ctx, call, end, time.Millisecond)
	}
}

// BenchmarkRecordRefused: a refusal's series, built on its first use.
func BenchmarkRecordRefused(b *testing.B) {
	m, _ := newTestMetrics(b)
	call := Call{Code: "ticket.refund", Channel: "grpc"}
	end := ending{outcome: contract.OutcomeRefused, stage: StagePermission, code: "authorization.permission_denied"}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		m.record(ctx, call, end, time.Millisecond)
	}
}
