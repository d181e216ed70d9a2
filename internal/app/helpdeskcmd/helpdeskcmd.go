// Package helpdeskcmd builds the helpdesk sample backend and runs it as a
// command: `mandate helpdesk` and the mandate-helpdesk binary. `mandate
// dev` builds it with the same Build. It imports no Mandate service: the
// backend knows the executor only by its service token.
package helpdeskcmd

import (
	"context"
	"log/slog"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpmem "github.com/mandate-dev/mandate/examples/helpdesk/memory"
	helppg "github.com/mandate-dev/mandate/examples/helpdesk/postgres"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
)

// Deps are what the sample backend is built from.
type Deps struct {
	Store helpdesk.Store
	// Seed creates the demo tickets and expense reports if missing.
	Seed   bool
	Logger *slog.Logger
}

// Service is the sample backend: its HelpdeskService and ReceiptService,
// which serve only calls relayed by the executor, and its fake payment
// gateway.
type Service struct {
	backend *helpdesk.Backend
	gateway *helpdesk.Gateway
}

// Build builds the backend, seeding its store first if d.Seed.
func Build(ctx context.Context, d Deps) (*Service, error) {
	if d.Seed {
		if err := helpdesk.Seed(ctx, d.Store); err != nil {
			return nil, err
		}
	}
	gateway := helpdesk.NewGateway()
	backend, err := helpdesk.New(helpdesk.Config{Store: d.Store, Gateway: gateway,
		TrustedServices: []string{identity.ExecutorService}, Logger: d.Logger})
	if err != nil {
		return nil, err
	}
	return &Service{backend: backend, gateway: gateway}, nil
}

// Register serves the backend on srv, with the fake gateway's counters
// (read-only, for end-to-end tests).
func (h *Service) Register(srv *server.Server) {
	h.backend.Register(srv) // HelpdeskService and its ReceiptService (pkg/receipt)
	srv.Handle("GET /gateway/counters", h.gateway.CountersHandler())
}

// Run runs the sample backend. It serves only calls relayed by the
// executor (service token + the caller's token).
func Run(ctx context.Context, args []string, io clicore.IO) error {
	var (
		f    clicore.ServiceFlags
		seed bool
	)
	s := config.New("helpdesk", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	f.Declare(s, "127.0.0.1:9191", "127.0.0.1:8191")
	s.Bool(&seed, "seed", true, "create the demo tickets and expense reports if they are missing")
	if err := s.Parse(args); err != nil {
		return err
	}
	log := f.Logger(io.Stderr, "helpdesk")
	var cl clicore.Closers
	defer cl.Close()
	metrics, err := f.Tracing(ctx, io, "helpdesk", log, &cl)
	if err != nil {
		return err
	}
	auth, err := f.ServiceOnlyAuthenticator(ctx)
	if err != nil {
		return err
	}
	pool, err := f.Pool(ctx, &cl)
	if err != nil {
		return err
	}
	var store helpdesk.Store = helpmem.New()
	if pool != nil {
		store = helppg.New(pool)
	}
	svc, err := Build(ctx, Deps{Store: store, Seed: seed, Logger: log})
	if err != nil {
		return err
	}
	return f.Serve(ctx, server.Config{Name: "examples.helpdesk.v1.HelpdeskService", Auth: auth, Logger: log, Metrics: metrics}, svc.Register, nil)
}
