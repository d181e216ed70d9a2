// Package executor runs every command call through Mandate's one governed
// pipeline, whatever the channel (MCP, gRPC, REST). The pipeline is the
// ordered table of stages in pipeline.go (one file per stage, named by
// mandate.v1.Stage); after dispatch come the audit outcome and publish.
//
// Each stage is a span and a named refusal. Authorisation comes before
// parsing, so a caller who may not run a command learns nothing about its
// schema; permission is checked before a human is asked, so nobody is
// prompted about a call that would be refused. The audit intent fails
// closed: without it nothing is dispatched.
package executor

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/durationpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/callattr"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/schema"
)

var tracer = otel.Tracer("mandate/executor")

// Stage names (mandate.v1.Stage, through internal/failure). The pipeline's
// order is the table in pipeline.go.
const (
	StageAuthenticate  = failure.StageAuthenticate
	StageRequest       = failure.StageRequest
	StageLoad          = failure.StageLoad
	StageEntitlement   = failure.StageEntitlement
	StagePermission    = failure.StagePermission
	StageSchema        = failure.StageSchema
	StageScope         = failure.StageScope
	StageIdempotency   = failure.StageIdempotency
	StageSoD           = failure.StageSoD
	StageCondition     = failure.StageCondition
	StageBudget        = failure.StageBudget
	StageConfirmation  = failure.StageConfirmation
	StageAudit         = failure.StageAudit
	StageDispatch      = failure.StageDispatch
	StagePublish       = failure.StagePublish
	stageAuditOutcome  = failure.StageAuditOutcome
	defaultIdemTTL     = 24 * time.Hour
	defaultDeadline    = 30 * time.Second
	maxOutcomeAttempts = 8
	// defaultLease is how long an idempotency claim stays held without a
	// renewal; the executor renews its calls' claims every third of it.
	defaultLease = 6 * time.Second
	// outcomeAttemptTimeout bounds one attempt to append an outcome row.
	outcomeAttemptTimeout = 5 * time.Second
)

// AuditClient appends audit rows: the part of the audit service's API
// the executor's pipeline uses. Every row names its tenant.
// mandatev1.NewAuditServiceClient over a connection that carries the
// executor's service credentials (which forward the caller) is one
// implementation, over the network or in process; AuditStream, which
// carries the appends on one stream on the executor's own authority, is
// the one Mandate runs.
type AuditClient interface {
	Append(ctx context.Context, in *mandatev1.AppendRequest, opts ...grpc.CallOption) (*mandatev1.AppendResponse, error)
}

// ConfirmClient opens and redeems confirmations: the part of the confirm
// service's API the executor uses. mandatev1.NewConfirmServiceClient over
// a connection that carries the executor's service credentials is the one
// implementation. The confirm service's refusals are reported at stage
// confirmation_check with its codes.
type ConfirmClient interface {
	Open(ctx context.Context, in *mandatev1.OpenRequest, opts ...grpc.CallOption) (*mandatev1.Challenge, error)
	Redeem(ctx context.Context, in *mandatev1.RedeemRequest, opts ...grpc.CallOption) (*mandatev1.Grant, error)
	Release(ctx context.Context, in *mandatev1.ReleaseRequest, opts ...grpc.CallOption) (*mandatev1.Challenge, error)
	// Get reads a challenge, for a check of a call that carries a grant.
	Get(ctx context.Context, in *mandatev1.ConfirmServiceGetRequest, opts ...grpc.CallOption) (*mandatev1.Challenge, error)
}

// ErrNotSent marks a dispatch error whose call provably never reached the
// backend (e.g. no backend is configured): its outcome is failed, not
// unknown. Dispatchers wrap it (errors.Is).
var ErrNotSent = errors.New("executor: the call was not sent to the backend")

// Dispatcher sends a decoded request to the command's backend.
type Dispatcher interface {
	Dispatch(ctx context.Context, d Dispatch) (Reply, error)
}

// Reply is a backend's answer to a dispatched call: the message, or its
// JSON and wire bytes.
type Reply struct {
	// Message is the answer, decoded; nil when JSON is set.
	Message proto.Message
	// JSON is the result's JSON (schema.MarshalOutput's bytes), written
	// straight from Wire, the answer's wire bytes, by a dispatcher that
	// never decoded them (schema.TranscodeOutput).
	JSON, Wire []byte
}

// Dispatch is one backend call.
type Dispatch struct {
	Command *manifest.Command
	Method  protoreflect.MethodDescriptor
	Request proto.Message
	// Wire, when set, is Request already encoded (its canonical bytes,
	// schema_validate): a dispatcher that sends wire bytes sends these
	// rather than encode Request again.
	Wire           []byte
	InvocationID   string
	IdempotencyKey string
	Deadline       time.Duration
}

