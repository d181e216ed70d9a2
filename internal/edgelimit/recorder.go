package edgelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// Appender is the part of the audit service's client a Recorder needs:
// mandatev1.AuditServiceClient implements it.
type Appender interface {
	Append(ctx context.Context, in *mandatev1.AppendRequest, opts ...grpc.CallOption) (*mandatev1.AppendResponse, error)
}

// Defaults of RecorderConfig.
const (
	// DefaultRowRate is the refusal rows per second one principal's
	// refusals may add to the trail, sustained.
	DefaultRowRate = 5
	// DefaultRowBurst is how many refusal rows one principal may add at
	// once before its refusals are counted instead.
	DefaultRowBurst = 50
	// DefaultFlushInterval is how often queued rows and counts are
	// appended.
	DefaultFlushInterval = time.Second
	// DefaultMaxQueued bounds the rows waiting to be appended.
	DefaultMaxQueued = 10000
	// appendBatch is the most records one Append carries
	// (AppendRequest.records' max_items).
	appendBatch = 500
	// appendTimeout bounds one Append.
	appendTimeout = 5 * time.Second
)

// RecorderConfig configures a Recorder.
type RecorderConfig struct {
	// Audit appends the rows on the edge service's own authority (the
	// executor, the MCP bridge); each row names its tenant. Required.
	Audit Appender
	// RowRate and RowBurst bound the rows of one principal (defaults
	// DefaultRowRate, DefaultRowBurst).
	RowRate  float64
	RowBurst int
	// MaxKeys bounds the principals tracked (default DefaultMaxKeys).
	MaxKeys int
	// FlushInterval is how often Run appends (default
	// DefaultFlushInterval).
	FlushInterval time.Duration
	// MaxQueued bounds the rows waiting for a flush (default
	// DefaultMaxQueued).
	MaxQueued int
	// Now reads the clock (default time.Now).
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// RateLimited is the refusal of a request past its principal's edge limit
// (the REST gateway's, the MCP bridge's), which may be made again after
// retry.
func RateLimited(retry time.Duration) *failure.Error {
	spec, _ := failure.Lookup(failure.CodeRateLimited)
	e := failure.New(failure.StageRequest, failure.CodeRateLimited,
		"too many requests from this caller; slow down (try again in "+strconv.Itoa(failure.RetryAfterSeconds(retry))+" s)")
	e.Retriable, e.Remedy, e.RetryAfter = spec.Retriable, spec.Remedy, retry
	return e
}

// Refusal is one request refused at the edge.
type Refusal struct {
	// Principal is who was refused, as authenticated.
	Principal identity.Principal
	// Channel is contract.ChannelMCP or contract.ChannelREST.
	Channel string
	// Code is the refusal's code (rate.limited, session.too_many), Message
	// what the caller was told.
	Code, Message string
	// Session is the MCP session the request named, if any.
	Session string
}

// Recorder writes the audit rows of edge refusals: one row per refusal
// while a principal's rows stay within RowRate and RowBurst, and past that
// one row per principal, code and flush counting the refusals it did not
// record one by one. Record never blocks on the audit service; Run appends.
// It is safe for concurrent use.
type Recorder struct {
	cfg  RecorderConfig
	rows *Limiter
	log  *slog.Logger

	mu         sync.Mutex
	queued     []*mandatev1.AuditRecord
	counted    map[string]*counted // by Key and code
	overflowed int                 // refusals neither queued nor counted (bounds full)
	unfiled    int                 // refusals without a tenant: no row
}

// counted are the refusals of one principal and code past its row budget.
type counted struct {
	first       Refusal
	n           int
	since, last time.Time
}

// NewRecorder returns a Recorder; run it with Run.
func NewRecorder(cfg RecorderConfig) (*Recorder, error) {
	if cfg.Audit == nil {
		return nil, fmt.Errorf("edgelimit: RecorderConfig.Audit is required")
	}
	if cfg.RowRate <= 0 {
		cfg.RowRate = DefaultRowRate
	}
	if cfg.RowBurst <= 0 {
		cfg.RowBurst = DefaultRowBurst
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = DefaultFlushInterval
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = DefaultMaxQueued
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Recorder{
		cfg:     cfg,
		rows:    New(Config{Rate: cfg.RowRate, Burst: cfg.RowBurst, MaxKeys: cfg.MaxKeys, Now: cfg.Now}),
		log:     cfg.Logger,
		counted: map[string]*counted{},
	}, nil
}

// Record queues the row of one refusal, or counts it once the principal's
// rows are past their budget. A refusal whose principal names no tenant
// (it did not authenticate) has no chain to go in: it is only counted, and
// logged at the next flush.
func (r *Recorder) Record(ref Refusal) {
	if r == nil {
		return
	}
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if ref.Principal.Tenant == "" {
		r.unfiled++
		return
	}
	key := Key(ref.Principal)
	if ok, _ := r.rows.Allow(key); ok && len(r.queued) < r.cfg.MaxQueued {
		r.queued = append(r.queued, row(ref, now, ref.Message))
		return
	}
	ck := key + "\x00" + ref.Code
	c, ok := r.counted[ck]
	switch {
	case ok:
		c.n++
		c.last = now
	case len(r.counted) < r.cfg.MaxKeys:
		r.counted[ck] = &counted{first: ref, n: 1, since: now, last: now}
	default:
		r.overflowed++
	}
}

// Run appends what is queued every FlushInterval until ctx ends, then once
// more. It returns nil.
func (r *Recorder) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = r.Flush(context.WithoutCancel(ctx))
			return nil
		case <-t.C:
			_ = r.Flush(ctx)
		}
	}
}

