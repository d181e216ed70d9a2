package backend_test

import (
	"context"
	"log"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mandate-dev/mandate/pkg/backend"
)

// A backend behind the executor: the Guard's interceptors first, then the handlers, which
// read their caller and refuse with a stage and a code.
func Example() {
	ctx := context.Background()
	guard, err := backend.New(ctx, backend.Config{
		ServiceSecret: []byte(os.Getenv("MANDATE_SERVICE_SECRET")),
		OIDCIssuerURL: "https://id.example.com",
		Issuers:       []string{"https://id.example.com"},
		Audience:      []string{"mandate"},
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(guard.ServerOptions()...)
	healthpb.RegisterHealthServer(srv, health.NewServer()) // public, as reflection would be
	// ordersv1.RegisterOrderServiceServer(srv, &orders{}) — your generated service.
	lis, err := net.Listen("tcp", "127.0.0.1:9191")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(srv.Serve(lis))
}

// cancelOrder is the body of a handler: who the call is for, then a domain refusal that the
// executor hands to the agent as state_check / order.shipped.
func cancelOrder(ctx context.Context, orderID string, shipped bool) error {
	caller, err := backend.CallerFrom(ctx)
	if err != nil {
		return err // already a status: authenticate or scope_check
	}
	if shipped {
		r := backend.Refuse(backend.StageStateCheck, "order.shipped", "order "+orderID+" has shipped; it can no longer be cancelled")
		r.InvocationID = caller.InvocationID
		return r
	}
	log.Printf("cancel %s for %s/%s (agent %q, invocation %s)", orderID, caller.Tenant, caller.UserID, caller.AgentID, caller.InvocationID)
	return nil
}

var _ = cancelOrder
