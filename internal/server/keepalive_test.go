package server_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
)

// runAged runs a server whose connections live maxAge, then grace, until
// the test ends.
func runAged(t *testing.T, maxAge, grace time.Duration) *server.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{"mandate"}, Issuers: []string{"test"}, DevSecret: devSecret})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Name: "aged", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth,
		MaxConnectionAge: maxAge, MaxConnectionAgeGrace: grace, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	return srv
}

// countingClient is a connection to addr that counts the TCP connections
// it opened.
func countingClient(t *testing.T, addr string) (*grpc.ClientConn, *atomic.Int32) {
	t.Helper()
	var dials atomic.Int32
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, "tcp", a)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc, &dials
}

// TestMaxConnectionAgeRenewsConnections: past MaxConnectionAge the server
// asks the client to reconnect (GOAWAY), and the calls go on over a new
// connection without one failing — which is what has a client balancing
// over DNS re-resolve and find the replicas added since it connected.
func TestMaxConnectionAgeRenewsConnections(t *testing.T) {
	srv := runAged(t, 200*time.Millisecond, 0)
	cc, dials := countingClient(t, srv.GRPCAddr())
	health := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var calls int
	for dials.Load() < 3 {
		if ctx.Err() != nil {
			t.Fatalf("after %d calls the client still has opened %d connection(s): the server never ended one", calls, dials.Load())
		}
		// WaitForReady: a call picked while the old connection drains
		// waits for the new one, as the services' calls do not (they go
		// to another replica); here there is only the one server.
		if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
			t.Fatalf("call %d: %v", calls, err)
		}
		calls++
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMaxConnectionAgeGraceEndsLongCalls: a call still running past
// MaxConnectionAge plus the grace is closed under it, Unavailable; the
// client's next call succeeds on a new connection.
func TestMaxConnectionAgeGraceEndsLongCalls(t *testing.T) {
	srv := runAged(t, 200*time.Millisecond, 200*time.Millisecond)
	cc, _ := countingClient(t, srv.GRPCAddr())
	health := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	watch, err := health.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		_, err := watch.Recv()
		if err == nil {
			continue // the first status, or a change
		}
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("the watch ended with %v, want Unavailable", err)
		}
		break
	}
	if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("after the connection was closed: %v", err)
	}
}