// Flush appends the queued rows and one row per count, and logs what could
// not be filed. Rows the audit service did not take are queued again, as
// far as MaxQueued allows; the rest are logged and dropped.
func (r *Recorder) Flush(ctx context.Context) error {
	r.mu.Lock()
	recs := r.queued
	r.queued = nil
	for _, c := range r.counted {
		msg := fmt.Sprintf("%d more refusals (%s) of this principal from %s to %s, recorded here together rather than one by one",
			c.n, c.first.Code, c.since.UTC().Format(time.RFC3339), c.last.UTC().Format(time.RFC3339))
		recs = append(recs, row(c.first, c.last, msg))
	}
	clear(r.counted)
	overflowed, unfiled := r.overflowed, r.unfiled
	r.overflowed, r.unfiled = 0, 0
	r.mu.Unlock()
	if unfiled > 0 {
		r.log.WarnContext(ctx, "edge refusals of requests that did not authenticate: no audit row (no tenant)", "refusals", unfiled)
	}
	if overflowed > 0 {
		r.log.ErrorContext(ctx, "edge refusals not recorded: too many principals refused at once", "refusals", overflowed)
	}
	var firstErr error
	for len(recs) > 0 {
		n := min(len(recs), appendBatch)
		batch := recs[:n]
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), appendTimeout)
		_, err := r.cfg.Audit.Append(actx, &mandatev1.AppendRequest{Records: batch})
		cancel()
		if err != nil {
			firstErr = err
			r.requeue(ctx, recs, err)
			break
		}
		recs = recs[n:]
	}
	return firstErr
}

// requeue puts rows the audit service did not take back in front of the
// queue, within MaxQueued; the rest are logged, whole, and dropped.
func (r *Recorder) requeue(ctx context.Context, recs []*mandatev1.AuditRecord, err error) {
	r.mu.Lock()
	room := max(r.cfg.MaxQueued-len(r.queued), 0)
	keep := recs[:min(len(recs), room)]
	r.queued = append(append([]*mandatev1.AuditRecord(nil), keep...), r.queued...)
	r.mu.Unlock()
	r.log.WarnContext(ctx, "edge refusal rows not appended: queued again", "rows", len(keep), "error", err)
	for _, rec := range recs[len(keep):] {
		r.log.ErrorContext(ctx, "edge refusal row dropped: the queue is full", "tenant", rec.GetTenant(), "invocation_id", rec.GetInvocationId(),
			"user", rec.GetUserId(), "agent", rec.GetAgentId(), "code", rec.GetCode(), "time", rec.GetTime().AsTime())
	}
}

// Queued is how many rows wait for the next flush.
func (r *Recorder) Queued() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queued)
}

// row is the audit row of a refusal: phase outcome, refused at
// request_check with its code, no command (the request was not read).
func row(ref Refusal, at time.Time, message string) *mandatev1.AuditRecord {
	p := ref.Principal
	return &mandatev1.AuditRecord{
		InvocationId: newID(), Phase: contract.PhaseOutcome, Time: timestamppb.New(at), Tenant: p.Tenant,
		Channel: ref.Channel, UserId: p.UserID, ActorKind: actorKind(p), AgentId: p.AgentID,
		Model: p.Model, ModelVersion: p.ModelVersion, McpSessionId: ref.Session,
		Outcome: contract.OutcomeRefused, Stage: failure.StageRequest, Code: ref.Code, Message: message,
	}
}

func actorKind(p identity.Principal) string {
	switch {
	case p.Kind == identity.KindAgent || p.AgentID != "":
		return contract.ActorAgent
	case p.Kind == identity.KindService && p.UserID == "":
		return contract.ActorService
	}
	return contract.ActorUser
}

// newID is a fresh invocation id, of the executor's shape.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "inv_" + hex.EncodeToString(b[:])
}