// Config wires an Executor.
type Config struct {
	Manifest   *manifest.Set
	Directory  directory.Resolver
	Audit      AuditClient
	Confirm    ConfirmClient
	Dispatcher Dispatcher
	Store      Store
	// ConfirmSideEffects makes every command with declared side effects
	// require confirmation (docs/architecture/confirmation.md, "when the deployment says so").
	ConfirmSideEffects bool
	// IdempotencyTTL is how long a key is remembered (default 24h).
	IdempotencyTTL time.Duration
	// DefaultDeadline bounds a backend call without a declared deadline
	// (default 30s).
	DefaultDeadline time.Duration
	// Limits bound the input the decoder reads.
	Limits schema.Limits
	// OutcomeAttemptTimeout bounds each attempt to append rows to the
	// trail (default 5s): the relay's, and an outcome's appended directly,
	// which is retried a bounded number of times. It bounds the intent's
	// write to the executor's store too (at most 3s), which is not
	// retried: a store that does not take it within it refuses the call
	// (audit.unavailable).
	OutcomeAttemptTimeout time.Duration
	// HeldFile, when set, is where the audit rows still held in memory at
	// shutdown (neither the trail nor the store would take them) are
	// written, fsynced, and read back at the next start (heldfile.go).
	// Without one, a shutdown logs how many it could not keep.
	HeldFile string
	// SpoolInterval is how often the relay reads the outbox of audit rows
	// (the spool) whoever spooled them, besides the rounds every spooled
	// row wakes (default 1s).
	SpoolInterval time.Duration
	// RelayLinger is how long a relay round woken by a spooled row waits
	// for the rows of other calls, and for the outcome of the same call,
	// before it reads the outbox (0, the default: none; StoreRelayLinger
	// suits a store over a database). The intent is durable in the store
	// before dispatch either way; the linger only delays the row's append
	// to the trail, so that one append (one transaction of the audit
	// service, one relay lease, one delete) takes the rows of many calls
	// and an intent goes with its outcome.
	RelayLinger time.Duration
	// Intents, when set, lists intents without outcome, which the
	// executor settles from its backends' receipts every
	// ReconcileInterval (default 30s) once they are older than
	// ReconcileAfter (default 2m; it must exceed the longest a call takes).
	Intents                           IntentSource
	ReconcileAfter, ReconcileInterval time.Duration
	// Lease is how long a call's idempotency claim stays held without a
	// renewal before it counts as abandoned (its executor died) and a
	// retry asks the backend's receipt (default 6s). The executor renews
	// the claims of its running calls every third of it, however long they
	// run.
	Lease  time.Duration
	Logger *slog.Logger
	Now    func() time.Time
	// MeterProvider records the executor's metrics (MetricCalls,
	// MetricDuration); default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Executor runs the pipeline.
type Executor struct {
	cfg     Config
	decoder *schema.Decoder
	log     *slog.Logger
	metrics *metrics
	// sodTargets are the commands some declaration's separation of duties
	// names; only their executions are recorded.
	sodTargets map[string]bool
	// conditions are each command's declared conditions, compiled once
	// (stage_condition.go).
	conditions map[string][]compiledCondition
	// facts are what each command's declaration implies that a call
	// would otherwise derive again: compiled once, here (compileFacts).
	facts map[string]commandFacts
	// limits are each command's declared limits, resolved once
	// (compileLimits).
	limits  map[string][]compiledLimit
	pending chan struct{}
	wg      sync.WaitGroup
	// stop ends the spool flusher (Close).
	stop      chan struct{}
	closeOnce sync.Once
	// stopping is closed as Close begins: rows still being retried go to
	// the spool after their current attempt instead of holding the
	// shutdown for every retry.
	stopping     chan struct{}
	stoppingOnce sync.Once
	spoolWG      sync.WaitGroup
	// outbox commits audit rows in batches and remembers them for the
	// relay (auditoutbox.go).
	outbox *auditOutbox
	// relayWake wakes the spool's flusher (the relay) as soon as a row is
	// spooled, instead of at its next tick.
	relayWake chan struct{}
	// flushMu serialises the relay's rounds (flush).
	flushMu sync.Mutex
	// spoolFailures counts refused flushes per spooled row (flushMu held).
	spoolFailures map[int64]int
	// held are rows neither the trail nor the store would take (spool).
	heldMu sync.Mutex
	held   []*mandatev1.AuditRecord
	// leases are the idempotency claims of running calls (RenewLeases).
	leases leases
}

// New validates cfg and returns an Executor.
func New(cfg Config) (*Executor, error) {
	switch {
	case cfg.Manifest == nil:
		return nil, errors.New("executor: Manifest is required")
	case cfg.Directory == nil:
		return nil, errors.New("executor: Directory is required")
	case cfg.Audit == nil:
		return nil, errors.New("executor: Audit is required")
	case cfg.Confirm == nil:
		return nil, errors.New("executor: Confirm is required")
	case cfg.Dispatcher == nil:
		return nil, errors.New("executor: Dispatcher is required")
	case cfg.Store == nil:
		return nil, errors.New("executor: Store is required")
	}
	if cfg.IdempotencyTTL <= 0 {
		cfg.IdempotencyTTL = defaultIdemTTL
	}
	if cfg.DefaultDeadline <= 0 {
		cfg.DefaultDeadline = defaultDeadline
	}
	if cfg.OutcomeAttemptTimeout <= 0 {
		cfg.OutcomeAttemptTimeout = outcomeAttemptTimeout
	}
	if cfg.SpoolInterval <= 0 {
		cfg.SpoolInterval = defaultSpoolInterval
	}
	cfg.RelayLinger = max(cfg.RelayLinger, 0)
	if cfg.Lease <= 0 {
		cfg.Lease = defaultLease
	}
	if cfg.ReconcileAfter <= 0 {
		cfg.ReconcileAfter = DefaultReconcileAfter
	}
	if cfg.ReconcileInterval <= 0 {
		cfg.ReconcileInterval = DefaultReconcileInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	m, err := newMetrics(cfg.MeterProvider, cfg.Manifest)
	if err != nil {
		return nil, fmt.Errorf("executor: metrics: %w", err)
	}
	dec, err := schema.NewDecoder(cfg.Manifest.Types(), cfg.Limits)
	if err != nil {
		return nil, err
	}
	targets := map[string]bool{}
	for _, c := range cfg.Manifest.Commands() {
		if c.SeparationOfDuties != nil {
			for _, other := range c.SeparationOfDuties.ConflictsWith {
				targets[other] = true
			}
			targets[c.Code] = true
		}
	}
	conds, err := compileConditions(cfg.Manifest)
	if err != nil {
		return nil, err
	}
	lims, err := compileLimits(cfg.Manifest)
	if err != nil {
		return nil, err
	}
	e := &Executor{cfg: cfg, decoder: dec, log: cfg.Logger, metrics: m, sodTargets: targets, conditions: conds, limits: lims, outbox: newAuditOutbox(cfg.Store),
		facts: compileFacts(cfg.Manifest, cfg.DefaultDeadline), pending: make(chan struct{}, 1024),
		leases: leases{held: map[*invocation]*heldLease{}},
		stop:   make(chan struct{}), stopping: make(chan struct{}), spoolFailures: map[int64]int{},
		relayWake: make(chan struct{}, 1)}
	if err := e.loadHeld(); err != nil {
		return nil, err
	}
	if e.outbox.spooler != nil {
		go e.writeOutbox()
	} else {
		close(e.outbox.done)
	}
	e.spoolWG.Add(1)
	go e.relay(e.stop, cfg.SpoolInterval)
	e.spoolWG.Add(1)
	go e.every(e.stop, cfg.Lease/3, "idempotency: renewing the leases of running calls", e.RenewLeases)
	if cfg.Intents != nil {
		e.spoolWG.Add(1)
		go e.every(e.stop, cfg.ReconcileInterval, "reconcile: settling pending intents", e.Reconcile)
	}
	return e, nil
}

// Call is one command invocation as a channel hands it over.
type Call struct {
	Code           string
	Input          []byte
	IdempotencyKey string
	GrantID        string
	ConversationID string
	MCPSessionID   string
	// Channel is "mcp", "grpc" or "rest".
	Channel string
	// Proxy reports that the call came as the command's own RPC (its gRPC
	// method, or its REST route through the gateway) rather than as an
	// ExecuteRequest: a grant then travels in metadata or a header.
	Proxy bool
	// Tenant, when the channel names one, must be the principal's.
	Tenant string
	// InputError, when set, is what the channel found wrong with the input
	// while decoding it (e.g. unknown binary fields); schema_validate
	// refuses with it.
	InputError *schema.InvalidError
	// TraceParent and TraceState are the W3C trace context the caller sent,
	// as sent; request_check refuses a malformed one.
	TraceParent, TraceState string
	// Invalid lists attributes the channel could not even read as strings
	// (e.g. a number as the idempotency key in MCP `_meta`): the call is
	// refused with them, never run as if they were absent.
	Invalid []callattr.Invalid
	// ManifestDigest is the digest of the manifest of the Mandate service
	// that relayed the call (x-mandate-manifest-digest), "" when the caller
	// declared none; request_check refuses one other than the executor's.
	ManifestDigest string
}

// Result is a successful (or replayed) call's outcome.
type Result struct {
	InvocationID string
	// Output is the result as protojson with proto field names.
	Output []byte
	// Message is the decoded result. It is nil on replay, and when the
	// dispatcher wrote Output without decoding the result: Wire then
	// holds the result's wire bytes.
	Message proto.Message
	Wire    []byte
	// AuditID is empty for a call run by this release (the intent's place
	// in the chain is not known when it answers; its rows are found by
	// InvocationID); a replayed response saved by an earlier release keeps
	// the id it was saved with.
	AuditID  string
	Replayed bool
}

// NewInvocationID returns a fresh invocation id.
func NewInvocationID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	// Encoded in place: one allocation, the string.
	out := [len("inv_") + 2*len(b)]byte{'i', 'n', 'v', '_'}
	hex.Encode(out[len("inv_"):], b[:])
	return string(out[:])
}

// invocation is the state one call accumulates through the stages.
type invocation struct {
	id     string
	call   Call
	p      identity.Principal
	cmd    *manifest.Command
	method protoreflect.MethodDescriptor
	req    *dynamicpb.Message
	// withheld are the sensitive argument paths that held a value (set
	// with args).
	withheld []string
	// args is the redacted JSON of the arguments (empty before
	// schema_validate), a string once for every audit row and the
	// confirmation that carry it.
	args      string
	argDigest string
	subject   string
	idem      *IdemKey
	approval  *mandatev1.Approval
	// res is the directory's answer about the principal (authenticate).
	res directory.Resolution
	// canon is the arguments' canonical wire bytes (schema_validate),
	// which the invocation digest covers.
	canon []byte
	// intended: the intent row is durable in the executor's outbox (audit
	// intent), so every later row of the call goes there too, after it,
	// and reaches the trail in that order.
	intended bool
	// undo are the steps the chain runs, latest first, when a stage before
	// dispatch ends the call (onUndo, compensate).
	undo []func(ctx context.Context, e *Executor)
	// preview is what the command's backend said the call would do, asked
	// before a challenge is opened (preflight); nil when it offers none.
	preview *previewed
	// redeemedDigest is the invocation digest a grant was redeemed for
	// (confirmation_check), "" when none was.
	redeemedDigest string
	// priorNotRun: the call that held this idempotency key before provably
	// never ran (its backend fenced it), so a grant it redeemed is not
	// spent (recoverKey).
	priorNotRun bool
	start       time.Time
	traceID     string
	// ending is how the call ended, once a refusal, a fault or an outcome
	// row says so.
	ending ending
	// checking: the call is checked, not run (Executor.Check). Its stages
	// decide and have no effect, and its refusals write no row of their
	// own: the check's row records the verdict.
	checking bool
	// askedBy are the declared conditions that ask a human for this call
	// (condition_check); nil when none does.
	askedBy []*compiledCondition
	// needsApproval is, in check mode, the confirmation the call would need
	// (confirmationVerdict); nil when it needs none.
	needsApproval *failure.Error
	// escalatedBy are the declared limits the call would go past that ask
	// a human instead of refusing (budget_check); nil when none does.
	escalatedBy []*compiledLimit
	// spent is what the call spent of its limits (budget_check), given
	// back if it provably does not run; nil when it spent nothing.
	spent *spent
	// balances are the call's limits as budget_check found them.
	balances []LimitBalance
	// prespent is the spending decided with the key's reservation, on a
	// store that does both in one transaction; nil otherwise.
	prespent *prespent
	// resumed: schema_validate restored the arguments from the call's
	// parked state (resume) rather than decoding them.
	resumed bool
}

// Execute runs one call through the pipeline. Errors are *failure.Error
// values carrying the stage, the code and the invocation id.
func (e *Executor) Execute(ctx context.Context, call Call) (*Result, error) {
	begin := time.Now()
	ctx, inv, span := e.begin(ctx, call, "mandate.execute")
	defer span.End()
	res, err := e.run(ctx, inv)
	// Whatever the way the call ended, its claim is no longer this
	// executor's to renew: it is finished or given back, or — where
	// neither could be written — left to lapse, and a retry asks the
	// receipt.
	e.letGo(inv)
	if err != nil {
		span.SetStatus(codes.Error, failureCode(err))
	}
	e.metrics.record(ctx, call, endingOf(inv, err), time.Since(begin))
	return res, err
}

// begin starts an invocation of call under a span named name (a call run,
// or checked). The span's attributes are set after the start, and only on
// a span that records, so that a call without tracing builds none (the
// SDK's samplers, whichever OTEL_TRACES_SAMPLER picks, do not read them).
func (e *Executor) begin(ctx context.Context, call Call, name string) (context.Context, *invocation, trace.Span) {
	inv := &invocation{id: NewInvocationID(), call: call, start: e.cfg.Now()}
	ctx, span := tracer.Start(ctx, name)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("mandate.invocation_id", inv.id),
			attribute.String("mandate.command", call.Code),
			attribute.String("mandate.channel", call.Channel))
	}
	if tid := span.SpanContext().TraceID(); tid.IsValid() {
		inv.traceID = tid.String()
	}
	return ctx, inv, span
}

