package executor

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// Metrics the executor records, once per Execute, with the meter
// "mandate/executor".
const (
	// MetricCalls counts calls by command, channel, outcome and, unless
	// the call executed, the stage and code it ended with.
	MetricCalls = "mandate.executor.calls"
	// MetricDuration is the time Execute took, in seconds, by command and
	// outcome.
	MetricDuration = "mandate.executor.duration"
	// MetricSpooled counts audit rows the executor spooled because the
	// audit trail was unavailable (they are appended once it is back).
	MetricSpooled = "mandate.executor.audit.spooled"
	// MetricDeadLettered counts audit rows the trail refused outright,
	// kept in the executor's dead letter until an operator re-drives them
	// (`mandate audit dead-letters`). Anything above zero needs a look.
	MetricDeadLettered = "mandate.executor.audit.dead_lettered"
	// MetricResumed counts approved calls (and checks) that resumed from
	// their parked arguments instead of decoding them again
	// (docs/architecture/confirmation.md, "An approved call resumes"), by
	// command.
	MetricResumed = "mandate.executor.resumed"
	// MetricRelayLag is, for every audit row the relay appends to the
	// trail, the time from when it was made durable in the executor's
	// outbox to when the trail took it, in seconds: a row is queryable
	// within it of being written (its p99 is the answer to "within a
	// second of its call"; --audit-relay-linger is part of it).
	MetricRelayLag = "mandate.executor.audit.relay_lag"
)

// Attribute keys of the executor's metrics.
const (
	AttrCommand = "command"
	AttrChannel = "channel"
	AttrOutcome = "outcome"
	AttrStage   = "stage"
	AttrCode    = "code"
)

const (
	meterName = "mandate/executor"
	// unknown stands for a command the manifest does not declare and a
	// channel the executor does not know.
	unknown = "unknown"
	// otherCode replaces the code of a new series once maxSeries exist:
	// codes a backend reports are the only unbounded attribute.
	otherCode = "other"
	maxSeries = 1024
)

// channels are the channels a call can arrive by.
var channels = []string{"grpc", "rest", "mcp"}

// durationBuckets span a cache hit to the default backend deadline.
var durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// ending is how a call ended, as its metrics report it.
type ending struct {
	outcome     string
	stage, code string
}

type seriesKey struct {
	command, channel string
	ending
}

// series holds the prebuilt attribute sets of one series, so recording a
// call allocates nothing once its series exists.
type series struct {
	calls    metric.AddOption
	duration metric.RecordOption
}

// metrics records the calls of one Executor.
type metrics struct {
	calls    metric.Int64Counter
	duration metric.Float64Histogram
	spooled  metric.Int64Counter
	dead     metric.Int64Counter
	resumed  metric.Int64Counter
	lag      metric.Float64Histogram
	commands map[string]bool

	mu     sync.RWMutex
	series map[seriesKey]series
}

