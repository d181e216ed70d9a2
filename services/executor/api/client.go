package api

import (
	"context"
	"encoding/json"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/services/executor"
)

// Client runs governed calls over ExecutorService.Execute for a service
// that relays its callers (the MCP bridge); it has the Execute method of
// *executor.Executor, so either can serve the bridge.
//
// The connection must carry the relaying service's credentials
// (identity.UnaryClientInterceptor), which forward the caller's raw token
// from the context, and should carry an otelgrpc client stats handler so
// that the call's trace continues in the executor. When the relaying
// service is identity.MCPBridgeService the executor records the call on
// channel "mcp" with the MCP session id sent here; the Channel and Tenant
// fields of the Call are not sent (the executor derives both).
//
// Refusals are returned as the gRPC status errors the executor sent (their
// mandate.v1.CommandError detail intact), which failure.ToStatus passes
// through.
type Client struct {
	rpc mandatev1.ExecutorServiceClient
}

// NewClient returns a client over conn.
func NewClient(conn grpc.ClientConnInterface) *Client {
	return &Client{rpc: mandatev1.NewExecutorServiceClient(conn)}
}

// Execute runs one command for the caller in ctx.
func (c *Client) Execute(ctx context.Context, call executor.Call) (*executor.Result, error) {
	if call.InputError != nil {
		// What the bridge found wrong with the input travels with the
		// call, so that the executor refuses it at schema_validate and
		// audits it, as in process.
		b, err := json.Marshal(call.InputError.Violations)
		if err != nil {
			return nil, failure.Internal(executor.StageSchema, err)
		}
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataInputError, string(b))
		call.Input = nil
	}
	// The input travels as the JSON it is: the executor's strict decoder
	// refuses (and audits) anything but an object.
	input := call.Input
	if call.MCPSessionID != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataMCPSession, call.MCPSessionID)
	}
	for _, inv := range call.Invalid {
		b, err := json.Marshal(inv)
		if err != nil {
			return nil, failure.Internal(executor.StageRequest, err)
		}
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataInvalidAttribute, string(b))
	}
	resp, err := c.rpc.Execute(ctx, &mandatev1.ExecuteRequest{
		Code: call.Code, InputJson: input, IdempotencyKey: call.IdempotencyKey,
		ApprovalGrantId: call.GrantID, ConversationId: call.ConversationID,
		ResultAsJson: true,
	})
	if err != nil {
		return nil, err
	}
	out := resp.GetResultJson()
	if out == nil {
		// An executor that predates result_as_json answers with a Struct.
		if out, err = json.Marshal(resp.GetResult().AsMap()); err != nil {
			return nil, failure.Internal(executor.StageDispatch, err)
		}
	}
	return &executor.Result{InvocationID: resp.GetInvocationId(), Output: out, AuditID: resp.GetAuditId(), Replayed: resp.GetReplayed()}, nil
}
