package cli

import (
	"context"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpmem "github.com/mandate-dev/mandate/examples/helpdesk/memory"
	helppg "github.com/mandate-dev/mandate/examples/helpdesk/postgres"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/server"
)

// runHelpdesk runs the sample backend. It serves only calls relayed by the
// executor (service token + the caller's token).
func runHelpdesk(ctx context.Context, args []string, io IO) error {
	var (
		f    serviceFlags
		seed bool
	)
	s := config.New("helpdesk", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	f.declare(s, "127.0.0.1:9191", "127.0.0.1:8191")
	s.Bool(&seed, "seed", true, "create the demo tickets and expense reports if they are missing")
	if err := s.Parse(args); err != nil {
		return err
	}
	log := f.logger(io.Stderr, "helpdesk")
	var cl closers
	defer cl.close()
	metrics, err := f.tracing(ctx, io, "helpdesk", log, &cl)
	if err != nil {
		return err
	}
	auth, err := f.serviceOnlyAuthenticator(ctx)
	if err != nil {
		return err
	}
	pool, err := f.pool(ctx, &cl)
	if err != nil {
		return err
	}
	var store helpdesk.Store = helpmem.New()
	if pool != nil {
		store = helppg.New(pool)
	}
	svc, err := buildHelpdesk(ctx, helpdeskDeps{Store: store, Seed: seed, Logger: log})
	if err != nil {
		return err
	}
	srv, err := server.New(server.Config{Name: "examples.helpdesk.v1.HelpdeskService", GRPCAddr: f.grpcAddr, HTTPAddr: f.httpAddr, Auth: auth, Logger: log, Metrics: metrics})
	if err != nil {
		return err
	}
	svc.register(srv)
	var p processGroup
	p.serve(srv.Run)
	return p.run(ctx)
}