// deadline is how long a dispatch of cmd may take: its declared deadline,
// or the executor's default.
func (e *Executor) deadline(cmd *manifest.Command) time.Duration {
	if f, ok := e.facts[cmd.Code]; ok {
		return f.deadline
	}
	return declaredDeadline(cmd, e.cfg.DefaultDeadline)
}

// commandFacts is what a command's declaration implies for every call of
// it, compiled once when the executor starts rather than per call.
type commandFacts struct {
	// deadline is how long a dispatch may take.
	deadline time.Duration
	// inputSensitive are the JSON paths of the request's sensitive fields,
	// withheld from the audit and the approver's prompt (which reads the
	// same facts).
	inputSensitive []string
	// outputSensitive are the JSON paths of the result's sensitive fields,
	// withheld from its domain event.
	outputSensitive []string
}

// compileFacts takes each command's facts from what its manifest compiled
// when it loaded (manifest.Command.Facts), with def for a command that
// declares no deadline.
func compileFacts(set *manifest.Set, def time.Duration) map[string]commandFacts {
	out := make(map[string]commandFacts)
	for _, c := range set.Commands() {
		f := commandFacts{deadline: declaredDeadline(c, def), inputSensitive: c.SensitiveFields}
		if cf := c.Facts(); cf != nil {
			if cf.Deadline > 0 {
				f.deadline = cf.Deadline
			}
			f.inputSensitive, f.outputSensitive = cf.InputSensitive, cf.OutputSensitive
		}
		out[c.Code] = f
	}
	return out
}

