package manifestcheck_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/manifestcheck"
)

const (
	own   = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	other = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, declared string
		refused        bool
		shown          string
	}{
		{"none declared", "", false, ""},
		{"the same", own, false, ""},
		{"another", other, true, other},
		{"malformed", "sha256:<script>", true, "a malformed digest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fe := manifestcheck.Check(tc.declared, own)
			if (fe != nil) != tc.refused {
				t.Fatalf("Check(%q) = %v, refused want %v", tc.declared, fe, tc.refused)
			}
			if fe == nil {
				return
			}
			if fe.Code != failure.CodeManifestMismatch || fe.Stage != "request_check" || fe.GRPCStatus().Code() != codes.FailedPrecondition {
				t.Errorf("refusal %s/%s %v", fe.Stage, fe.Code, fe.GRPCStatus().Code())
			}
			if !strings.Contains(fe.Message, tc.shown) || (tc.shown != tc.declared && strings.Contains(fe.Message, tc.declared)) {
				t.Errorf("message %q, want it to show %q only", fe.Message, tc.shown)
			}
		})
	}
}

// TestGuardAndClients: a service registered with Guard refuses unary and
// streaming calls from a client that sends another digest, and serves one
// that sends its own (the client interceptors) or none.
func TestGuardAndClients(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	srv.RegisterService(manifestcheck.Guard(&healthpb.Health_ServiceDesc, own), health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	dial := func(opts ...grpc.DialOption) healthpb.HealthClient {
		conn, err := grpc.NewClient(lis.Addr().String(), append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return healthpb.NewHealthClient(conn)
	}
	with := func(d string) healthpb.HealthClient {
		return dial(grpc.WithUnaryInterceptor(manifestcheck.UnaryClientInterceptor(d)), grpc.WithStreamInterceptor(manifestcheck.StreamClientInterceptor(d)))
	}
	ctx := t.Context()
	for _, tc := range []struct {
		name    string
		client  healthpb.HealthClient
		ctx     context.Context
		refused bool
	}{
		{"own digest", with(own), ctx, false},
		{"no digest", dial(), ctx, false},
		{"another digest", with(other), ctx, true},
		// A relayed context's header is replaced by the caller's own.
		{"relayed header replaced", with(own), metadata.AppendToOutgoingContext(ctx, manifestcheck.Header, other), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.client.Check(tc.ctx, &healthpb.HealthCheckRequest{})
			stream, serr := tc.client.Watch(tc.ctx, &healthpb.HealthCheckRequest{})
			if serr == nil {
				_, serr = stream.Recv()
			}
			for what, e := range map[string]error{"unary": err, "stream": serr} {
				if tc.refused && status.Code(e) != codes.FailedPrecondition {
					t.Errorf("%s: %v, want FailedPrecondition", what, e)
				}
				if !tc.refused && e != nil {
					t.Errorf("%s: %v", what, e)
				}
			}
		})
	}
}
