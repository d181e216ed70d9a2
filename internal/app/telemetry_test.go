package app

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/mandate-dev/mandate/internal/freeport"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/telemetry/telemetrytest"
)

// childEnv names the test a re-executed test binary runs.
const childEnv = "MANDATE_CLI_TEST_CHILD"

const testServiceSecret = "fedcba9876543210fedcba9876543210-test"

// freeAddr returns a loopback address nothing listens on (the service binds
// it right after), below the kernel's ephemeral range (see package freeport).
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestServiceExportsItsSpansOnExit runs `mandate catalog` in process with
// --otlp-endpoint, sends it a request carrying a W3C trace context, stops
// it, and finds the service's server span — named for the service, in the
// caller's trace — at the collector: the flag reaches the exporter, the
// propagator continues the caller's trace and the exit flushes. The
// request's HTTP server metric arrives too: the handler, built after
// Setup, records with the MeterProvider it installed.
func TestServiceExportsItsSpansOnExit(t *testing.T) {
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
	})
	var col telemetrytest.Collector
	endpoint := col.Start(t)
	httpAddr := freeAddr(t)
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"catalog", "--store", "memory", "--grpc-addr", "127.0.0.1:0", "--http-addr", httpAddr,
			"--otlp-endpoint", endpoint},
			IO{Stdout: &stdout, Stderr: &stderr, Env: func(k string) (string, bool) {
				v, ok := map[string]string{"MANDATE_DEV_SECRET": testSecret, "MANDATE_SERVICE_SECRET": testServiceSecret, "MANDATE_MANIFEST": "sample"}[k]
				return v, ok
			}})
	}()

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/healthz", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case code := <-done:
			t.Fatalf("catalog exited with %d before serving:\n%s", code, stderr.String())
		default:
		}
	}
	// Health probes start no trace: the traced request is a real route's
	// (refused without a token, which is traffic all the same).
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/v1/catalog/tools", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	tracedStatus := strconv.Itoa(resp.StatusCode)
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("catalog exited with %d:\n%s", code, stderr.String())
	}
	var found bool
	for _, s := range col.Trace(traceID) {
		if s.Service == "mandate-catalog" && s.Kind == "server" && s.ParentSpanID == "00f067aa0ba902b7" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no server span of mandate-catalog in trace %s; received %+v\nstderr:\n%s", traceID, col.Spans(), stderr.String())
	}
	if m, ok := telemetrytest.Last(col.Metrics(), "mandate-catalog", "http.server.request.duration", map[string]string{"http.response.status_code": tracedStatus}); !ok || m.Count == 0 {
		t.Fatalf("no http.server.request.duration of mandate-catalog; received %+v", col.Metrics())
	}
}

func TestOTLPEndpointIsValidated(t *testing.T) {
	env := map[string]string{"MANDATE_DEV_SECRET": testSecret, "MANDATE_SERVICE_SECRET": testServiceSecret, "MANDATE_OTLP_ENDPOINT": "jaeger:4317", "MANDATE_MANIFEST": "sample"}
	for _, sub := range []string{"audit", "catalog", "confirm", "executor", "helpdesk", "dev"} {
		args := []string{sub, "--store", "memory", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}
		switch sub {
		case "dev":
			args = []string{sub, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}
		case "executor":
			args = append(args, "--backend", "examples.helpdesk.v1.HelpdeskService=127.0.0.1:1,mandate.v1.CatalogService=127.0.0.1:1")
		}
		code, _, errOut := run(t, env, args...)
		if code != 1 || !strings.Contains(errOut, "--otlp-endpoint must be a URL such as http://collector:4317") {
			t.Errorf("%s: exit %d, stderr %q", sub, code, errOut)
		}
	}
}

