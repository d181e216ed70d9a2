package api

import (
	"context"
	"errors"
	"log/slog"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/confirm"
)

// Stage is the pipeline stage every confirmation refusal names.
const Stage = failure.StageConfirmation

// Service implements mandate.v1.ConfirmService.
type Service struct {
	mandatev1.UnimplementedConfirmServiceServer
	confirm *confirm.Service
	log     *slog.Logger
}

// New returns the service over the confirm domain service.
func New(c *confirm.Service, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{confirm: c, log: log}
}

// Register adds the service to a gRPC server.
func (s *Service) Register(g grpc.ServiceRegistrar) { mandatev1.RegisterConfirmServiceServer(g, s) }

// Gateway registers the REST routes; pass it to server.HandleGateway.
func Gateway(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
	return mandatev1.RegisterConfirmServiceHandler(ctx, mux, conn)
}

func principal(ctx context.Context) (identity.Principal, error) {
	p, ok := identity.FromContext(ctx)
	if !ok {
		return p, failure.New(identity.Stage, failure.CodeAuthenticationMissingCredentials, "no principal")
	}
	return p, nil
}

// Open opens a challenge for the invocation the relayed requester makes.
func (s *Service) Open(ctx context.Context, req *mandatev1.OpenRequest) (*mandatev1.Challenge, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	in := confirm.OpenRequest{
		Command: req.GetCommand(), InvocationDigest: req.GetInvocationDigest(), InvocationID: req.GetInvocationId(),
		ArgumentsJSON: req.GetArgumentsJson(), WithheldFields: req.GetWithheldFields(),
		PreviewDigest: req.GetPreviewDigest(), Conditions: req.GetConditions(),
	}
	for _, l := range req.GetEffects() {
		in.Effects = append(in.Effects, l.GetText())
	}
	if req.Ttl != nil {
		if err := req.GetTtl().CheckValid(); err != nil {
			return nil, s.mapErr(ctx, "open", confirm.Invalid("ttl", "is not a valid duration"))
		}
		in.TTL = req.GetTtl().AsDuration()
	}
	c, err := s.confirm.Open(ctx, p, in)
	if err != nil {
		return nil, s.mapErr(ctx, "open", err)
	}
	return s.toProto(&c), nil
}

// Get reads a challenge.
func (s *Service) Get(ctx context.Context, req *mandatev1.ConfirmServiceGetRequest) (*mandatev1.Challenge, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	c, err := s.confirm.Get(ctx, p, req.GetChallengeId())
	if err != nil {
		return nil, s.mapErr(ctx, "get", err)
	}
	return s.toProto(&c), nil
}

// MCPBridgeService is the service identity of the MCP bridge, the only
// relay whose mcp_elicitation decisions are honoured.
const MCPBridgeService = identity.MCPBridgeService