// redactArguments returns a call's input with cmd's sensitive values
// withheld, and the pointers withheld: the facts the approver's prompt
// withholds by too (confirm.RenderPrompt).
func (e *Executor) redactArguments(cmd *manifest.Command, input []byte) ([]byte, []string) {
	return schema.Redact(input, e.sensitiveInput(cmd))
}

// sensitiveInput is the pointers of cmd's input that redaction withholds.
func (e *Executor) sensitiveInput(cmd *manifest.Command) []string {
	if f, ok := e.facts[cmd.Code]; ok {
		return f.inputSensitive
	}
	return cmd.SensitiveFields
}

// declaredDeadline is cmd's declared deadline, or def when it declares
// none (or one the build would have refused).
func declaredDeadline(cmd *manifest.Command, def time.Duration) time.Duration {
	if cmd.Deadline != "" {
		if d, err := time.ParseDuration(cmd.Deadline); err == nil && d > 0 {
			return d
		}
	}
	return def
}

// recoverKey settles an idempotency key held by invocation previous, whose
// outcome is unknown (its effect was unknown when it ended, or its executor
// died before it ended), from previous's receipt at the backend:
//   - executed: the key settles on that result, which this call replays;
//   - not executed (the backend fenced it): this call takes the key over
//     and runs (claimed);
//   - no answer: refused with idempotency.outcome_unknown, retriable —
//     never run a second time on a guess, never replay a stale 503.
func (e *Executor) recoverKey(ctx context.Context, inv *invocation, k IdemKey, claim Reservation, previous string) (res *Result, claimed bool, err error) {
	r, known := e.resolve(ctx, Dispatch{Command: inv.cmd, Method: inv.method, InvocationID: previous, Deadline: e.deadline(inv.cmd)})
	if !known {
		fe := failure.New(StageIdempotency, failure.CodeIdempotencyOutcomeUnknown,
			"the call that holds this idempotency key ("+previous+") has an unknown outcome, and its backend cannot say yet whether it ran")
		fe.Retriable, fe.Remedy = true, "retry later with the same key; the backend's receipt decides whether it ran"
		return nil, false, e.refuseWith(ctx, inv, fe)
	}
	// What previous's trail still waits for (its outcome, or the
	// resolution of its unknown outcome), closed from the receipt now
	// rather than at the reconciler's next round; and who previous was.
	open, oerr := e.openRows(ctx, inv.p.Tenant, previous)
	if oerr != nil {
		e.logger(ctx, inv).Warn("reading the open rows of the key's previous invocation failed; the reconciler will settle its trail",
			"previous", previous, "error", oerr)
	}
	if !r.Executed {
		ok, cerr := e.cfg.Store.Reclaim(ctx, k, previous, claim)
		if cerr != nil {
			return nil, false, e.fault(ctx, inv, StageIdempotency, failure.CodeIdempotencyUnavailable, cerr)
		}
		e.settleTrail(ctx, open, r)
		inv.priorNotRun = ok
		return nil, ok, nil
	}
	output, merr := marshalOutput(r.Result)
	if merr != nil {
		return nil, false, e.fault(ctx, inv, StageIdempotency, failure.CodeInternalError, merr)
	}
	saved := Saved{InvocationID: previous, Output: output}
	if serr := e.cfg.Store.Settle(ctx, k, saved); serr != nil {
		e.logger(ctx, inv).Error("settling an idempotency key from a receipt", "error", serr)
	}
	// previous ran: it is settled as a call that returned is, before this
	// retry answers, so that the same user's conflicting command is
	// refused from now on. Its own row names its principal; failing that,
	// this retry is the same user's call with the same arguments (the
	// key and the digest say so), so the same subject.
	run := ranOf(inv, output)
	run.invocationID = previous
	for _, row := range open {
		if fromRow, ok := e.ranOfRow(row, output); ok {
			run = fromRow
		}
	}
	if serr := e.settle(ctx, settlement{ran: run}); serr != nil {
		e.logger(ctx, inv).Error("recording the execution of a call settled from its receipt", "previous", previous, "error", serr)
	}
	e.settleTrail(ctx, open, r)
	e.outcomeAsync(ctx, inv, contract.OutcomeReplayed, StageIdempotency, failure.CodeIdempotencyReplayed,
		"returned the result of "+previous+", which its backend's receipt says ran; nothing was dispatched", nil)
	res, err = replay(&saved)
	return res, false, err
}

