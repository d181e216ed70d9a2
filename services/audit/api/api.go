// Package api serves the audit trail over gRPC (and REST through the
// gateway): thin handlers that authorise the caller, translate between
// mandate.v1 messages and the audit domain, and map errors through
// internal/failure. Services append on behalf of callers; auditors holding
// `audit.read` query, fetch, verify and tail their own tenant only.
package api

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/audit"
)

var tracer = otel.Tracer("mandate/audit/api")

// ReadPermission is what a principal needs to read its tenant's trail.
const ReadPermission = "audit.read"

// Service implements mandate.v1.AuditService.
type Service struct {
	mandatev1.UnimplementedAuditServiceServer
	writer    *audit.Writer
	directory directory.Resolver
	log       *slog.Logger
	// draining is closed by Drain.
	draining  chan struct{}
	drainOnce sync.Once
}

// New returns the service. The writer owns the store; directory answers
// whether a reader holds ReadPermission.
func New(w *audit.Writer, dir directory.Resolver, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{writer: w, directory: dir, log: log, draining: make(chan struct{})}
}

// Drain ends the append streams (AppendStream) once the appends they
// carry are answered, and refuses new ones: call it when the server begins
// to stop, so that its graceful stop does not wait for the executor's
// long-lived stream. The executor then opens a new stream (and retries or
// spools what it could not append meanwhile).
func (s *Service) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

// Register adds the service to a gRPC server.
func (s *Service) Register(g grpc.ServiceRegistrar) { mandatev1.RegisterAuditServiceServer(g, s) }

// Append stores records for the caller's tenant. Only Mandate services
// append: a user or agent calling directly is refused.
func (s *Service) Append(ctx context.Context, req *mandatev1.AppendRequest) (*mandatev1.AppendResponse, error) {
	p, ok := identity.FromContext(ctx)
	if !ok {
		return nil, failure.New(failure.StageAuthenticate, failure.CodeAuthenticationMissingCredentials, "no principal")
	}
	if p.Kind != identity.KindService && p.Via == "" {
		return nil, failure.New(failure.StagePermission, failure.CodeAuthorizationPermissionDenied, "only Mandate services append to the audit trail")
	}
	// The executor may append on its own authority, with no user relayed
	// (the rows it spooled while the trail was unavailable), and so may the
	// confirm service (its decision rows): each record then names its
	// tenant. Otherwise rows go to the relayed caller's tenant.
	ownAuthority := p.Kind == identity.KindService && p.Via == "" && p.Tenant == ""
	if ownAuthority && p.ServiceName != identity.ExecutorService && p.ServiceName != identity.ConfirmService && p.ServiceName != identity.MCPBridgeService {
		return nil, failure.New(failure.StagePermission, failure.CodeAuthorizationPermissionDenied, "a service appends for the caller it relays; only the executor, the confirm service and the MCP bridge append on their own authority")
	}
	from := p.Via
	if ownAuthority {
		from = p.ServiceName
	}
	stored, err := s.append(ctx, p.Tenant, ownAuthority, from, req.GetRecords(), toProto)
	if err != nil {
		return nil, err
	}
	return &mandatev1.AppendResponse{Records: stored}, nil
}

