package identity

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/reflection"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha" //nolint:staticcheck // older grpcurl and Postman still speak v1alpha
	"google.golang.org/grpc/status"
)

// TestReflectionIsUnauthenticated: server reflection (v1 and v1alpha) is
// answered without a token, so grpcurl and Postman can discover the API,
// while every other RPC on the same server still needs one.
func TestReflectionIsUnauthenticated(t *testing.T) {
	f := newGRPCFixture(t)
	auth := f.authenticator(t, false)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(auth.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(auth.StreamServerInterceptor()),
	)
	srv.RegisterService(&whoamiDesc, &whoami{})
	reflection.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc := dial(t, lis.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("v1", func(t *testing.T) {
		stream, err := reflectionv1.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
		must(t, err)
		must(t, stream.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}}))
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("reflection without a token: %v", err)
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		if !slices.Contains(names, whoamiDesc.ServiceName) {
			t.Errorf("services %v lack %s", names, whoamiDesc.ServiceName)
		}
	})
	t.Run("v1alpha", func(t *testing.T) {
		// Older grpcurl and Postman still speak the deprecated v1alpha.
		stream, err := reflectionv1alpha.NewServerReflectionClient(cc).ServerReflectionInfo(ctx) //nolint:staticcheck // see above
		must(t, err)
		must(t, stream.Send(&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{}})) //nolint:staticcheck // see above
		if _, err := stream.Recv(); err != nil {
			t.Fatalf("v1alpha reflection without a token: %v", err)
		}
	})
	t.Run("other RPCs still need a token", func(t *testing.T) {
		if _, err := callGet(ctx, cc); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("whoami without a token: %v", err)
		}
	})
}

func TestIsPublicMethod(t *testing.T) {
	for method, want := range map[string]bool{
		"/grpc.health.v1.Health/Check":                                   true,
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      true,
		"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": true,
		"/grpc.reflection.v1.ServerReflectionX/ServerReflectionInfo":     false,
		"/mandate.v1.ExecutorService/Execute":                            false,
		"/grpc.health.v1.HealthEvil/Check":                               false,
	} {
		if got := isPublicMethod(method); got != want {
			t.Errorf("isPublicMethod(%q) = %v, want %v", method, got, want)
		}
	}
}
