package server_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
)

// TestReadinessFollowsTheProbe: a service whose readiness probe hangs (a
// database that answers nothing) is not-ready within two probe intervals —
// /healthz 503 and gRPC health NOT_SERVING for its names, each answered at
// once, never waiting on the probe — while /livez still says it runs and
// the server's own health ("") stays SERVING; once the probe passes it is
// ready again. A probe failing at start makes it start not-ready.
func TestReadinessFollowsTheProbe(t *testing.T) {
	const interval = 100 * time.Millisecond
	var state atomic.Int32 // 0 passes, 1 hangs, 2 fails
	state.Store(2)
	unstick := make(chan struct{})
	t.Cleanup(func() { close(unstick) })
	ready := func(ctx context.Context) error {
		switch state.Load() {
		case 1:
			<-unstick // ignores its context, as a stuck driver might
			return nil
		case 2:
			return errors.New("connection refused")
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{"mandate"}, Issuers: []string{"test"}, DevSecret: devSecret})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Name: "audit", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth,
		Ready: ready, ReadyInterval: interval})
	if err != nil {
		t.Fatal(err)
	}
	mandatev1.RegisterAuditServiceServer(srv.GRPC(), auditStub{})
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
	get := func(path string) int {
		t.Helper()
		c := &http.Client{Timeout: 500 * time.Millisecond} // an answer at once, whatever the probe does
		resp, err := c.Get("http://" + srv.HTTPAddr() + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	grpcStatus := func(name string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		cctx, ccancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer ccancel()
		resp, err := health.Check(cctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatalf("health %q: %v", name, err)
		}
		return resp.GetStatus()
	}
	// wait polls until healthz answers want, for at most two intervals and
	// a margin for a loaded machine.
	wait := func(what string, want int) {
		t.Helper()
		deadline := time.Now().Add(2*interval + 2*time.Second)
		for get(server.HealthPath) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: /healthz never answered %d", what, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	wait("failing at start", http.StatusServiceUnavailable)
	if s := grpcStatus("mandate.v1.AuditService"); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("gRPC health of the service while its probe fails: %v", s)
	}
	if get(server.LivePath) != http.StatusOK || grpcStatus("") != healthpb.HealthCheckResponse_SERVING {
		t.Fatal("a failing probe made the process itself unhealthy")
	}
	state.Store(0)
	wait("the probe passing", http.StatusOK)
	if s := grpcStatus("audit"); s != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health once the probe passes: %v", s)
	}
	state.Store(1)
	wait("the probe hanging", http.StatusServiceUnavailable)
	if s := grpcStatus("mandate.v1.AuditService"); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("gRPC health while the probe hangs: %v", s)
	}
	if get(server.LivePath) != http.StatusOK {
		t.Fatal("/livez while the probe hangs")
	}
	state.Store(0)
	wait("the probe answering again", http.StatusOK)
}
