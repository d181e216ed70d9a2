package server_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
)

type auditStub struct {
	mandatev1.UnimplementedAuditServiceServer
}

// TestHealthAndReflectionByServiceName: a running server answers health
// for "", its short name and each registered service's full name, and
// lists its services by reflection — all without a token.
func TestHealthAndReflectionByServiceName(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{"mandate"}, Issuers: []string{"test"}, DevSecret: devSecret})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Name: "audit", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	mandatev1.RegisterAuditServiceServer(srv.GRPC(), auditStub{})
	if got := srv.ServiceNames(); !slices.Equal(got, []string{"mandate.v1.AuditService"}) {
		t.Fatalf("ServiceNames %v", got)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	cc, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	health := healthpb.NewHealthClient(cc)
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	for _, name := range []string{"", "audit", "mandate.v1.AuditService"} {
		var status healthpb.HealthCheckResponse_ServingStatus
		for range 100 { // Run marks the services SERVING once it serves.
			resp, err := health.Check(cctx, &healthpb.HealthCheckRequest{Service: name})
			if status = resp.GetStatus(); err == nil && status == healthpb.HealthCheckResponse_SERVING {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v", name, status)
		}
	}
	stream, err := reflectionv1.NewServerReflectionClient(cc).ServerReflectionInfo(cctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("reflection without a token: %v", err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !slices.Contains(names, "mandate.v1.AuditService") {
		t.Fatalf("reflection lists %v", names)
	}
}