func newMetrics(mp metric.MeterProvider, set *manifest.Set) (*metrics, error) {
	meter := mp.Meter(meterName)
	calls, err := meter.Int64Counter(MetricCalls, metric.WithUnit("{call}"),
		metric.WithDescription("Command calls through the pipeline, by command, channel, outcome, and the stage and code a call that did not execute ended with."))
	if err != nil {
		return nil, err
	}
	duration, err := meter.Float64Histogram(MetricDuration, metric.WithUnit("s"),
		metric.WithDescription("Time a call spent in the pipeline, by command and outcome."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		return nil, err
	}
	spooled, err := meter.Int64Counter(MetricSpooled, metric.WithUnit("{row}"),
		metric.WithDescription("Audit rows spooled while the audit trail was unavailable, to be appended once it is back."))
	if err != nil {
		return nil, err
	}
	dead, err := meter.Int64Counter(MetricDeadLettered, metric.WithUnit("{row}"),
		metric.WithDescription("Audit rows the trail refused outright, kept in the executor's dead letter until an operator re-drives them."))
	if err != nil {
		return nil, err
	}
	resumed, err := meter.Int64Counter(MetricResumed, metric.WithUnit("{call}"),
		metric.WithDescription("Approved calls that resumed from their parked arguments instead of decoding them again, by command."))
	if err != nil {
		return nil, err
	}
	lag, err := meter.Float64Histogram(MetricRelayLag, metric.WithUnit("s"),
		metric.WithDescription("Time from an audit row's commit in the executor's outbox to its append to the audit trail."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		return nil, err
	}
	m := &metrics{calls: calls, duration: duration, spooled: spooled, dead: dead, resumed: resumed, lag: lag, commands: map[string]bool{}, series: map[seriesKey]series{}}
	for _, c := range set.Commands() {
		m.commands[c.Code] = true
		for _, ch := range channels {
			k := seriesKey{command: c.Code, channel: ch, ending: ending{outcome: contract.OutcomeExecuted}}
			m.series[k] = k.build()
		}
	}
	return m, nil
}

// record counts one call and its duration.
func (m *metrics) record(ctx context.Context, call Call, end ending, elapsed time.Duration) {
	k := seriesKey{command: call.Code, channel: call.Channel, ending: end}
	if !m.commands[k.command] {
		k.command = unknown
	}
	switch k.channel {
	case "grpc", "rest", "mcp":
	default:
		k.channel = unknown
	}
	s := m.lookup(k)
	m.calls.Add(ctx, 1, s.calls)
	m.duration.Record(ctx, elapsed.Seconds(), s.duration)
}

// relayed records the lag of rows spooled at times, appended to the trail
// now.
func (m *metrics) relayed(ctx context.Context, now time.Time, times ...time.Time) {
	for _, at := range times {
		if !at.IsZero() {
			m.lag.Record(ctx, max(now.Sub(at), 0).Seconds())
		}
	}
}

// lookup returns the series of k, building it on first use; once maxSeries
// exist, a new one is reported with the code "other".
func (m *metrics) lookup(k seriesKey) series {
	m.mu.RLock()
	s, ok := m.series[k]
	full := len(m.series) >= maxSeries
	m.mu.RUnlock()
	if ok {
		return s
	}
	if full {
		k.code = otherCode
		m.mu.RLock()
		s, ok = m.series[k]
		m.mu.RUnlock()
		if ok {
			return s
		}
		return k.build()
	}
	s = k.build()
	m.mu.Lock()
	if len(m.series) < maxSeries {
		m.series[k] = s
	}
	m.mu.Unlock()
	return s
}

func (k seriesKey) build() series {
	attrs := []attribute.KeyValue{
		attribute.String(AttrCommand, k.command),
		attribute.String(AttrChannel, k.channel),
		attribute.String(AttrOutcome, string(k.outcome)),
	}
	if k.stage != "" {
		attrs = append(attrs, attribute.String(AttrStage, k.stage))
	}
	if k.code != "" {
		attrs = append(attrs, attribute.String(AttrCode, k.code))
	}
	return series{
		calls: metric.WithAttributeSet(attribute.NewSet(attrs...)),
		duration: metric.WithAttributeSet(attribute.NewSet(
			attribute.String(AttrCommand, k.command), attribute.String(AttrOutcome, string(k.outcome)))),
	}
}

// endingOf is how a call that returned res and err ended: as the pipeline
// recorded it (refuseWith, fault, outcomeAsync), else executed, else a
// failure with the error's stage and code.
func endingOf(inv *invocation, err error) ending {
	if inv.ending.outcome != "" {
		return inv.ending
	}
	if err == nil {
		return ending{outcome: contract.OutcomeExecuted}
	}
	end := ending{outcome: contract.OutcomeFailed, code: failure.CodeInternalError}
	var fe *failure.Error
	if errors.As(err, &fe) {
		end.stage, end.code = fe.Stage, fe.Code
	}
	return end
}

// resumedAttrs are the attributes of MetricResumed for command.
func (m *metrics) resumedAttrs(command string) metric.AddOption {
	if !m.commands[command] {
		command = unknown
	}
	return metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrCommand, command)))
}