// unknownEffect reports a saved response that records a dispatch whose
// effect was unknown.
func unknownEffect(s *Saved) bool {
	if s.Status == nil {
		return false
	}
	var st spb.Status
	if proto.Unmarshal(s.Status, &st) != nil {
		return false
	}
	fe, ok := failure.FromStatus(grpcstatus.FromProto(&st))
	return ok && effectUnknown(fe.Code)
}

// confirm opens a challenge or redeems the grant the call carries.
func (e *Executor) confirm(ctx context.Context, inv *invocation, canon []byte) error {
	d := invocationDigest(inv, canon)
	if inv.call.GrantID == "" {
		var ch *mandatev1.Challenge
		err := e.stage(ctx, StageConfirmation, func(ctx context.Context) error {
			var err error
			// No TTL: the confirm service's default applies.
			open := &mandatev1.OpenRequest{
				Command: inv.cmd.Code, InvocationDigest: d, InvocationId: inv.id,
				ArgumentsJson: inv.args, WithheldFields: e.withheldOf(inv), Conditions: askedIDs(inv),
			}
			if inv.preview != nil {
				open.Effects, open.PreviewDigest = inv.preview.effects, inv.preview.digest
			}
			ch, err = e.cfg.Confirm.Open(ctx, open)
			return confirmError(err)
		})
		if err != nil {
			return e.confirmFailure(ctx, inv, err)
		}
		e.park(ctx, inv, ch, d)
		fe := failure.New(StageConfirmation, failure.CodeConfirmationRequired, confirmationMessage(inv))
		fe.ChallengeID, fe.ApprovalURL = ch.GetChallengeId(), ch.GetApprovalUrl()
		fe.Retriable = true
		continueWith(fe, inv)
		return e.refuseWith(ctx, inv, fe)
	}
	var g *mandatev1.Grant
	redeem := func(ctx context.Context) error {
		var err error
		g, err = e.cfg.Confirm.Redeem(ctx, &mandatev1.RedeemRequest{ChallengeId: inv.call.GrantID, InvocationDigest: d,
			DeclarationDigest: e.cfg.Manifest.DeclarationDigest(inv.cmd.Code)})
		return confirmError(err)
	}
	err := e.stage(ctx, StageConfirmation, redeem)
	if err != nil && inv.priorNotRun && errors.Is(err, &failure.Error{Code: failure.CodeConfirmationAlreadyRedeemed}) {
		// The earlier invocation of this key redeemed the grant and
		// provably never ran (its backend fenced it): the approval was not
		// spent on an effect, so this retry of the same invocation digest
		// gets it back.
		e.logger(ctx, inv).Info("the grant's earlier call did not run; releasing it for the retry", "challenge_id", inv.call.GrantID)
		err = e.stage(ctx, StageConfirmation, func(ctx context.Context) error {
			if _, err := e.cfg.Confirm.Release(ctx, &mandatev1.ReleaseRequest{ChallengeId: inv.call.GrantID, InvocationDigest: d}); err != nil {
				return confirmError(err)
			}
			return redeem(ctx)
		})
	}
	if err != nil {
		return e.confirmFailure(ctx, inv, err)
	}
	// The parked call is of no more use: the grant is spent.
	e.unpark(ctx, inv)
	// Until the call is dispatched, the approval is not spent: a stage that
	// ends the call before (the audit intent failing) gives it back.
	inv.redeemedDigest = d
	inv.onUndo(func(ctx context.Context, e *Executor) { e.releaseGrant(ctx, inv) })
	inv.approval = &mandatev1.Approval{ChallengeId: g.GetChallengeId(), Approver: g.GetApprover(), Channel: g.GetChannel(), DecidedAt: g.GetDecidedAt()}
	if g.GetChannel() == contract.ChannelMCPElicitation {
		inv.approval.TrustCeiling = inv.res.TrustCeiling
	}
	return nil
}

func (e *Executor) confirmFailure(ctx context.Context, inv *invocation, err error) error {
	var fe *failure.Error
	if errors.As(err, &fe) {
		c := *fe
		c.Stage = StageConfirmation
		if spec, ok := failure.Lookup(c.Code); ok && spec.Retriable {
			c.Retriable = true
			if c.Remedy == "" {
				c.Remedy = spec.Remedy
			}
		}
		return e.refuseWith(ctx, inv, &c)
	}
	return e.fault(ctx, inv, StageConfirmation, failure.CodeConfirmationUnavailable, err)
}

// stage runs fn in a span named after the stage.
func (e *Executor) stage(ctx context.Context, name string, fn func(ctx context.Context) error) error {
	ctx, span := startStage(ctx, name)
	defer span.End()
	err := fn(ctx)
	if err != nil {
		span.SetStatus(codes.Error, failureCode(err))
	}
	return err
}

// startStage starts a stage's span under the call's, except where the
// call's span has no trace to belong to (an invalid span context): then no
// tracer provider that traces is installed — the SDK gives every span valid
// IDs — so the stage's span would be a no-op carrying that same empty
// context. The call's span stands in for it, which saves the span and the
// context holding it, a few allocations per stage on every call made with
// tracing off.
func startStage(ctx context.Context, name string) (context.Context, trace.Span) {
	if parent := trace.SpanFromContext(ctx); !parent.SpanContext().IsValid() && !parent.IsRecording() {
		return ctx, parent
	}
	return tracer.Start(ctx, name)
}

