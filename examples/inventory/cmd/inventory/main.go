// Command inventory serves the inventory sample behind Mandate's executor:
//
//	MANDATE_SERVICE_SECRET=… MANDATE_DEV_SECRET=… inventory --listen 127.0.0.1:9300
//
// It admits only calls the executor relays (pkg/backend's Guard): the
// executor's service token, signed with MANDATE_SERVICE_SECRET, and the
// user's token, signed with MANDATE_DEV_SECRET in `mandate dev` (or verified
// against MANDATE_OIDC_ISSUER_URL in production).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mandate-dev/mandate/pkg/backend"

	"example.com/inventory"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "inventory:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:9300", "gRPC address to serve on")
	issuer := flag.String("issuer", "mandate-dev", "accepted token issuer (Mandate's --issuer)")
	audience := flag.String("audience", "mandate", "accepted token audience (Mandate's --audience)")
	flag.Parse()
	cfg := backend.Config{
		ServiceSecret: []byte(os.Getenv("MANDATE_SERVICE_SECRET")),
		OIDCIssuerURL: os.Getenv("MANDATE_OIDC_ISSUER_URL"),
		Issuers:       []string{*issuer},
		Audience:      []string{*audience},
	}
	if s := os.Getenv("MANDATE_DEV_SECRET"); s != "" {
		cfg.DevSecret = []byte(s)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	guard, err := backend.New(ctx, cfg)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(guard.ServerOptions()...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	if err := inventory.New().Register(srv); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	slog.Info("inventory: serving", "addr", lis.Addr().String())
	go func() { <-ctx.Done(); srv.GracefulStop() }()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}