// Decide records a human's decision. The approval_page channel is recorded
// only by the approval page itself. mcp_elicitation is honoured only when
// the MCP bridge relays the session's principal (Via MCPBridgeService); it
// then records the answer the session's human gave to the session's own
// call (confirm.Service.DecideElicited). Anyone else claiming that channel
// is refused, agents with "agents never approve".
func (s *Service) Decide(ctx context.Context, req *mandatev1.DecideRequest) (*mandatev1.Challenge, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	// A refusal here is an attempt too: the trail records it as the
	// domain's refusals are.
	verdict := ""
	switch req.GetDecision() {
	case mandatev1.Decision_DECISION_APPROVE:
		verdict = confirm.VerdictApprove
	case mandatev1.Decision_DECISION_DECLINE:
		verdict = confirm.VerdictDecline
	}
	channel := req.GetChannel()
	refuse := func(err error) error {
		return s.mapErr(ctx, "decide", s.confirm.RefuseDecision(ctx, p, req.GetChallengeId(), verdict, channel, err))
	}
	switch channel {
	case "", confirm.ChannelAPI:
		channel = confirm.ChannelAPI
	case confirm.ChannelMCPElicitation:
		if p.Via != MCPBridgeService {
			if p.Kind == identity.KindAgent || p.AgentID != "" {
				return nil, refuse(&confirm.Error{Code: failure.CodeConfirmationApproverNotAllowed, Message: "agents never approve or decline; a human must"})
			}
			return nil, refuse(confirm.Invalid("channel", "mcp_elicitation is recorded only when the MCP bridge relays the session's human"))
		}
	case confirm.ChannelApprovalPage:
		return nil, refuse(confirm.Invalid("channel", "approval_page is recorded only by the approval page"))
	default:
		return nil, refuse(confirm.Invalid("channel", "must be api or mcp_elicitation"))
	}
	if verdict == "" {
		return nil, refuse(confirm.Invalid("decision", "must be approve or decline"))
	}
	approve := verdict == confirm.VerdictApprove
	var c confirm.Challenge
	if channel == confirm.ChannelMCPElicitation {
		c, err = s.confirm.DecideElicited(ctx, p, req.GetChallengeId(), approve)
	} else {
		c, err = s.confirm.Decide(ctx, p, req.GetChallengeId(), approve, channel)
	}
	if err != nil {
		return nil, s.mapErr(ctx, "decide", err)
	}
	return s.toProto(&c), nil
}