// refuse records a refusal before dispatch (one outcome row) and returns it.
func (e *Executor) refuse(ctx context.Context, inv *invocation, stage, code, msg, remedy string) error {
	fe := failure.New(stage, code, msg)
	fe.Remedy = remedy
	return e.refuseWith(ctx, inv, fe)
}

func (e *Executor) refuseWith(ctx context.Context, inv *invocation, fe *failure.Error) error {
	fe.InvocationID = inv.id
	inv.ending = ending{outcome: contract.OutcomeRefused, stage: fe.Stage, code: fe.Code}
	_, span := tracer.Start(ctx, fe.Stage, trace.WithAttributes(attribute.String("mandate.code", fe.Code)))
	span.SetStatus(codes.Error, fe.Code)
	span.End()
	if inv.checking {
		return fe
	}
	e.appendRow(ctx, inv, e.record(inv, contract.PhaseOutcome, contract.OutcomeRefused, fe.Stage, fe.Code, fe.Message), callerWaits)
	e.logger(ctx, inv).Info("refused", "stage", fe.Stage, "code", fe.Code)
	return fe
}

// fault records an internal failure before dispatch and hides its detail.
// A code the table of codes marks retriable (a store or service that could
// not be reached) carries the table's remedy.
func (e *Executor) fault(ctx context.Context, inv *invocation, stage, code string, err error) error {
	e.logger(ctx, inv).Error("stage failed", "stage", stage, "error", err)
	fe := failure.Wrap(stage, code, "the call could not be completed; nothing was run", err)
	fe.InvocationID = inv.id
	inv.ending = ending{outcome: contract.OutcomeFailed, stage: stage, code: code}
	if spec, _ := failure.Lookup(code); spec.Retriable {
		fe.Retriable, fe.Remedy = true, spec.Remedy
	}
	if !inv.checking {
		e.appendRow(ctx, inv, e.record(inv, contract.PhaseOutcome, contract.OutcomeFailed, stage, code, fe.Message), callerWaits)
	}
	return fe
}

// outcome appends the outcome row, retrying until written (bounded here;
// the audit reconciler records an unknown outcome for an intent whose
// outcome never arrives).
func (e *Executor) outcome(ctx context.Context, inv *invocation, outcome, stage, code, msg string, result []byte) {
	rec := e.record(inv, contract.PhaseOutcome, outcome, stage, code, msg)
	if result != nil {
		rec.ResultDigest = digest("result", result)
	}
	e.appendRow(ctx, inv, rec, afterTheReply)
}

// Whether a caller waits for a row (appendRow): a refusal's row is written
// before the refusal is answered, an outcome after the reply.
const (
	callerWaits   = true
	afterTheReply = false
)