// append stores records: for tenant, or, on the executor's own authority,
// each for the tenant it names.
// append appends records and answers each stored row as answer converts it.
// from is the appending service: decision rows come from the confirm
// service alone, and it appends nothing else.
func (s *Service) append(ctx context.Context, tenant string, ownAuthority bool, from string, records []*mandatev1.AuditRecord, answer func(*audit.Stored) *mandatev1.AuditRecord) ([]*mandatev1.AuditRecord, error) {
	recs := make([]audit.Record, 0, len(records))
	for i, r := range records {
		if decision := r.GetPhase() == string(audit.PhaseDecision); decision != (from == identity.ConfirmService) {
			return nil, failure.New(failure.StagePermission, failure.CodeAuthorizationPermissionDenied,
				fmt.Sprintf("record %d: decision rows are appended by the confirm service, which appends nothing else", i))
		}
		if from == identity.MCPBridgeService && ownAuthority && !edgeRefusal(r) {
			return nil, failure.New(failure.StagePermission, failure.CodeAuthorizationPermissionDenied,
				fmt.Sprintf("record %d: on its own authority the MCP bridge appends only the rows of requests it refused at the edge (%s, %s, %s, %s)", i, failure.CodeRateLimited, failure.CodeSessionTooMany, failure.CodeTaskTooMany, failure.CodeTaskNotFound))
		}
		t := tenant
		switch {
		case ownAuthority && r.GetTenant() == "":
			return nil, failure.New(failure.StageSchema, failure.CodeSchemaInvalid, fmt.Sprintf("record %d names no tenant", i))
		case ownAuthority:
			t = r.GetTenant()
		case r.GetTenant() != "" && r.GetTenant() != tenant:
			return nil, failure.New(failure.StageScope, failure.CodeScopeTenantMismatch, fmt.Sprintf("record %d names another tenant", i))
		}
		rec, err := fromProto(r)
		if err != nil {
			return nil, failure.New(failure.StageSchema, failure.CodeSchemaInvalid, fmt.Sprintf("record %d: %v", i, err))
		}
		rec.Tenant = t
		recs = append(recs, rec)
	}
	stored, err := s.writer.Append(ctx, recs...)
	if err != nil {
		return nil, s.mapErr(ctx, "append", err)
	}
	out := make([]*mandatev1.AuditRecord, 0, len(stored))
	for i := range stored {
		out = append(out, answer(&stored[i]))
	}
	return out, nil
}

// serverSpan starts the span of each append on a stream; built once, as
// it is the same for all.
var serverSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}

// maxStreamInFlight bounds the appends of one stream under way at once;
// the stream's flow control holds further requests back.
const maxStreamInFlight = 256

// AppendStream appends the executor's records as they arrive on one
// stream, on its own authority: each record names its tenant. Requests are
// appended concurrently, so the writer commits those that arrive together
// in one transaction; each is answered, in the order its append ends, with
// its id and its rows or its error, and the stream stays open.
func (s *Service) AppendStream(stream grpc.BidiStreamingServer[mandatev1.AppendStreamRequest, mandatev1.AppendStreamResponse]) error {
	ctx := stream.Context()
	p, ok := identity.FromContext(ctx)
	if !ok {
		return failure.New(failure.StageAuthenticate, failure.CodeAuthenticationMissingCredentials, "no principal")
	}
	if p.Kind != identity.KindService || p.Via != "" || p.Tenant != "" || p.ServiceName != identity.ExecutorService {
		return failure.New(failure.StagePermission, failure.CodeAuthorizationPermissionDenied, "only the executor, on its own authority, appends on a stream")
	}
	var (
		sendMu sync.Mutex
		wg     sync.WaitGroup
	)
	defer wg.Wait()
	reqs, recvErr := make(chan *mandatev1.AppendStreamRequest), make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	slots := make(chan struct{}, maxStreamInFlight)
	for {
		var req *mandatev1.AppendStreamRequest
		select {
		case req = <-reqs:
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-s.draining:
			return failure.New("audit", failure.CodeAuditUnavailable, "the audit service is stopping; open a new stream")
		case <-ctx.Done():
			return nil
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			resp := &mandatev1.AppendStreamResponse{Id: req.GetId()}
			actx := otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier(req.GetTraceContext()))
			actx, span := tracer.Start(actx, "mandate.v1.AuditService/AppendStream.Append", serverSpan...)
			defer span.End()
			answer := toProto
			if req.GetBrief() {
				answer = toBrief
			}
			stored, err := s.append(actx, "", true, identity.ExecutorService, req.GetRecords(), answer)
			if err != nil {
				st := failure.ToStatus(err)
				span.SetStatus(codes.Error, st.Message())
				resp.StatusCode, resp.StatusMessage = int32(st.Code()), st.Message() //nolint:gosec // gRPC codes are small
				for _, d := range st.Details() {
					if ce, ok := d.(*mandatev1.CommandError); ok {
						resp.Error = ce
					}
				}
			} else {
				resp.Records = stored
			}
			sendMu.Lock()
			defer sendMu.Unlock()
			// A failed send means the stream is gone: Recv says so next.
			_ = stream.Send(resp)
		}()
	}
}

