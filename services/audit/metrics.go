package audit

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metrics a [Writer] records with the meter "mandate/audit", once per store transaction.
const (
	// MetricRecords counts the records of the transactions a Writer ran, by result: committed,
	// or failed after every attempt.
	MetricRecords = "mandate.audit.records"
	// MetricBatchSize is the number of records per transaction (group commit at work).
	MetricBatchSize = "mandate.audit.batch.size"
)

// Results of MetricRecords (attribute "result").
const (
	ResultCommitted = "committed"
	ResultFailed    = "failed"
)

var batchBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}

// writerMetrics are a Writer's instruments and prebuilt attribute sets. The options are kept as
// slices: passed with ..., a prebuilt slice costs nothing, while a variadic call through the
// instrument's interface would allocate one on every transaction.
type writerMetrics struct {
	records             metric.Int64Counter
	batchSize           metric.Int64Histogram
	committed, failed   []metric.AddOption
	committedB, failedB []metric.RecordOption
}

func newWriterMetrics(mp metric.MeterProvider) (*writerMetrics, error) {
	meter := mp.Meter("mandate/audit")
	records, err := meter.Int64Counter(MetricRecords, metric.WithUnit("{record}"),
		metric.WithDescription("Audit records appended, by result: committed, or failed after every attempt."))
	if err != nil {
		return nil, err
	}
	batch, err := meter.Int64Histogram(MetricBatchSize, metric.WithUnit("{record}"),
		metric.WithDescription("Records per audit store transaction."), metric.WithExplicitBucketBoundaries(batchBuckets...))
	if err != nil {
		return nil, err
	}
	committed := metric.WithAttributeSet(attribute.NewSet(attribute.String("result", ResultCommitted)))
	failed := metric.WithAttributeSet(attribute.NewSet(attribute.String("result", ResultFailed)))
	return &writerMetrics{
		records: records, batchSize: batch,
		committed: []metric.AddOption{committed}, failed: []metric.AddOption{failed},
		committedB: []metric.RecordOption{committed}, failedB: []metric.RecordOption{failed},
	}, nil
}

// transaction records one store transaction of n records.
func (m *writerMetrics) transaction(n int, err error) {
	ctx := context.Background()
	if err != nil {
		m.records.Add(ctx, int64(n), m.failed...)
		m.batchSize.Record(ctx, int64(n), m.failedB...)
		return
	}
	m.records.Add(ctx, int64(n), m.committed...)
	m.batchSize.Record(ctx, int64(n), m.committedB...)
}