// appendRow appends a row that ends an invocation (an outcome, a check),
// with its duration.
func (e *Executor) appendRow(ctx context.Context, inv *invocation, rec *mandatev1.AuditRecord, waited bool) {
	if d := e.cfg.Now().Sub(inv.start); d > 0 {
		rec.Duration = durationpb.New(d)
	}
	ctx = context.WithoutCancel(ctx)
	ctx, span := startStage(ctx, stageAuditOutcome)
	defer span.End()
	if inv.intended {
		// The intent waits in the executor's outbox, or was relayed from
		// it: the row follows it there, so that the trail gets the two in
		// order. Only a store that will not take it sends it to the trail
		// directly (and, failing that, to the spool or memory).
		err := e.enqueue(ctx, rec, spoolStoreTimeout)
		if err == nil {
			return
		}
		e.logger(ctx, inv).Warn("the executor's store did not take an outcome row; appending it to the trail directly", "error", err)
	}
	backoff := 20 * time.Millisecond
	for attempt := 1; ; attempt++ {
		// Each attempt has its own deadline: the context carries no
		// cancellation (the row must outlive the call), so a stuck audit
		// service would otherwise hold the executor's shutdown forever.
		actx, cancel := context.WithTimeout(ctx, e.cfg.OutcomeAttemptTimeout)
		_, err := e.cfg.Audit.Append(actx, &mandatev1.AppendRequest{Records: []*mandatev1.AuditRecord{rec}})
		silent := errors.Is(actx.Err(), context.DeadlineExceeded)
		cancel()
		if err == nil {
			return
		}
		// A trail that refused at once (its connection reset, a replica
		// restarting) is tried again. One that did not answer within an
		// attempt's deadline (its database hung) will not answer the next
		// either: when a caller waits for the row (a refusal's), it goes to
		// the spool at once, whose flusher tries the trail again later.
		if attempt >= maxOutcomeAttempts || !unavailable(err) || (silent && waited) || e.isStopping() {
			span.SetStatus(codes.Error, failure.CodeAuditUnavailable)
			e.spool(ctx, inv, rec)
			return
		}
		select {
		case <-time.After(backoff):
		case <-e.stopping:
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// outcomeAsync writes the outcome row of a dispatched call after the reply:
// the intent row is already durable, the write is retried until it lands,
// and if the process dies first the audit reconciler records the outcome as
// unknown. Only the intent commit is on the call's path.
func (e *Executor) outcomeAsync(ctx context.Context, inv *invocation, outcome string, stage, code, msg string, result []byte) {
	inv.ending = ending{outcome: outcome, stage: stage, code: code}
	e.afterReply(func() { e.outcome(ctx, inv, outcome, stage, code, msg, result) })
}

// afterReply runs write (a row that ends an invocation) once the caller
// has its answer; Close waits for it. When too many are in flight it runs
// on the caller's time.
func (e *Executor) afterReply(write func()) {
	select {
	case e.pending <- struct{}{}:
	default:
		write()
		return
	}
	e.wg.Add(1)
	go func() {
		defer func() { <-e.pending; e.wg.Done() }()
		write()
	}()
}

// isStopping reports whether Close has begun.
func (e *Executor) isStopping() bool {
	select {
	case <-e.stopping:
		return true
	default:
		return false
	}
}

// Close waits for outcome rows still being written (each spooled after
// its current attempt if the trail does not take it), stops the loops
// (an attempt in flight is abandoned, its rows kept), relays what the
// outbox still holds within closeFlushTimeout — a draining executor leaves
// its calls' rows in the trail, not only in its store — and keeps the rows
// still held (keepHeld).
func (e *Executor) Close() {
	e.stoppingOnce.Do(func() { close(e.stopping) })
	e.wg.Wait()
	first := false
	e.closeOnce.Do(func() {
		close(e.outbox.stop)
		<-e.outbox.done
		close(e.stop)
		first = true
	})
	e.spoolWG.Wait()
	if first {
		e.lastFlush()
	}
	e.keepHeld()
}

// closeFlushTimeout bounds Close's last relay round: a trail that does
// not answer leaves the rows in the outbox (and memory's in the held
// file) rather than hold the shutdown.
const closeFlushTimeout = 2 * time.Second

// lastFlush relays what the outbox holds, within closeFlushTimeout (or
// OutcomeAttemptTimeout, when shorter).
func (e *Executor) lastFlush() {
	ctx, cancel := context.WithTimeout(context.Background(), min(closeFlushTimeout, e.cfg.OutcomeAttemptTimeout))
	defer cancel()
	for ctx.Err() == nil {
		n, err := e.flushLeased(ctx, false, true)
		if err != nil || n == 0 {
			if err != nil && ctx.Err() == nil {
				e.log.Warn("audit spool: the last relay round before shutdown failed; the rows stay in the outbox for the next relay", "error", err)
			}
			return
		}
	}
}

// finish saves the idempotent response of a dispatched call and, for one
// that ran (output non-nil), its execution and its event (settle).
func (e *Executor) finish(ctx context.Context, inv *invocation, saved Saved, output []byte) {
	s := settlement{ran: ranOf(inv, output)}
	if inv.idem != nil {
		s.key, s.saved = inv.idem, saved
	}
	ctx = context.WithoutCancel(ctx)
	err := e.stage(ctx, StagePublish, func(ctx context.Context) error { return e.settle(ctx, s) })
	if err != nil {
		e.logger(ctx, inv).Error("saving the outcome of a dispatched call", "error", err)
	}
}

func (e *Executor) record(inv *invocation, phase, outcome, stage, code, msg string) *mandatev1.AuditRecord {
	r := &mandatev1.AuditRecord{
		InvocationId: inv.id, Phase: phase, Tenant: inv.p.Tenant, Channel: inv.call.Channel,
		Command: inv.call.Code, UserId: inv.p.UserID, AgentId: inv.p.AgentID,
		Model: inv.p.Model, ModelVersion: inv.p.ModelVersion, ConversationId: inv.call.ConversationID,
		McpSessionId: inv.call.MCPSessionID, Outcome: outcome, Stage: stage, Code: code, Message: msg,
		Approval: inv.approval, TraceId: inv.traceID, ManifestDigest: e.cfg.Manifest.Digest(),
		Subject: inv.subject, ArgumentsDigest: inv.argDigest,
	}
	switch inv.p.Kind {
	case identity.KindAgent:
		r.ActorKind = contract.ActorAgent
	case identity.KindService:
		r.ActorKind = contract.ActorService
	case identity.KindUser:
		r.ActorKind = contract.ActorUser
	}
	if inv.cmd != nil {
		r.Risk = inv.cmd.Risk
		r.SideEffects = inv.cmd.SideEffects
		r.Idempotent, r.Reversible = inv.cmd.Idempotent, inv.cmd.Reversible
	}
	r.ArgumentsJson = inv.args
	if !validCommand(r.Command) {
		r.Command = "unknown"
	}
	safeRecord(r)
	return r
}

func (e *Executor) logger(ctx context.Context, inv *invocation) *slog.Logger {
	l := e.log.With("invocation_id", inv.id, "command", inv.call.Code)
	if inv.p.Tenant != "" {
		l = l.With("tenant", inv.p.Tenant)
	}
	if inv.traceID != "" {
		l = l.With("trace_id", inv.traceID)
	}
	_ = ctx
	return l
}

// backendFailure keeps the stage and code a backend reported for the
// stages a backend may refuse at, and maps everything else to handler.*.
// A backend's domain refusal (a Mandate code with a client-error gRPC
// code, e.g. refund.exceeds_paid as FailedPrecondition) stays what it is —
// a 4xx with its stage and code on every channel, and replayed as such —
// never a 500 handler.failed.
func backendFailure(err error) *failure.Error {
	// The dispatcher's own verdict (the call was not sent, no backend is
	// configured) stands as it is.
	if own := (*failure.Error)(nil); errors.As(err, &own) && own.Stage == StageDispatch {
		c := *own
		return &c
	}
	st := failure.ToStatus(err)
	p := failure.Problem(st, "")
	switch {
	case st.Code() == grpccodes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded):
		return failure.New(StageDispatch, failure.CodeHandlerDeadlineExceeded, "the backend did not answer in time; the effect is unknown")
	case p.Code != "" && failure.CarriesCode(st) && clientError(st.Code()):
		stage := p.Stage
		if !isRefusalStage(stage) {
			stage = StageDispatch
		}
		fe := failure.New(stage, p.Code, p.Detail)
		fe.Remedy, fe.Status = p.Remedy, st.Code()
		for _, v := range p.Errors {
			fe.Violations = append(fe.Violations, failure.Violation{Pointer: v.Pointer, Rule: v.Rule, Message: v.Detail})
		}
		return fe
	case isRefusalStage(p.Stage) && p.Code != "":
		fe := failure.New(p.Stage, p.Code, p.Detail)
		fe.Remedy = p.Remedy
		return fe
	case st.Code() == grpccodes.Unavailable:
		fe := failure.New(StageDispatch, failure.CodeHandlerUnavailable, "the backend is unavailable")
		fe.Retriable, fe.Remedy = true, "retry later with the same idempotency key"
		return fe
	}
	return failure.New(StageDispatch, failure.CodeHandlerFailed, "the backend failed")
}

// effectUnknown reports the dispatch faults after which a call's effect is
// unknown: the backend went away or did not answer in time.
func effectUnknown(code string) bool {
	return code == failure.CodeHandlerUnavailable || code == failure.CodeHandlerDeadlineExceeded
}

// clientError reports the gRPC codes by which a backend says the request,
// not the backend, is at fault.
func clientError(c grpccodes.Code) bool {
	switch c {
	case grpccodes.InvalidArgument, grpccodes.FailedPrecondition, grpccodes.NotFound, grpccodes.AlreadyExists,
		grpccodes.OutOfRange, grpccodes.PermissionDenied:
		return true
	}
	return false
}

// isRefusalStage lists the stages a backend may refuse at.
func isRefusalStage(stage string) bool {
	switch stage {
	case failure.StageState, failure.StagePreInvariant, "assert", failure.StagePostInvariant, StageScope, StageSchema, StageIdempotency:
		return true
	}
	return false
}

func failureCode(err error) string {
	var fe *failure.Error
	if errors.As(err, &fe) {
		return fe.Code
	}
	return "error"
}

func validCommand(code string) bool {
	return code != "" && len(code) <= 128 && callattr.Safe(code, 128) == code && !strings.ContainsAny(code, " \t\n")
}

// digest hashes a labelled value.
func digest(label string, b []byte) string {
	h := sha256.New()
	h.Write([]byte(label))
	h.Write([]byte{0})
	h.Write(b)
	var sum [sha256.Size]byte
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], h.Sum(sum[:0]))
	return string(out[:])
}