// PendingIntents lists intents without outcome of every tenant, for the
// executor to settle from its backends' receipts. Only the executor, on its
// own authority, may ask: the rows cross tenants.
func (s *Service) PendingIntents(ctx context.Context, req *mandatev1.PendingIntentsRequest) (*mandatev1.PendingIntentsResponse, error) {
	p, ok := identity.FromContext(ctx)
	if !ok {
		return nil, failure.New(failure.StageAuthenticate, failure.CodeAuthenticationMissingCredentials, "no principal")
	}
	if p.Kind != identity.KindService || p.Via != "" || p.Tenant != "" || p.ServiceName != identity.ExecutorService {
		return nil, failure.New(failure.StagePermission, failure.CodeAuthorizationPermissionDenied, "only the executor, on its own authority, lists pending intents")
	}
	if req.GetTenant() != "" || req.GetInvocationId() != "" {
		return s.pendingOf(ctx, req)
	}
	limit := int(req.GetLimit())
	if limit <= 0 {
		limit = 256
	}
	list := s.writer.Store().PendingIntents
	if req.GetUnknownOutcomes() {
		list = s.writer.Store().UnresolvedUnknowns
	}
	intents, err := list(ctx, time.Now().Add(-req.GetOlderThan().AsDuration()), limit)
	if err != nil {
		return nil, s.mapErr(ctx, "pending intents", err)
	}
	out := &mandatev1.PendingIntentsResponse{}
	for i := range intents {
		out.Records = append(out.Records, toProto(&intents[i]))
	}
	return out, nil
}

// pendingOf is PendingIntents for one invocation: its intent row when it
// has no outcome row, or (unknown_outcomes) its outcome row when that says
// unknown and no resolution row answers it; none when the trail already
// says how the call ended, or holds nothing of it. A retry that finds the
// invocation's key abandoned asks, to settle the invocation's trail at
// once instead of at the reconciler's next round.
func (s *Service) pendingOf(ctx context.Context, req *mandatev1.PendingIntentsRequest) (*mandatev1.PendingIntentsResponse, error) {
	if req.GetTenant() == "" || req.GetInvocationId() == "" {
		return nil, failure.New(failure.StageSchema, failure.CodeSchemaInvalid, "tenant and invocation_id go together")
	}
	out := &mandatev1.PendingIntentsResponse{}
	rows, err := s.writer.Store().Get(ctx, req.GetTenant(), req.GetInvocationId())
	switch {
	case errors.Is(err, audit.ErrNotFound):
		return out, nil
	case err != nil:
		return nil, s.mapErr(ctx, "pending intents", err)
	}
	age := req.GetOlderThan().AsDuration()
	phases := map[audit.Phase]*audit.Stored{}
	for i := range rows {
		phases[rows[i].Phase] = &rows[i]
	}
	var open *audit.Stored
	if req.GetUnknownOutcomes() {
		if o := phases[audit.PhaseOutcome]; o != nil && o.Outcome == audit.OutcomeUnknown && phases[audit.PhaseResolution] == nil {
			open = o
		}
	} else if in := phases[audit.PhaseIntent]; in != nil && phases[audit.PhaseOutcome] == nil {
		open = in
	}
	// An age of zero takes the row whatever its time says (the clocks of
	// the executor and of this service need not agree).
	if open != nil && (age <= 0 || open.Time.Before(time.Now().Add(-age))) {
		out.Records = append(out.Records, toProto(open))
	}
	return out, nil
}

