package executor

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmapi "github.com/mandate-dev/mandate/services/confirm/api"
)

// ServiceName is the executor's service identity.
const ServiceName = "executor"

// LocalConfirmer calls a confirm.Service in the same process (mandate dev).
// The executor relays the caller, as it would over the network.
type LocalConfirmer struct {
	Service *confirm.Service
}

// Open opens a challenge for the caller in ctx.
func (l LocalConfirmer) Open(ctx context.Context, req OpenRequest) (Challenge, error) {
	p, _ := identity.FromContext(ctx)
	p.Via = ServiceName
	c, err := l.Service.Open(ctx, p, confirm.OpenRequest{
		Command: req.Command, InvocationDigest: req.Digest, InvocationID: req.InvocationID,
		ArgumentsJSON: string(req.ArgumentsJSON), WithheldFields: req.WithheldFields,
	})
	if err != nil {
		return Challenge{}, confirmError(err)
	}
	return Challenge{ID: c.ID, ApprovalURL: l.Service.ApprovalURL(c.ID)}, nil
}

// Redeem redeems a grant for the caller in ctx.
func (l LocalConfirmer) Redeem(ctx context.Context, id, digest string) (Grant, error) {
	p, _ := identity.FromContext(ctx)
	p.Via = ServiceName
	g, err := l.Service.Redeem(ctx, p, id, digest)
	if err != nil {
		return Grant{}, confirmError(err)
	}
	return Grant{ChallengeID: g.ChallengeID, Approver: g.Approver, Channel: g.Channel, DecidedAt: g.DecidedAt}, nil
}

func confirmError(err error) error {
	if fe, ok := confirmapi.Failure(err); ok {
		return fe
	}
	return err
}

// RemoteConfirmer calls the confirm service over gRPC. The connection must
// carry the executor's service credentials, which forward the caller.
type RemoteConfirmer struct {
	Client mandatev1.ConfirmServiceClient
}

// NewRemoteConfirmer returns a confirmer over conn.
func NewRemoteConfirmer(conn grpc.ClientConnInterface) RemoteConfirmer {
	return RemoteConfirmer{Client: mandatev1.NewConfirmServiceClient(conn)}
}

// Open opens a challenge.
func (r RemoteConfirmer) Open(ctx context.Context, req OpenRequest) (Challenge, error) {
	c, err := r.Client.Open(ctx, &mandatev1.OpenRequest{
		Command: req.Command, InvocationDigest: req.Digest, InvocationId: req.InvocationID,
		ArgumentsJson: string(req.ArgumentsJSON), WithheldFields: req.WithheldFields,
		Ttl: durationpb.New(confirm.DefaultTTL),
	})
	if err != nil {
		return Challenge{}, remoteError(err)
	}
	return Challenge{ID: c.GetChallengeId(), ApprovalURL: c.GetApprovalUrl()}, nil
}

// Redeem redeems a grant.
func (r RemoteConfirmer) Redeem(ctx context.Context, id, digest string) (Grant, error) {
	g, err := r.Client.Redeem(ctx, &mandatev1.RedeemRequest{ChallengeId: id, InvocationDigest: digest})
	if err != nil {
		return Grant{}, remoteError(err)
	}
	return Grant{ChallengeID: g.GetChallengeId(), Approver: g.GetApprover(), Channel: g.GetChannel(), DecidedAt: g.GetDecidedAt().AsTime()}, nil
}

// remoteError keeps the confirm service's code under this stage.
func remoteError(err error) error {
	p := failure.Problem(failure.ToStatus(err), "")
	if p.Code == "" || p.Code == "internal.error" || p.Code == failure.CodeServiceUnavailable || strings.HasPrefix(p.Code, "grpc.") {
		// Not the confirm service's refusal: a fault, reported as
		// confirmation.unavailable (or internal) by the pipeline.
		return err
	}
	fe := failure.New(StageConfirmation, p.Code, p.Detail)
	fe.Retriable, fe.Remedy = p.Retriable, p.Remedy
	return fe
}
