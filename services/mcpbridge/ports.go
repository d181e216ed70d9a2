package mcpbridge

import (
	"context"

	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// The bridge's ports are the parts of the services' generated gRPC clients
// it calls, with their exact signatures: mandatev1.NewExecutorServiceClient,
// NewCatalogServiceClient and NewConfirmServiceClient implement them, over
// a network connection or a server's in-process channel
// (internal/server/inprocess.Conn). The connection must carry the bridge's service
// credentials (identity.UnaryClientInterceptor and StreamClientInterceptor
// with a token of service identity.MCPBridgeService), which forward the
// caller's raw token that the bridge puts in every call's context: each
// service answers for the caller, relayed by the bridge. Refusals are gRPC
// status errors carrying a mandate.v1.CommandError detail.

// Executor runs governed calls: ExecutorService.Execute.
type Executor interface {
	Execute(ctx context.Context, in *mandatev1.ExecuteRequest, opts ...grpc.CallOption) (*mandatev1.ExecuteResponse, error)
}

// Checker checks a call without running it: ExecutorService.Check. The
// bridge offers its check tool (CheckTool) when its Executor is one, as
// the generated client is.
type Checker interface {
	Check(ctx context.Context, in *mandatev1.ExecuteRequest, opts ...grpc.CallOption) (*mandatev1.CheckResponse, error)
}

// Planner is the part of the executor's client the plan tool uses
// (ExecutorService.Plan); the generated client implements it.
type Planner interface {
	Plan(ctx context.Context, in *mandatev1.PlanRequest, opts ...grpc.CallOption) (*mandatev1.PlanResponse, error)
}

// Catalog is what the bridge needs of the catalog service: the caller's
// tools, a stream of changes to them, and the manifest's bytes.
type Catalog interface {
	ListTools(ctx context.Context, in *mandatev1.ListToolsRequest, opts ...grpc.CallOption) (*mandatev1.ListToolsResponse, error)
	Watch(ctx context.Context, in *mandatev1.CatalogServiceWatchRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[mandatev1.CatalogEvent], error)
	GetManifest(ctx context.Context, in *mandatev1.GetManifestRequest, opts ...grpc.CallOption) (*mandatev1.GetManifestResponse, error)
	GetCommandSlice(ctx context.Context, in *mandatev1.GetCommandSliceRequest, opts ...grpc.CallOption) (*mandatev1.GetCommandSliceResponse, error)
}

// Confirmer is what the bridge needs of the confirm service to put a
// challenge to the session's human through elicitation: Get returns the
// challenge, its prompt and whether the caller may answer it by form
// (Challenge.elicitable, the confirm service's policy); Decide on channel
// mcp_elicitation records the answer, which the confirm service refuses
// where the approver policy needs someone else or the command is L4.
type Confirmer interface {
	Get(ctx context.Context, in *mandatev1.ConfirmServiceGetRequest, opts ...grpc.CallOption) (*mandatev1.Challenge, error)
	Decide(ctx context.Context, in *mandatev1.DecideRequest, opts ...grpc.CallOption) (*mandatev1.Challenge, error)
}

// Compile-time checks that the generated clients are the ports.
var (
	_ Executor  = mandatev1.ExecutorServiceClient(nil)
	_ Checker   = mandatev1.ExecutorServiceClient(nil)
	_ Catalog   = mandatev1.CatalogServiceClient(nil)
	_ Confirmer = mandatev1.ConfirmServiceClient(nil)
)
