package tests

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// TestReflectionWithoutToken is what grpcurl and Postman do against
// `mandate dev`: with no token, list the services by server reflection and
// describe one; then ask health for each service by its full name. Every
// other RPC still needs a token.
func TestReflectionWithoutToken(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dev := startDev(t)
	cc, err := grpc.NewClient(dev.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	stream, err := reflectionv1.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(req *reflectionv1.ServerReflectionRequest) *reflectionv1.ServerReflectionResponse {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("reflection without a token: %v", err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("reflection error: %v", e)
		}
		return resp
	}
	var services []string
	for _, s := range ask(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}}).GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	want := []string{
		mandatev1.ExecutorService_ServiceDesc.ServiceName,
		mandatev1.CatalogService_ServiceDesc.ServiceName,
		mandatev1.AuditService_ServiceDesc.ServiceName,
		mandatev1.ConfirmService_ServiceDesc.ServiceName,
	}
	for _, name := range want {
		if !slices.Contains(services, name) {
			t.Fatalf("reflection lists %v, without %s", services, name)
		}
	}

	// Describe: the file declaring the executor, with its Execute method.
	files := ask(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: mandatev1.ExecutorService_ServiceDesc.ServiceName,
	}}).GetFileDescriptorResponse().GetFileDescriptorProto()
	found := false
	for _, raw := range files {
		var fd descriptorpb.FileDescriptorProto
		if err := proto.Unmarshal(raw, &fd); err != nil {
			t.Fatal(err)
		}
		for _, sd := range fd.GetService() {
			for _, m := range sd.GetMethod() {
				found = found || (sd.GetName() == "ExecutorService" && m.GetName() == "Execute")
			}
		}
	}
	if !found {
		t.Fatal("reflection did not describe ExecutorService.Execute")
	}

	// Health by full service name, and for the server as a whole.
	health := healthpb.NewHealthClient(cc)
	for _, name := range append([]string{""}, services...) {
		if strings.HasPrefix(name, "grpc.") {
			continue
		}
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v", name, resp.GetStatus(), err)
		}
	}

	// Reflection opens nothing else.
	_, err = mandatev1.NewExecutorServiceClient(cc).Execute(ctx, &mandatev1.ExecuteRequest{Code: "ticket.search"})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Execute without a token: %v", err)
	}
}
