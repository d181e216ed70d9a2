package cli

import (
	"context"

	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	dirpg "github.com/mandate-dev/mandate/internal/directory/postgres"
	"github.com/mandate-dev/mandate/internal/server"
)

// runCatalog runs the catalog: per-principal tool lists, manifest reads,
// change streams, and the ops.review command (relayed by the executor).
func runCatalog(ctx context.Context, args []string, io IO) error {
	var (
		f                  serviceFlags
		mf                 manifestFlags
		confirmSideEffects bool
	)
	s := config.New("catalog", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	f.declare(s, "127.0.0.1:9091", "127.0.0.1:8081")
	mf.declare(s)
	s.Bool(&confirmSideEffects, "confirm-side-effects", false,
		"state in the tools that every command declaring side effects requires confirmation; give the executor the same value")
	if err := s.Parse(args); err != nil {
		return err
	}
	log := f.logger(io.Stderr, "catalog")
	var cl closers
	defer cl.close()
	metrics, err := f.tracing(ctx, io, "catalog", log, &cl)
	if err != nil {
		return err
	}
	set, err := mf.load()
	if err != nil {
		return err
	}
	auth, err := f.authenticator(ctx)
	if err != nil {
		return err
	}
	pool, err := f.pool(ctx, &cl)
	if err != nil {
		return err
	}
	var store directory.Store = dirmem.New()
	if pool != nil {
		ps := dirpg.New(pool, dirpg.Options{Logger: log})
		cl.add(ps.Close)
		store = ps
	}
	svc, err := buildCatalog(catalogDeps{Manifest: set, Directory: store, ConfirmSideEffects: confirmSideEffects, Logger: log}, &cl)
	if err != nil {
		return err
	}
	srv, err := server.New(server.Config{Name: "mandate.v1.CatalogService", GRPCAddr: f.grpcAddr, HTTPAddr: f.httpAddr, Auth: auth, Logger: log, Metrics: metrics})
	if err != nil {
		return err
	}
	svc.register(srv)
	var p processGroup
	p.serve(srv.Run)
	return p.run(ctx)
}
