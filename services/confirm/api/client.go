package api

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/confirm"
)

// Client puts challenges to the session's human for the MCP bridge over
// ConfirmService: it has the Get and DecideElicited methods the bridge's
// Confirmer needs, so the bridge runs the same way against a
// *confirm.Service in process and against the confirm service over gRPC.
//
// The connection must carry the bridge's service credentials
// (identity.UnaryClientInterceptor with a token of service
// identity.MCPBridgeService), which forward the caller's raw token from the
// context: the confirm service decides for the principal of that token,
// relayed by the bridge, never for the principal argument.
//
// Errors are those of the in-process service: a refusal of the
// confirmation stage is a *confirm.Error with its code (so errors.Is
// against confirm.ErrApproverNotAllowed and Failure both work), any other
// Mandate refusal a *failure.Error, and transport failures pass unchanged.
type Client struct {
	rpc mandatev1.ConfirmServiceClient
}

// NewClient returns a client over conn.
func NewClient(conn grpc.ClientConnInterface) *Client {
	return &Client{rpc: mandatev1.NewConfirmServiceClient(conn)}
}

// Get returns the challenge to its requester.
func (c *Client) Get(ctx context.Context, _ identity.Principal, id string) (confirm.Challenge, error) {
	ch, err := c.rpc.Get(ctx, &mandatev1.ConfirmServiceGetRequest{ChallengeId: id})
	if err != nil {
		return confirm.Challenge{}, clientError(err)
	}
	return ChallengeFromProto(ch), nil
}

// DecideElicited records the answer the session's human gave through MCP
// elicitation: ConfirmService.Decide on channel mcp_elicitation, relayed
// by the bridge for that human. The confirm service refuses it where the
// approver policy needs someone else or the command is L4.
func (c *Client) DecideElicited(ctx context.Context, _ identity.Principal, id string, approve bool) (confirm.Challenge, error) {
	d := mandatev1.Decision_DECISION_DECLINE
	if approve {
		d = mandatev1.Decision_DECISION_APPROVE
	}
	ch, err := c.rpc.Decide(ctx, &mandatev1.DecideRequest{ChallengeId: id, Decision: d, Channel: confirm.ChannelMCPElicitation})
	if err != nil {
		return confirm.Challenge{}, clientError(err)
	}
	return ChallengeFromProto(ch), nil
}

// ChallengeFromProto converts the wire form of a challenge. The approval
// URL is not part of confirm.Challenge (the service derives it from the
// id); RedeemedAt is not on the wire.
func ChallengeFromProto(ch *mandatev1.Challenge) confirm.Challenge {
	pr := ch.GetPrompt()
	out := confirm.Challenge{
		ID: ch.GetChallengeId(), Tenant: ch.GetTenant(), Command: ch.GetCommand(), Risk: pr.GetRisk(),
		InvocationDigest: ch.GetInvocationDigest(), InvocationID: ch.GetInvocationId(),
		RequesterUser: ch.GetRequesterUserId(), RequesterAgent: ch.GetRequesterAgentId(),
		Approver: confirm.ApproverPolicy{Kind: confirm.ApproverKind(ch.GetApproverKind()), Permission: ch.GetApproverPermission()},
		Prompt: confirm.Prompt{
			Title: pr.GetTitle(), Summary: pr.GetSummary(), Risk: pr.GetRisk(), SideEffects: pr.GetSideEffects(),
			Reversible: pr.GetReversible(), Recall: pr.GetRecall(), Permissions: pr.GetPermissions(),
			ArgumentsJSON: pr.GetArgumentsJson(), WithheldFields: pr.GetWithheldFields(), RequestedBy: pr.GetRequestedBy(),
		},
		State:           stateFromProto(ch.GetState()),
		DecidedBy:       ch.GetDecidedBy(),
		DecisionChannel: ch.GetDecisionChannel(),
		Elicitable:      ch.GetElicitable(),
	}
	if ch.GetCreatedAt() != nil {
		out.CreatedAt = ch.GetCreatedAt().AsTime()
	}
	if ch.GetExpiresAt() != nil {
		out.ExpiresAt = ch.GetExpiresAt().AsTime()
	}
	if ch.GetDecidedAt() != nil {
		out.DecidedAt = ch.GetDecidedAt().AsTime()
	}
	return out
}

func stateFromProto(s mandatev1.ChallengeState) confirm.State {
	name, found := strings.CutPrefix(s.String(), "CHALLENGE_STATE_")
	if !found || s == mandatev1.ChallengeState_CHALLENGE_STATE_UNSPECIFIED {
		return ""
	}
	return confirm.State(name)
}

// clientError restores the in-process service's error: Failure's inverse
// for refusals of the confirmation stage.
func clientError(err error) error {
	fe, ok := failure.FromStatus(status.Convert(err))
	if !ok {
		return err
	}
	if fe.Stage == Stage {
		return &confirm.Error{Code: fe.Code, Message: fe.Message}
	}
	return fe
}