// Query lists the caller's tenant's records.
func (s *Service) Query(ctx context.Context, req *mandatev1.QueryRequest) (*mandatev1.QueryResponse, error) {
	tenant, err := s.reader(ctx)
	if err != nil {
		return nil, err
	}
	f := audit.Filter{
		Tenant:         tenant,
		AgentID:        req.GetAgentId(),
		Model:          req.GetModel(),
		SideEffect:     req.GetSideEffect(),
		Command:        req.GetCommand(),
		Stage:          req.GetStage(),
		Approver:       req.GetApprover(),
		ConversationID: req.GetConversationId(),
		Phase:          audit.Phase(req.GetPhase()),
		PageSize:       int(req.GetPageSize()),
		PageToken:      req.GetPageToken(),
	}
	if req.From != nil {
		f.From = req.GetFrom().AsTime()
	}
	if req.To != nil {
		f.To = req.GetTo().AsTime()
	}
	if req.Approved != nil {
		v := req.GetApproved()
		f.Approved = &v
	}
	for _, k := range req.GetActorKinds() {
		f.ActorKinds = append(f.ActorKinds, audit.ActorKind(k))
	}
	for _, r := range req.GetRisks() {
		f.Risks = append(f.Risks, audit.Risk(r))
	}
	for _, o := range req.GetOutcomes() {
		f.Outcomes = append(f.Outcomes, audit.Outcome(o))
	}
	page, err := s.writer.Store().Query(ctx, f)
	if err != nil {
		return nil, s.mapErr(ctx, "query", err)
	}
	out := &mandatev1.QueryResponse{NextPageToken: page.NextPageToken}
	for i := range page.Records {
		out.Records = append(out.Records, toProto(&page.Records[i]))
	}
	return out, nil
}

