package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mandate-dev/mandate/internal/config"
)

// runHealthcheck probes a service's /healthz (HTTP) or its gRPC health
// service and exits 0 only when it is serving. Container images without a
// shell or curl use it as their health check.
func runHealthcheck(ctx context.Context, args []string, io IO) error {
	var (
		target, grpcTarget, grpcService string
		timeout                         time.Duration
	)
	s := config.New("healthcheck", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	s.String(&target, "url", "", "HTTP health URL, e.g. http://127.0.0.1:8082/healthz (200 = serving)")
	s.String(&grpcTarget, "grpc-target", "", "gRPC address whose grpc.health.v1 service to ask, e.g. 127.0.0.1:9092")
	s.String(&grpcService, "grpc-service", "", "service name to ask the gRPC health service about (default: the whole server)")
	s.Duration(&timeout, "timeout", 3*time.Second, "give up after this long")
	s.Check(func() error {
		if (target == "") == (grpcTarget == "") {
			return s.Errorf("url", "or --grpc-target is required (one of them)")
		}
		if target != "" {
			if u, err := url.Parse(target); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return s.Errorf("url", "must be an http(s) URL")
			}
		}
		if timeout <= 0 {
			return s.Errorf("timeout", "must be positive")
		}
		return nil
	})
	if err := s.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var err error
	if target != "" {
		err = probeHTTP(ctx, target)
	} else {
		err = probeGRPC(ctx, grpcTarget, grpcService)
	}
	if err != nil {
		return fmt.Errorf("not healthy: %w", err)
	}
	_, err = fmt.Fprintln(io.Stdout, "SERVING")
	return err
}

func probeHTTP(ctx context.Context, target string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", target, resp.Status)
	}
	return nil
}

func probeGRPC(ctx context.Context, target, service string) error {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return err
	}
	if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		return errors.New(target + " reports " + st.String())
	}
	return nil
}