// invocationDigest binds a confirmation to one exact call: command,
// request, principal and idempotency key.
func invocationDigest(inv *invocation, canon []byte) string {
	h := sha256.New()
	for _, part := range []string{"mandate.invocation.v1", inv.cmd.Code, string(canon), inv.p.Tenant, inv.p.UserID, inv.p.AgentID, inv.call.IdempotencyKey} {
		fmt.Fprintf(h, "%d:", len(part))
		h.Write([]byte(part))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func subjectOf(msg *dynamicpb.Message, field string) string {
	if field == "" {
		return ""
	}
	fd := msg.Descriptor().Fields().ByName(protoreflect.Name(field))
	if fd == nil || fd.IsList() || fd.IsMap() || fd.Message() != nil {
		return ""
	}
	return fmt.Sprint(msg.Get(fd).Interface())
}

// withheldOf are the call's sensitive argument paths that held a value:
// found by schema_validate as it redacted the arguments.
func (e *Executor) withheldOf(inv *invocation) []string {
	if inv.args == "" {
		_, withheld := e.redactArguments(inv.cmd, inv.call.Input)
		return withheld
	}
	return inv.withheld
}

// Where a call carries its grant when it is made again, per channel
// (CommandError.grant_in and grant_name).
const (
	grantInMCPMeta      = "mcp_meta"
	grantInHTTPHeader   = "http_header"
	grantInGRPCMetadata = "grpc_metadata"
	grantInField        = "request_field"
	grantMCPMeta        = contract.GrantMeta
	grantHeader         = contract.GrantHeader
	grantField          = contract.GrantField
)

// continueWith tells a confirmation.required refusal, in its structured
// fields and its remedy, who decides and exactly how the caller's channel
// sends the call again with the grant: `_meta` over MCP, a header on a
// command's own REST route, metadata on its own gRPC method, the
// approval_grant_id field of an ExecuteRequest.
func continueWith(fe *failure.Error, inv *invocation) {
	switch {
	case inv.call.Channel == "mcp":
		fe.GrantIn, fe.GrantName = grantInMCPMeta, grantMCPMeta
	case inv.call.Proxy && inv.call.Channel == "rest":
		fe.GrantIn, fe.GrantName = grantInHTTPHeader, grantHeader
	case inv.call.Proxy:
		fe.GrantIn, fe.GrantName = grantInGRPCMetadata, contract.GrantMetadata
	default:
		fe.GrantIn, fe.GrantName = grantInField, grantField
	}
	who := "ask the user you act for to approve it"
	switch {
	case inv.cmd.Approver.Kind == manifest.ApproverPermissionHolder && inv.cmd.Approver.Permission != "":
		fe.ApproverPermission = inv.cmd.Approver.Permission
		who = "another user, who holds " + fe.ApproverPermission + " (not " + inv.p.UserID + "), must approve it"
	case inv.p.AgentID == "":
		who = "approve it yourself"
	}
	// The id itself is in challenge_id: the remedy names where it goes.
	var again string
	switch fe.GrantIn {
	case grantInMCPMeta:
		again = "call " + inv.cmd.Code + " again with the same arguments and the challenge id in _meta[\"" + grantMCPMeta + "\"]"
	case grantInHTTPHeader:
		again = "send the same request again with the challenge id in the header " + grantHeader
	case grantInGRPCMetadata:
		again = "call the same method again with the same request and the challenge id in the metadata " + fe.GrantName
	default:
		again = "call " + inv.cmd.Code + " again with the same input and the challenge id in " + grantField
	}
	fe.Remedy = who + " at the approval URL, then " + again
}

// releaseGrant gives back the grant the call redeemed, when the call
// provably did not run; the confirm service allows it for the same
// invocation digest only. A failure is logged: the approval is then spent,
// as before this existed, and the caller asks again.
func (e *Executor) releaseGrant(ctx context.Context, inv *invocation) {
	if inv.redeemedDigest == "" {
		return
	}
	if _, err := e.cfg.Confirm.Release(ctx, &mandatev1.ReleaseRequest{ChallengeId: inv.call.GrantID, InvocationDigest: inv.redeemedDigest}); err != nil {
		e.logger(ctx, inv).Warn("giving the grant of a call that did not run back failed; the approval is spent", "challenge_id", inv.call.GrantID, "error", err)
		return
	}
	inv.redeemedDigest = ""
}
