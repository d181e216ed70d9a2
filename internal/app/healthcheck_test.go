package app

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestHealthcheckHTTP(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
	defer srv.Close()
	if code, out, errOut := run(t, nil, "healthcheck", "--url", srv.URL+"/healthz"); code != 0 || out != "SERVING\n" {
		t.Fatalf("serving: exit %d, %q %q", code, out, errOut)
	}
	status = http.StatusServiceUnavailable
	if code, _, errOut := run(t, nil, "healthcheck", "--url", srv.URL+"/healthz"); code != 1 || !strings.Contains(errOut, "503 Service Unavailable") {
		t.Fatalf("not serving: exit %d, %q", code, errOut)
	}
	srv.Close()
	if code, _, errOut := run(t, nil, "healthcheck", "--url", srv.URL+"/healthz"); code != 1 || !strings.Contains(errOut, "not healthy") {
		t.Fatalf("down: exit %d, %q", code, errOut)
	}
}

func TestHealthcheckGRPC(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := health.NewServer()
	hs.SetServingStatus("mandate.v1.ExecutorService", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("mandate.v1.AuditService", healthpb.HealthCheckResponse_NOT_SERVING)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); <-done }()
	addr := lis.Addr().String()
	if code, _, errOut := run(t, nil, "healthcheck", "--grpc-target", addr, "--grpc-service", "mandate.v1.ExecutorService"); code != 0 {
		t.Fatalf("serving: exit %d, %q", code, errOut)
	}
	if code, _, errOut := run(t, nil, "healthcheck", "--grpc-target", addr, "--grpc-service", "mandate.v1.AuditService"); code != 1 || !strings.Contains(errOut, "NOT_SERVING") {
		t.Fatalf("not serving: exit %d, %q", code, errOut)
	}
}

func TestHealthcheckNeedsExactlyOneTarget(t *testing.T) {
	for _, args := range [][]string{{}, {"--url", "http://a/healthz", "--grpc-target", "a:1"}} {
		if code, _, errOut := run(t, nil, append([]string{"healthcheck"}, args...)...); code != 1 || !strings.Contains(errOut, "--url (MANDATE_URL) or --grpc-target is required") {
			t.Errorf("%v: exit %d, %q", args, code, errOut)
		}
	}
}
