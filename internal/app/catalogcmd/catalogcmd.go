// Package catalogcmd builds the catalog and runs it as a command:
// `mandate catalog` and the mandate-catalog binary. `mandate dev` builds
// it with the same Build. It imports no other service, so that
// mandate-catalog links only the catalog.
package catalogcmd

import (
	"context"
	"log/slog"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/manifestcheck"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/catalog"
	catalogapi "github.com/mandate-dev/mandate/services/catalog/api"
)

// Deps are what the catalog is built from.
type Deps struct {
	Manifest *manifest.Set
	// Directory is watched for the changes of principals' tool lists.
	Directory          directory.Store
	ConfirmSideEffects bool
	Logger             *slog.Logger
}

// Service is the catalog's API: tool lists, manifest reads, change
// streams, and the ops.review command the executor relays.
type Service struct {
	api *catalogapi.Service
	// digest is the manifest's: a Mandate service declaring another is
	// refused (manifestcheck.Guard).
	digest string
}

// Build builds the catalog; it is closed with cl.
func Build(d Deps, cl *clicore.Closers) (*Service, error) {
	cat, err := catalog.New(catalog.Config{Manifest: d.Manifest, Directory: d.Directory, ConfirmSideEffects: d.ConfirmSideEffects,
		TrustedServices: []string{identity.ExecutorService}, Logger: d.Logger})
	if err != nil {
		return nil, err
	}
	cl.Add(cat.Close)
	return &Service{api: catalogapi.New(cat, d.Logger), digest: d.Manifest.Digest()}, nil
}

// Register serves the CatalogService and its REST routes on srv.
func (c *Service) Register(srv *server.Server) {
	c.RegisterAPI(srv)
	srv.HandleGateway(catalogapi.Gateway)
}

// RegisterAPI serves the CatalogService alone on srv, without REST routes:
// `mandate dev` serves it on its backend server too, where the executor
// dispatches ops.review like any backend command. A caller (the bridge,
// the executor relaying ops.review) that declares another manifest is
// refused with manifest.mismatch before any method runs.
func (c *Service) RegisterAPI(srv *server.Server) {
	srv.RegisterService(manifestcheck.Guard(&mandatev1.CatalogService_ServiceDesc, c.digest), c.api)
}

// Run runs the catalog: per-principal tool lists, manifest reads, change
// streams, and the ops.review command (relayed by the executor).
func Run(ctx context.Context, args []string, io clicore.IO) error {
	var (
		f                  clicore.ServiceFlags
		mf                 clicore.ManifestFlags
		confirmSideEffects bool
	)
	s := config.New("catalog", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	f.Declare(s, "127.0.0.1:9091", "127.0.0.1:8081")
	mf.Declare(s)
	s.Bool(&confirmSideEffects, "confirm-side-effects", false,
		"state in the tools that every command declaring side effects requires confirmation; give the executor the same value")
	if err := s.Parse(args); err != nil {
		return err
	}
	log := f.Logger(io.Stderr, "catalog")
	var cl clicore.Closers
	defer cl.Close()
	metrics, err := f.Tracing(ctx, io, "catalog", log, &cl)
	if err != nil {
		return err
	}
	set, err := mf.Load()
	if err != nil {
		return err
	}
	auth, err := f.Authenticator(ctx)
	if err != nil {
		return err
	}
	pool, err := f.Pool(ctx, &cl)
	if err != nil {
		return err
	}
	svc, err := Build(Deps{Manifest: set, Directory: clicore.DirectoryStore(pool, log, &cl), ConfirmSideEffects: confirmSideEffects, Logger: log}, &cl)
	if err != nil {
		return err
	}
	return f.Serve(ctx, server.Config{Name: "mandate.v1.CatalogService", Auth: auth, Logger: log, Metrics: metrics, ManifestDigest: set.Digest()}, svc.Register, nil)
}