// Await streams the challenge until it is decided or expires.
func (s *Service) Await(req *mandatev1.AwaitRequest, stream grpc.ServerStreamingServer[mandatev1.Challenge]) error {
	ctx := stream.Context()
	p, err := principal(ctx)
	if err != nil {
		return err
	}
	ch, err := s.confirm.Await(ctx, p, req.GetChallengeId())
	if err != nil {
		return s.mapErr(ctx, "await", err)
	}
	last := confirm.StatePending
	for c := range ch {
		if err := stream.Send(s.toProto(&c)); err != nil {
			return err
		}
		last = c.State
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if last == confirm.StatePending {
		// The store went away while the challenge was still pending.
		return s.mapErr(ctx, "await", confirm.Unavailable("await", nil))
	}
	return nil
}

// Redeem uses an approved challenge for the relayed requester's invocation.
func (s *Service) Redeem(ctx context.Context, req *mandatev1.RedeemRequest) (*mandatev1.Grant, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	g, err := s.confirm.Redeem(ctx, p, req.GetChallengeId(), req.GetInvocationDigest(), req.GetDeclarationDigest())
	if err != nil {
		return nil, s.mapErr(ctx, "redeem", err)
	}
	return &mandatev1.Grant{ChallengeId: g.ChallengeID, Approver: g.Approver, DecidedAt: timestamppb.New(g.DecidedAt), Channel: g.Channel,
		PreviewDigest: g.PreviewDigest}, nil
}

// Release gives back a grant whose call did not run, for the relayed
// requester's same invocation.
func (s *Service) Release(ctx context.Context, req *mandatev1.ReleaseRequest) (*mandatev1.Challenge, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	c, err := s.confirm.Release(ctx, p, req.GetChallengeId(), req.GetInvocationDigest())
	if err != nil {
		return nil, s.mapErr(ctx, "release", err)
	}
	return s.toProto(&c), nil
}

// Failure maps a confirm error to the wire error clients see: refusals keep
// their code under the confirmation_check stage; anything unexpected
// becomes internal.error with its cause left for the logs. The approval
// page uses it too, so both transports speak the same codes.
func Failure(err error) (*failure.Error, bool) {
	var ce *confirm.Error
	if !errors.As(err, &ce) {
		return nil, false
	}
	fe := failure.New(Stage, ce.Code, ce.Message)
	switch ce.Code {
	case failure.CodeConfirmationUnavailable, failure.CodeConfirmationPending, failure.CodeConfirmationExpired,
		failure.CodeConfirmationGrantMismatch, failure.CodeConfirmationAlreadyRedeemed, failure.CodeConfirmationRefused,
		failure.CodeConfirmationApproverNotAllowed:
		// The refusals a caller can act on get the table's remedy.
		spec, _ := failure.Lookup(ce.Code)
		fe.Retriable, fe.Remedy = spec.Retriable, spec.Remedy
	}
	return fe, true
}

// mapErr turns domain errors into wire errors; everything unexpected is
// logged and hidden.
func (s *Service) mapErr(ctx context.Context, op string, err error) error {
	if fe, ok := Failure(err); ok {
		if fe.Code == failure.CodeConfirmationUnavailable {
			s.log.WarnContext(ctx, "confirm "+op+": store unavailable", "error", err)
		}
		return fe
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	s.log.ErrorContext(ctx, "confirm "+op+" failed", "error", err)
	return failure.Internal(Stage, err)
}

func (s *Service) toProto(c *confirm.Challenge) *mandatev1.Challenge {
	out := &mandatev1.Challenge{
		ChallengeId: c.ID, Tenant: c.Tenant, Command: c.Command, InvocationDigest: c.InvocationDigest,
		InvocationId: c.InvocationID, RequesterUserId: c.RequesterUser, RequesterAgentId: c.RequesterAgent,
		ApproverKind: string(c.Approver.Kind), ApproverPermission: c.Approver.Permission,
		Prompt: &mandatev1.Prompt{
			Title: c.Prompt.Title, Summary: c.Prompt.Summary, Risk: c.Prompt.Risk, SideEffects: c.Prompt.SideEffects,
			Reversible: c.Prompt.Reversible, Recall: c.Prompt.Recall, Permissions: c.Prompt.Permissions,
			ArgumentsJson: c.Prompt.ArgumentsJSON, WithheldFields: c.Prompt.WithheldFields, RequestedBy: c.Prompt.RequestedBy,
			ArgumentLines: s.argumentLines(c),
			EffectLines:   c.Prompt.Effects,
			Reasons:       c.Prompt.Reasons,
		},
		PreviewDigest:     c.Prompt.PreviewDigest,
		DeclarationDigest: c.Prompt.DeclarationDigest,
		State:             stateProto(c.State),
		CreatedAt:         timestamppb.New(c.CreatedAt),
		ExpiresAt:         timestamppb.New(c.ExpiresAt),
		DecidedBy:         c.DecidedBy,
		DecisionChannel:   c.DecisionChannel,
		ApprovalUrl:       s.confirm.ApprovalURL(c.ID),
		Elicitable:        c.Elicitable,
	}
	if !c.DecidedAt.IsZero() {
		out.DecidedAt = timestamppb.New(c.DecidedAt)
	}
	return out
}

// freeTextWriter is who the argument lines of a prompt say wrote its free
// text: the agent (or client) that made the call, never the approver.
const freeTextWriter = "the agent"

// argumentLines renders c's arguments by their declaration, one line each
// (confirm.PromptField.Line).
func (s *Service) argumentLines(c *confirm.Challenge) []string {
	fields := s.confirm.Fields(c)
	lines := make([]string, len(fields))
	for i, f := range fields {
		lines[i] = f.Line(freeTextWriter)
	}
	return lines
}

func stateProto(s confirm.State) mandatev1.ChallengeState {
	switch s {
	case confirm.StatePending:
		return mandatev1.ChallengeState_CHALLENGE_STATE_PENDING
	case confirm.StateApproved:
		return mandatev1.ChallengeState_CHALLENGE_STATE_APPROVED
	case confirm.StateDeclined:
		return mandatev1.ChallengeState_CHALLENGE_STATE_DECLINED
	case confirm.StateExpired:
		return mandatev1.ChallengeState_CHALLENGE_STATE_EXPIRED
	case confirm.StateRedeemed:
		return mandatev1.ChallengeState_CHALLENGE_STATE_REDEEMED
	}
	return mandatev1.ChallengeState_CHALLENGE_STATE_UNSPECIFIED
}