// TestDevTraceReachesTheBackend: in `mandate dev`, a REST call carrying a
// trace context continues that trace through the executor's stages to the
// helpdesk backend's server span (the executor's connection to the backend
// carries the context), all reported as mandate-dev.
//
// It runs in a child process: packages such as the executor take their
// tracer from the global provider once, so the first Setup of a process
// binds them (one Setup per process, as in production), and other tests in
// this binary have run Setup before.
func TestDevTraceReachesTheBackend(t *testing.T) {
	if os.Getenv(childEnv) != t.Name() {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"="+t.Name(), "OTEL_BSP_SCHEDULE_DELAY=50")
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "PASS") {
			t.Fatalf("child test: %v\n%s", err, out)
		}
		return
	}
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
	})
	var col telemetrytest.Collector
	endpoint := col.Start(t)
	httpAddr := freeAddr(t)
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"dev", "--grpc-addr", "127.0.0.1:0", "--http-addr", httpAddr, "--otlp-endpoint", endpoint},
			IO{Stdout: &stdout, Stderr: &stderr, Env: func(k string) (string, bool) {
				return map[string]string{"MANDATE_DEV_SECRET": testSecret}[k], k == "MANDATE_DEV_SECRET"
			}})
	}()
	tok, err := identity.MintDev([]byte(testSecret), identity.MintRequest{Issuer: DefaultIssuer, Audience: DefaultAudience,
		User: "alice", Tenant: "acme", Org: "support", Agent: "support-bot", Model: "dev-model", TTL: time.Hour, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	const traceID = "5bf92f3577b34da6a3ce929d0e0e4737"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+httpAddr+"/v1/commands/ticket.search:execute",
			strings.NewReader(`{"input":{"query":"charged twice"}}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("ticket.search: %s", resp.Status)
			}
			break
		}
		select {
		case code := <-done:
			t.Fatalf("dev exited with %d before serving:\n%s", code, stderr.String())
		default:
		}
	}
	// Spans are exported every 50 ms (OTEL_BSP_SCHEDULE_DELAY, set for the
	// child): wait until the backend's span and every span above it have
	// arrived — each ends only after the reply that follows it is sent.
	wctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	spans, err := col.Wait(wctx, func(spans []telemetrytest.Span) bool { _, err := backendHops(spans, traceID); return err == nil })
	if err != nil {
		_, why := backendHops(spans, traceID)
		t.Fatalf("%v: %v\nspans: %+v", err, why, spans)
	}
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("dev exited with %d:\n%s", code, stderr.String())
	}
	for _, s := range spans {
		if s.Service != "mandate-dev" {
			t.Errorf("span %q from service %q", s.Name, s.Service)
		}
	}
	if hops, _ := backendHops(spans, traceID); hops < 3 {
		t.Fatalf("the backend span is %d hops below the caller's, want the gateway, executor and client spans between", hops)
	}
	// The exit flushed the executor's count of the call.
	attrs := map[string]string{"command": "ticket.search", "channel": "rest", "outcome": "executed"}
	if m, ok := telemetrytest.Last(col.Metrics(), "mandate-dev", "mandate.executor.calls", attrs); !ok || m.Value != 1 {
		t.Fatalf("mandate.executor.calls%v: %+v (found %v)", attrs, m, ok)
	}
}

// backendHops finds the helpdesk backend's server span in the trace and
// counts the spans between it and the caller's span 00f067aa0ba902b7.
func backendHops(all []telemetrytest.Span, traceID string) (int, error) {
	byID := map[string]telemetrytest.Span{}
	var backend *telemetrytest.Span
	for i, s := range all {
		if s.TraceID != traceID {
			continue
		}
		byID[s.SpanID] = s
		if s.Kind == "server" && strings.HasPrefix(s.Name, "examples.helpdesk.v1.HelpdeskService/") {
			backend = &all[i]
		}
	}
	if backend == nil {
		return 0, fmt.Errorf("no helpdesk server span in trace %s", traceID)
	}
	hops := 0
	for s := *backend; s.ParentSpanID != "00f067aa0ba902b7"; hops++ {
		parent, ok := byID[s.ParentSpanID]
		if !ok {
			return 0, fmt.Errorf("span %q has parent %s, which is not in the trace", s.Name, s.ParentSpanID)
		}
		s = parent
	}
	return hops, nil
}
