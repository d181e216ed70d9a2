package cli

import (
	"context"
	"time"

	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmmem "github.com/mandate-dev/mandate/services/confirm/memory"
	"github.com/mandate-dev/mandate/services/confirm/page"
	confirmpg "github.com/mandate-dev/mandate/services/confirm/postgres"
)

// manifestFlags select the manifest: the embedded sample domain, or a
// deployment's own pair of files.
type manifestFlags struct{ manifest, descriptors string }

func (m *manifestFlags) declare(s *config.Set) {
	s.String(&m.manifest, "manifest", "", "manifest.json of the deployment (default: the embedded helpdesk sample)")
	s.String(&m.descriptors, "descriptors", "", "descriptors.binpb that goes with --manifest")
	s.Check(func() error {
		if (m.manifest == "") != (m.descriptors == "") {
			return s.Errorf("manifest", "and --descriptors must be given together")
		}
		return nil
	})
}

func (m *manifestFlags) load() (*manifest.Set, error) {
	if m.manifest == "" {
		return manifest.Embedded()
	}
	return manifest.LoadFiles(m.manifest, m.descriptors)
}

func runConfirm(ctx context.Context, args []string, io IO) error {
	var (
		f       serviceFlags
		mf      manifestFlags
		baseURL string
	)
	s := config.New("confirm", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	f.declare(s, "127.0.0.1:9093", "127.0.0.1:8083")
	mf.declare(s)
	s.String(&baseURL, "approval-base-url", "", "public origin of the approval pages (default http://<http-addr>)")
	s.Check(func() error {
		if !f.devSecret.Set() {
			return s.Errorf("dev-secret", "is required: it signs the one-time sign-in links of the approval page")
		}
		return nil
	})
	if err := s.Parse(args); err != nil {
		return err
	}
	if baseURL == "" {
		baseURL = "http://" + f.httpAddr
	}
	log := f.logger(io.Stderr, "confirm")
	var cl closers
	defer cl.close()
	metrics, err := f.tracing(ctx, io, "confirm", log, &cl)
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
	var (
		store    confirm.Store
		sessions confirm.SessionStore
	)
	pool, err := f.pool(ctx, &cl)
	if err != nil {
		return err
	}
	if pool != nil {
		ps := confirmpg.New(pool, confirmpg.Options{Logger: log})
		cl.add(ps.Close)
		store, sessions = ps, ps
	} else {
		ms := confirmmem.New(confirmmem.Options{})
		cl.add(ms.Close)
		store, sessions = ms, ms
	}
	svc, err := buildConfirm(confirmDeps{Store: store, Sessions: sessions, Directory: f.directory(pool, &cl), Manifest: set,
		BaseURL: baseURL, LoginSecret: []byte(f.devSecret.Reveal()), Issuers: f.issuers, Logger: log})
	if err != nil {
		return err
	}
	srv, err := server.New(server.Config{Name: "mandate.v1.ConfirmService", GRPCAddr: f.grpcAddr, HTTPAddr: f.httpAddr, Auth: auth, Logger: log, Metrics: metrics})
	if err != nil {
		return err
	}
	svc.register(srv)
	var p processGroup
	p.serve(srv.Run)
	return p.run(ctx)
}

// loginURL prints a one-time sign-in link to the approval pages.
func loginURL(base string, secret config.Secret, issuer, user, tenant string, ttl time.Duration) (string, error) {
	if ttl > page.MaxLoginTTL {
		ttl = page.MaxLoginTTL
	}
	return page.LoginURL(base, []byte(secret.Reveal()), issuer, user, tenant, ttl)
}
