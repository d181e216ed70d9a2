// Package confirmcmd builds the confirm service and its approval pages and
// runs them as a command: `mandate confirm` and the mandate-confirm binary.
// `mandate dev` builds them with the same Build. It imports no other
// service, so that mandate-confirm links only the confirm service.
package confirmcmd

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmapi "github.com/mandate-dev/mandate/services/confirm/api"
	confirmmem "github.com/mandate-dev/mandate/services/confirm/memory"
	"github.com/mandate-dev/mandate/services/confirm/page"
	confirmpg "github.com/mandate-dev/mandate/services/confirm/postgres"
	"github.com/mandate-dev/mandate/services/confirm/trail"
)

// Deps are what the confirm service is built from.
type Deps struct {
	Store     confirm.Store
	Sessions  confirm.SessionStore
	Directory directory.Resolver
	Manifest  *manifest.Set
	// BaseURL is the public origin of the approval pages.
	BaseURL string
	// LoginSecret signs the one-time sign-in links of the approval pages,
	// issued by one of Issuers.
	LoginSecret []byte
	Issuers     []string
	// Audit is the audit service, dialled as the confirm service
	// (identity.ConfirmService): every attempt to decide a challenge is
	// appended there as a decision row, and the trail page
	// (/approve/audit) reads the signed-in user's tenant's trail there.
	// Nil records none and serves no trail page (tests).
	Audit grpc.ClientConnInterface
	// TokenAudience is the `aud` of the one-minute user tokens the trail
	// page relays to Audit for the signed-in user: an audience the audit
	// service accepts. Required with Audit.
	TokenAudience string
	// Webhook is where challenges opened, decided and expired are posted,
	// signed (confirm.WebhookRelay); its URL "" posts nothing.
	Webhook confirm.WebhookConfig
	Logger  *slog.Logger
}

// Service is the confirm service's API and its approval pages.
type Service struct {
	api   *confirmapi.Service
	pages http.Handler
	trail *trail.Trail
	// relay delivers the store's notices as webhooks (and drops them when
	// no URL is set); nil when the store keeps none.
	relay *confirm.WebhookRelay
}

// Build builds the confirm service and its approval pages.
func Build(d Deps) (*Service, error) {
	cfg := confirm.Config{Store: d.Store, Directory: d.Directory, Commands: d.Manifest, ApprovalBaseURL: d.BaseURL, Logger: d.Logger}
	var (
		tr          *trail.Trail
		auditClient mandatev1.AuditServiceClient
	)
	if d.Audit != nil {
		auditClient = mandatev1.NewAuditServiceClient(d.Audit)
		tr = trail.New(trail.Options{Audit: auditClient, Logger: d.Logger})
		cfg.Trail = tr
	}
	svc, err := confirm.New(cfg)
	if err != nil {
		return nil, err
	}
	pages, err := page.New(page.Config{
		Confirm: svc, Sessions: d.Sessions, Directory: d.Directory, LoginSecret: d.LoginSecret,
		Issuers: d.Issuers, BaseURL: d.BaseURL, Logger: d.Logger, Audit: auditClient, TokenAudience: d.TokenAudience,
	})
	if err != nil {
		return nil, err
	}
	out := &Service{api: confirmapi.New(svc, d.Logger), pages: pages, trail: tr}
	if ns, ok := d.Store.(confirm.NoticeStore); ok {
		wh := d.Webhook
		wh.Logger = d.Logger
		out.relay = confirm.NewWebhookRelay(ns, svc, wh)
	}
	return out, nil
}

// Start runs the retries of the decision rows the audit service did not
// take at once (trail.Trail.Run); they end after the servers, with one last
// attempt.
func (c *Service) Start(p *clicore.Group) {
	if c.trail != nil {
		p.Loop(c.trail.Run)
	}
	if c.relay != nil {
		p.Loop(func(ctx context.Context) error { c.relay.Run(ctx); return nil })
	}
}

// Register serves the ConfirmService, its REST routes and the approval
// pages on srv.
func (c *Service) Register(srv *server.Server) {
	c.RegisterAPI(srv)
	srv.HandleGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return mandatev1.RegisterConfirmServiceHandler(ctx, mux, conn)
	})
	srv.Handle(page.Pattern, c.pages)
}

// RegisterAPI serves the ConfirmService alone on srv, without REST routes
// or pages: `mandate dev` serves it to the executor on an internal server.
func (c *Service) RegisterAPI(srv *server.Server) { c.api.Register(srv) }

