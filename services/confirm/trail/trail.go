// Package trail records the confirm service's decision attempts in the
// audit trail: one row of phase decision per attempt to approve or decline
// a challenge, accepted or refused, appended through the audit service's
// API on the confirm service's own authority (each row names its tenant).
//
// A row is appended while the decision is answered, so that a decider who
// saw a refusal finds its row. When the audit service does not take it, the
// row is held in memory and appended again, in order, by Run, until it
// goes through; the hold is bounded (Options.MaxHeld): a row that finds it
// full is dropped with an error log line that carries the row, and every
// row held, appended late or dropped moves mandate.confirm.decision_rows.
// Rows still held when Run ends are logged the same way. Appends are
// idempotent on the row's attempt id, so a retry after an answer that was
// lost adds nothing.
package trail

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/confirm"
)

// MetricRows counts decision rows by result (attribute "result").
const MetricRows = "mandate.confirm.decision_rows"

// Results of MetricRows.
const (
	// ResultAppended: the audit trail took the row when the decision was
	// answered.
	ResultAppended = "appended"
	// ResultHeld: it did not; the row is held for Run to append.
	ResultHeld = "held"
	// ResultRetried: a held row went through later.
	ResultRetried = "retried"
	// ResultDropped: the hold was full, or Run ended with the row still
	// held; the row is in the log line that says so.
	ResultDropped = "dropped"
)

// Defaults of Options.
const (
	DefaultMaxHeld       = 10000
	DefaultAppendTimeout = 3 * time.Second
	DefaultRetryInterval = time.Second
	maxRetryInterval     = 30 * time.Second
	// batch bounds the rows of one retried append.
	batch = 100
)

// Options configure a Trail.
type Options struct {
	// Audit is the audit service, dialled as the confirm service. Required.
	Audit mandatev1.AuditServiceClient
	// MaxHeld bounds the rows held for a retry (default DefaultMaxHeld).
	MaxHeld int
	// AppendTimeout bounds one append (default DefaultAppendTimeout).
	AppendTimeout time.Duration
	// RetryInterval is the first pause between retries of held rows; it
	// doubles up to 30 s while the audit service refuses them (default
	// DefaultRetryInterval).
	RetryInterval time.Duration
	// MeterProvider records MetricRows; default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Trail appends decision rows; it implements confirm.Trail. Run it (Run)
// for held rows to be retried.
type Trail struct {
	o    Options
	log  *slog.Logger
	rows metric.Int64Counter
	by   map[string][]metric.AddOption

	mu   sync.Mutex
	held []*mandatev1.AuditRecord
	wake chan struct{}
}

// New returns a trail over the audit service.
func New(o Options) *Trail {
	if o.MaxHeld <= 0 {
		o.MaxHeld = DefaultMaxHeld
	}
	if o.AppendTimeout <= 0 {
		o.AppendTimeout = DefaultAppendTimeout
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = DefaultRetryInterval
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	t := &Trail{o: o, log: o.Logger, wake: make(chan struct{}, 1), by: map[string][]metric.AddOption{}}
	rows, err := o.MeterProvider.Meter("mandate/confirm").Int64Counter(MetricRows, metric.WithUnit("{record}"),
		metric.WithDescription("Decision rows of the confirm service, by result: appended, held for a retry, retried (appended late) or dropped (logged instead)."))
	if err != nil {
		o.Logger.Warn("decision rows metric unavailable", "error", err)
	}
	t.rows = rows
	for _, r := range []string{ResultAppended, ResultHeld, ResultRetried, ResultDropped} {
		t.by[r] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("result", r)))}
	}
	return t
}

func (t *Trail) count(result string, n int) {
	if t.rows != nil && n > 0 {
		t.rows.Add(context.Background(), int64(n), t.by[result]...)
	}
}

// Held is how many rows wait for a retry.
func (t *Trail) Held() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.held)
}

// Record appends the attempt's row, or holds it for Run when the audit
// service does not take it. While rows are held, a new one queues behind
// them, so that the trail keeps the attempts' order and a decision does
// not wait on an audit service already known to be down.
func (t *Trail) Record(ctx context.Context, a confirm.Attempt) {
	rec := Row(a)
	t.mu.Lock()
	queued := len(t.held) > 0
	if queued {
		t.holdLocked(ctx, rec)
	}
	t.mu.Unlock()
	if queued {
		return
	}
	err := t.append(ctx, []*mandatev1.AuditRecord{rec})
	if err == nil {
		t.count(ResultAppended, 1)
		return
	}
	t.log.WarnContext(ctx, "decision row not appended: held for a retry", "tenant", rec.GetTenant(),
		"attempt_id", rec.GetInvocationId(), "challenge_id", a.ChallengeID, "error", err)
	t.mu.Lock()
	t.holdLocked(ctx, rec)
	t.mu.Unlock()
}