// Get returns the records of one invocation of the caller's tenant.
func (s *Service) Get(ctx context.Context, req *mandatev1.GetRequest) (*mandatev1.GetResponse, error) {
	tenant, err := s.reader(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := s.writer.Store().Get(ctx, tenant, req.GetInvocationId())
	if err != nil {
		return nil, s.mapErr(ctx, "get", err)
	}
	if len(rows) == 0 {
		return nil, failure.New("", failure.CodeAuditNotFound, "no records for this invocation")
	}
	out := &mandatev1.GetResponse{}
	for i := range rows {
		out.Records = append(out.Records, toProto(&rows[i]))
	}
	return out, nil
}

// Verify walks the caller's tenant's chain.
func (s *Service) Verify(ctx context.Context, _ *mandatev1.VerifyRequest) (*mandatev1.VerifyResponse, error) {
	tenant, err := s.reader(ctx)
	if err != nil {
		return nil, err
	}
	rep, err := s.writer.Store().Verify(ctx, tenant)
	if err != nil {
		return nil, s.mapErr(ctx, "verify", err)
	}
	out := &mandatev1.VerifyResponse{Ok: rep.OK, Checked: rep.Rows}
	if b := rep.Break; b != nil {
		out.Broken = &mandatev1.BrokenLink{Seq: b.Seq, InvocationId: b.InvocationID, Phase: string(b.Phase), Problem: string(b.Problem)}
	}
	return out, nil
}

// Watch streams the caller's tenant's records as they are committed.
func (s *Service) Watch(req *mandatev1.WatchRequest, stream grpc.ServerStreamingServer[mandatev1.AuditRecord]) error {
	ctx := stream.Context()
	tenant, err := s.reader(ctx)
	if err != nil {
		return err
	}
	ch, err := s.writer.Store().Watch(ctx, tenant, req.GetAfterSeq())
	if err != nil {
		return s.mapErr(ctx, "watch", err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case rec, ok := <-ch:
			if !ok {
				return failure.New("", failure.CodeAuditUnavailable, "the live tail ended; reconnect with after_seq")
			}
			if err := stream.Send(toProto(&rec)); err != nil {
				return err
			}
		}
	}
}

// reader authorises a read: an active principal holding ReadPermission. It
// returns the only tenant the caller may read.
func (s *Service) reader(ctx context.Context) (string, error) {
	p, ok := identity.FromContext(ctx)
	if !ok {
		return "", failure.New(failure.StageAuthenticate, failure.CodeAuthenticationMissingCredentials, "no principal")
	}
	res, err := s.directory.Resolve(ctx, p.Tenant, p.UserID, p.AgentID)
	res = res.Admit(p.IssuedAt)
	if err != nil {
		return "", s.mapErr(ctx, "resolve", err)
	}
	if !res.Active {
		return "", failure.New(failure.StagePermission, failure.CodeAuthorizationPrincipalInactive, "the principal is not active ("+res.Reason+")")
	}
	if !res.HasPermission(ReadPermission) {
		e := failure.New(failure.StagePermission, failure.CodeAuthorizationPermissionDenied, "reading the audit trail needs "+ReadPermission)
		e.Remedy = "ask a user who holds " + ReadPermission
		return "", e
	}
	return p.Tenant, nil
}

// mapErr turns domain errors into wire errors; everything unexpected is
// logged and hidden.
func (s *Service) mapErr(ctx context.Context, op string, err error) error {
	switch {
	case errors.Is(err, audit.ErrInvalidPageToken):
		return failure.New("", failure.CodeRequestInvalidPageToken, "the page token is malformed or belongs to other filters")
	case errors.Is(err, audit.ErrInvalid):
		return failure.New(failure.StageSchema, failure.CodeSchemaInvalid, err.Error())
	case errors.Is(err, audit.ErrNotFound):
		return failure.New("", failure.CodeAuditNotFound, "not found")
	case audit.Retryable(err):
		e := failure.New("audit", failure.CodeAuditUnavailable, "the audit store is unavailable; nothing was written")
		e.Retriable, e.Remedy = true, "retry later"
		return e
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	s.log.ErrorContext(ctx, "audit "+op+" failed", "error", err)
	return failure.Internal("audit", err)
}

func fromProto(r *mandatev1.AuditRecord) (audit.Record, error) {
	rec := audit.Record{
		InvocationID: r.GetInvocationId(), Phase: audit.Phase(r.GetPhase()),
		Channel: audit.Channel(r.GetChannel()), Command: r.GetCommand(), Risk: audit.Risk(r.GetRisk()),
		SideEffects: r.GetSideEffects(), Idempotent: r.GetIdempotent(), Reversible: r.GetReversible(),
		Subject: r.GetSubject(), UserID: r.GetUserId(), ActorKind: audit.ActorKind(r.GetActorKind()),
		AgentID: r.GetAgentId(), Model: r.GetModel(), ModelVersion: r.GetModelVersion(),
		ConversationID: r.GetConversationId(), MCPSessionID: r.GetMcpSessionId(),
		Outcome: audit.Outcome(r.GetOutcome()), Stage: r.GetStage(), Code: r.GetCode(), Message: r.GetMessage(),
		ArgumentsDigest: r.GetArgumentsDigest(), ResultDigest: r.GetResultDigest(),
		TraceID: r.GetTraceId(), ManifestDigest: r.GetManifestDigest(),
	}
	if r.Time != nil {
		rec.Time = r.GetTime().AsTime()
	}
	if r.Duration != nil {
		rec.Duration = r.GetDuration().AsDuration()
	}
	if a := r.GetArgumentsJson(); a != "" {
		b := json.RawMessage(a) // one copy, checked and kept
		if !json.Valid(b) {
			return rec, errors.New("arguments_json is not valid JSON")
		}
		rec.Arguments = b
	}
	if ap := r.GetApproval(); ap != nil {
		rec.Approval = &audit.Approval{ChallengeID: ap.GetChallengeId(), Approver: ap.GetApprover(), Channel: ap.GetChannel(), TrustCeiling: ap.GetTrustCeiling()}
		if ap.DecidedAt != nil {
			rec.Approval.DecidedAt = ap.GetDecidedAt().AsTime()
		}
	}
	return rec, nil
}

// edgeCodes are the codes of the requests the MCP bridge refuses at its
// edge: too many requests, sessions or waiting tasks, and a task asked for
// by a principal that does not own it.
var edgeCodes = map[string]bool{
	failure.CodeRateLimited: true, failure.CodeSessionTooMany: true,
	failure.CodeTaskTooMany: true, failure.CodeTaskNotFound: true,
}

// edgeRefusal: an outcome row of a request refused at request_check at
// the bridge's edge (edgeCodes), with no command — all the MCP bridge may
// append on its own authority.
func edgeRefusal(r *mandatev1.AuditRecord) bool {
	return r.GetPhase() == string(audit.PhaseOutcome) && r.GetOutcome() == string(audit.OutcomeRefused) &&
		r.GetStage() == failure.StageRequest && r.GetCommand() == "" &&
		edgeCodes[r.GetCode()] && r.GetApproval() == nil
}

// toBrief is where a record was stored, for AppendStreamRequest.brief: the
// caller sent the record, so only its position comes back.
func toBrief(s *audit.Stored) *mandatev1.AuditRecord {
	return &mandatev1.AuditRecord{
		Tenant: s.Tenant, InvocationId: s.InvocationID, Phase: string(s.Phase), Seq: s.Seq, Hash: hex.EncodeToString(s.Hash),
	}
}

func toProto(s *audit.Stored) *mandatev1.AuditRecord {
	r := &mandatev1.AuditRecord{
		InvocationId: s.InvocationID, Phase: string(s.Phase), Time: timestamppb.New(s.Time), Tenant: s.Tenant,
		Channel: string(s.Channel), Command: s.Command, Risk: string(s.Risk), SideEffects: s.SideEffects,
		Idempotent: s.Idempotent, Reversible: s.Reversible, Subject: s.Subject, UserId: s.UserID,
		ActorKind: string(s.ActorKind), AgentId: s.AgentID, Model: s.Model, ModelVersion: s.ModelVersion,
		ConversationId: s.ConversationID, McpSessionId: s.MCPSessionID, Outcome: string(s.Outcome),
		Stage: s.Stage, Code: s.Code, Message: s.Message, ArgumentsJson: string(s.Arguments),
		ArgumentsDigest: s.ArgumentsDigest, ResultDigest: s.ResultDigest, TraceId: s.TraceID,
		ManifestDigest: s.ManifestDigest, Seq: s.Seq, PrevHash: hex.EncodeToString(s.PrevHash), Hash: hex.EncodeToString(s.Hash),
	}
	if s.Duration > 0 {
		r.Duration = durationpb.New(s.Duration)
	}
	if a := s.Approval; a != nil {
		r.Approval = &mandatev1.Approval{ChallengeId: a.ChallengeID, Approver: a.Approver, Channel: a.Channel, Assurance: a.Assurance(), TrustCeiling: a.TrustCeiling}
		if !a.DecidedAt.IsZero() {
			r.Approval.DecidedAt = timestamppb.New(a.DecidedAt)
		}
	}
	return r
}

// StoredFromProto reads a record as the API answers it (Query, Get,
// Watch) back into the store's form, for clients of the API that print or
// process rows as the operator tools do.
func StoredFromProto(r *mandatev1.AuditRecord) (audit.Stored, error) {
	rec, err := fromProto(r)
	if err != nil {
		return audit.Stored{}, err
	}
	rec.Tenant = r.GetTenant()
	s := audit.Stored{Record: rec, Seq: r.GetSeq()}
	if s.PrevHash, err = hex.DecodeString(r.GetPrevHash()); err != nil {
		return audit.Stored{}, fmt.Errorf("prev_hash: %w", err)
	}
	if s.Hash, err = hex.DecodeString(r.GetHash()); err != nil {
		return audit.Stored{}, fmt.Errorf("hash: %w", err)
	}
	return s, nil
}