// DeclareWebhook declares --webhook-url and --webhook-secret on s and
// checks them when s is parsed; the returned configuration holds them
// then (URL "" when none is set).
func DeclareWebhook(s *config.Set) *confirm.WebhookConfig {
	var (
		out    confirm.WebhookConfig
		secret config.Secret
	)
	s.String(&out.URL, "webhook-url", "", "URL that receives a POST, signed by the Standard Webhooks scheme with --webhook-secret, for every challenge opened, decided and expired (at least once, retried with backoff; docs/architecture/confirmation.md#webhooks); empty: none")
	s.SecretVar(&secret, "webhook-secret", "Standard Webhooks secret (whsec_ and the base64 of at least 24 random bytes) that signs the webhooks; required with --webhook-url")
	s.Check(func() error {
		if out.URL == "" {
			return nil
		}
		if u, err := url.Parse(out.URL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return s.Errorf("webhook-url", "must be an absolute http or https URL")
		}
		if !secret.Set() {
			return s.Errorf("webhook-secret", "is required with --webhook-url: receivers verify every delivery's signature")
		}
		var err error
		if out.Key, err = confirm.ParseWebhookSecret(secret.Reveal()); err != nil {
			return s.Errorf("webhook-secret", "%s", err)
		}
		return nil
	})
	return &out
}

// Run runs the confirm service and its approval pages.
func Run(ctx context.Context, args []string, io clicore.IO) error {
	var (
		f         clicore.ServiceFlags
		mf        clicore.ManifestFlags
		baseURL   string
		auditAddr string
		retain    time.Duration
	)
	s := config.New("confirm", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	f.Declare(s, "127.0.0.1:9093", "127.0.0.1:8083")
	f.DeclareDialing(s)
	mf.Declare(s)
	s.String(&auditAddr, "audit-addr", "127.0.0.1:9094", "gRPC address of the audit service, where every attempt to decide a challenge is appended as a decision row (host:port or dns:///host:port, balanced round robin); the confirm service authenticates there with --service-secret, as the executor does")
	s.String(&baseURL, "approval-base-url", "", "public origin of the approval pages (default http://<http-addr>)")
	s.Duration(&retain, "retain-challenges", 0, "how long a challenge is kept after it expires (it reads as expired meanwhile), then deleted with its webhook notices; 0: the store's default (a week with --database-url, an hour in memory)")
	hook := DeclareWebhook(s)
	s.Check(func() error {
		if retain < 0 {
			return s.Errorf("retain-challenges", "must not be negative")
		}
		if !f.DevSecret.Set() {
			return s.Errorf("dev-secret", "is required: it signs the one-time sign-in links of the approval page")
		}
		return nil
	})
	if err := s.Parse(args); err != nil {
		return err
	}
	if baseURL == "" {
		baseURL = "http://" + f.HTTPAddr
	}
	log := f.Logger(io.Stderr, "confirm")
	var cl clicore.Closers
	defer cl.Close()
	metrics, err := f.Tracing(ctx, io, "confirm", log, &cl)
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
	dial, err := f.ServiceDialer(identity.ConfirmService, set.Digest(), &cl)
	if err != nil {
		return err
	}
	auditConn, err := dial.Service(auditAddr)
	if err != nil {
		return err
	}
	var (
		store    confirm.Store
		sessions confirm.SessionStore
	)
	pool, err := f.Pool(ctx, &cl)
	if err != nil {
		return err
	}
	if pool != nil {
		ps := confirmpg.New(pool, confirmpg.Options{Logger: log, Retain: retain})
		cl.Add(ps.Close)
		store, sessions = ps, ps
	} else {
		ms := confirmmem.New(confirmmem.Options{Retain: retain})
		cl.Add(ms.Close)
		store, sessions = ms, ms
	}
	// The trail page's user tokens carry the audience the services accept
	// first.
	aud := clicore.DefaultAudience
	if len(f.Audience) > 0 {
		aud = f.Audience[0]
	}
	svc, err := Build(Deps{Store: store, Sessions: sessions, Directory: f.Directory(pool, &cl), Manifest: set,
		BaseURL: baseURL, LoginSecret: []byte(f.DevSecret.Reveal()), Issuers: f.Issuers, Audit: auditConn,
		TokenAudience: aud, Webhook: *hook, Logger: log})
	if err != nil {
		return err
	}
	return f.Serve(ctx, server.Config{Name: "mandate.v1.ConfirmService", Auth: auth, Logger: log, Metrics: metrics, ManifestDigest: set.Digest()}, svc.Register, svc.Start)
}