// holdLocked queues rec for Run, or drops it, logged, when the hold is full.
func (t *Trail) holdLocked(ctx context.Context, rec *mandatev1.AuditRecord) {
	if len(t.held) >= t.o.MaxHeld {
		t.drop(ctx, "the hold of decision rows is full", rec)
		return
	}
	t.held = append(t.held, rec)
	t.count(ResultHeld, 1)
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// drop logs a row the trail gives up on, whole, so that the log keeps what
// the audit trail could not.
func (t *Trail) drop(ctx context.Context, why string, rec *mandatev1.AuditRecord) {
	t.count(ResultDropped, 1)
	t.log.ErrorContext(ctx, "decision row dropped: "+why, "tenant", rec.GetTenant(), "attempt_id", rec.GetInvocationId(),
		"challenge_id", rec.GetSubject(), "user", rec.GetUserId(), "agent", rec.GetAgentId(), "outcome", rec.GetOutcome(),
		"code", rec.GetCode(), "time", rec.GetTime().AsTime(), "arguments", rec.GetArgumentsJson())
}

// append appends recs on the confirm service's own authority: a fresh
// context, which carries no caller's token to relay, bounded by
// AppendTimeout; it ends with ctx's cancellation only through that bound.
func (t *Trail) append(_ context.Context, recs []*mandatev1.AuditRecord) error {
	actx, cancel := context.WithTimeout(context.Background(), t.o.AppendTimeout)
	defer cancel()
	_, err := t.o.Audit.Append(actx, &mandatev1.AppendRequest{Records: recs})
	return err
}

// Run appends the held rows, oldest first, until ctx ends; then it tries
// once more (bounded by AppendTimeout) and logs each row still held as
// dropped. It returns nil.
func (t *Trail) Run(ctx context.Context) error {
	pause := t.o.RetryInterval
	timer := time.NewTimer(pause)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			t.flush(context.WithoutCancel(ctx), true)
			return nil
		case <-t.wake:
		case <-timer.C:
		}
		if t.flush(ctx, false) {
			pause = t.o.RetryInterval
		} else {
			pause = min(2*pause, maxRetryInterval)
		}
		timer.Reset(pause)
	}
}

// flush appends held rows in batches until none is left or one fails; it
// reports whether every held row went through. last drops what is left.
func (t *Trail) flush(ctx context.Context, last bool) bool {
	for {
		t.mu.Lock()
		n := min(len(t.held), batch)
		recs := t.held[:n:n]
		t.mu.Unlock()
		if n == 0 {
			return true
		}
		if err := t.append(ctx, recs); err != nil {
			if !last {
				t.log.WarnContext(ctx, "held decision rows not appended yet", "held", t.Held(), "error", err)
				return false
			}
			t.mu.Lock()
			rest := t.held
			t.held = nil
			t.mu.Unlock()
			for _, r := range rest {
				t.drop(ctx, "the confirm service stopped before the audit trail took it", r)
			}
			return false
		}
		t.mu.Lock()
		t.held = t.held[n:]
		if len(t.held) == 0 {
			t.held = nil
		}
		t.mu.Unlock()
		t.count(ResultRetried, n)
		t.log.InfoContext(ctx, "held decision rows appended", "rows", n)
	}
}

// Arguments are what a decision row's arguments_json holds.
type Arguments struct {
	// ChallengeID is the challenge the attempt named.
	ChallengeID string `json:"challenge_id"`
	// InvocationID is the invocation the challenge belongs to; empty when
	// the challenge could not be read.
	InvocationID string `json:"invocation_id,omitempty"`
	// Verdict is approve or decline, empty when neither was asked.
	Verdict string `json:"verdict,omitempty"`
	// Channel is the decision channel asked for, Assurance its assurance.
	Channel   string `json:"decision_channel"`
	Assurance string `json:"assurance"`
	// Via is the service that relayed the decider (the MCP bridge), if any.
	Via string `json:"via,omitempty"`
}

// Row is the audit row of an attempt: phase decision, the attempt's id as
// its invocation id, the challenge's id as its subject, the challenge's
// command and risk when it was read, the decider (user, actor kind, agent,
// model), the outcome (approved, declined, or refused with stage and
// code), and Arguments.
func Row(a confirm.Attempt) *mandatev1.AuditRecord {
	p := a.Decider
	args := Arguments{ChallengeID: a.ChallengeID, Verdict: a.Verdict, Channel: a.Channel, Assurance: a.Assurance(), Via: p.Via}
	rec := &mandatev1.AuditRecord{
		InvocationId: a.ID, Phase: contract.PhaseDecision, Tenant: p.Tenant, Channel: transport(a.Channel, p),
		Subject: a.ChallengeID, UserId: p.UserID, ActorKind: actorKind(p), AgentId: p.AgentID,
		Model: p.Model, ModelVersion: p.ModelVersion,
		Outcome: a.Outcome(), Stage: a.Stage(), Code: a.Code, Message: a.Message,
	}
	if !a.Time.IsZero() {
		rec.Time = timestamppb.New(a.Time)
	}
	if c := a.Challenge; c != nil {
		rec.Command, rec.Risk = c.Command, c.Risk
		args.InvocationID = c.InvocationID
	}
	b, _ := json.Marshal(args) // plain strings: never fails
	rec.ArgumentsJson = string(b)
	return rec
}

// transport is the audit channel the attempt came in on: the approval page
// is HTTP, an answer the MCP bridge relays is MCP, anything else reached
// the API over gRPC (REST reaches it through the gateway) — a channel
// claimed without the bridge included.
func transport(channel string, p identity.Principal) string {
	switch {
	case channel == confirm.ChannelApprovalPage:
		return contract.ChannelREST
	case p.Via == identity.MCPBridgeService:
		return contract.ChannelMCP
	}
	return contract.ChannelGRPC
}

func actorKind(p identity.Principal) string {
	switch {
	case p.Kind == identity.KindAgent || p.AgentID != "":
		return contract.ActorAgent
	case p.Kind == identity.KindUser:
		return contract.ActorUser
	case p.Kind == identity.KindService:
		return contract.ActorService
	}
	return ""
}
