package clicore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	dirpg "github.com/mandate-dev/mandate/internal/directory/postgres"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/storage/pg"
)

// ServiceFlags are the settings every Mandate service shares. A service's
// command declares them on its flag set and reads its addresses and
// secrets from the fields once the set is parsed.
type ServiceFlags struct {
	GRPCAddr, HTTPAddr string
	// Store is the storage driver: "postgres" or "memory".
	Store         string
	DatabaseURL   config.Secret
	DevSecret     config.Secret
	ServiceSecret config.Secret
	Issuers       []string
	Audience      []string
	JWKSFile      string
	OIDCIssuer    string
	LogLevel      string
	OTLPEndpoint  string
	Metrics       bool
	// MaxConnectionAge and MaxConnectionAgeGrace are the gRPC server's
	// connection lifetime (server.Config), KeepaliveTime the pings of the
	// connections to other services (DeclareDialing; grpc.go).
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	KeepaliveTime                           time.Duration
	// DatabaseReplyTimeout bounds each wait for a reply from Postgres
	// (pg.Options.ReplyTimeout).
	DatabaseReplyTimeout time.Duration
	// pool is the database Pool opened, whose ping is the service's
	// readiness (Serve).
	pool *pgxpool.Pool
}

// Declare declares the service flags on s, with the service's default
// listen addresses, and checks that store=postgres has a database.
func (f *ServiceFlags) Declare(s *config.Set, grpcAddr, httpAddr string) {
	s.String(&f.GRPCAddr, "grpc-addr", grpcAddr, "gRPC listen address")
	s.String(&f.HTTPAddr, "http-addr", httpAddr, "HTTP (REST, health) listen address")
	s.String(&f.Store, "store", "postgres", "storage driver: postgres or memory (memory keeps nothing across restarts)")
	s.SecretVar(&f.DatabaseURL, "database-url", "Postgres connection string (store=postgres)")
	s.Duration(&f.DatabaseReplyTimeout, "database-reply-timeout", pg.DefaultReplyTimeout,
		"how long a statement waits for Postgres to answer before the database counts as unavailable (a hung database: the call is refused, retriable, instead of hanging); must exceed the longest statement")
	s.Check(func() error {
		switch f.Store {
		case "postgres":
			if !f.DatabaseURL.Set() {
				return s.Errorf("database-url", "is required with --store=postgres")
			}
		case "memory":
		default:
			return s.Errorf("store", "must be postgres or memory, not %q", f.Store)
		}
		if f.DatabaseReplyTimeout <= 0 {
			return s.Errorf("database-reply-timeout", "must be positive")
		}
		return nil
	})
	f.DeclareIdentity(s)
}

// DeclareIdentity declares the settings of a service that keeps no data
// (the MCP bridge): tokens, logging, telemetry and the gRPC server's
// connection lifetime.
func (f *ServiceFlags) DeclareIdentity(s *config.Set) {
	s.SecretVar(&f.DevSecret, "dev-secret", "HS256 secret for user and agent tokens (development)")
	s.SecretVar(&f.ServiceSecret, "service-secret", "HS256 secret for service-to-service tokens")
	s.Strings(&f.Issuers, "issuer", []string{DefaultIssuer}, "accepted token issuers")
	s.Strings(&f.Audience, "audience", []string{DefaultAudience}, "accepted token audiences")
	s.String(&f.JWKSFile, "jwks-file", "", "JWKS file with RS256/ES256/EdDSA keys for user and agent tokens")
	s.String(&f.OIDCIssuer, "oidc-issuer", "", "OIDC issuer URL whose discovery document names the signing keys")
	s.String(&f.LogLevel, "log-level", "info", "debug, info, warn or error")
	OTLPFlag(s, &f.OTLPEndpoint)
	MetricsFlag(s, &f.Metrics)
	f.declareServer(s)
	s.Check(func() error {
		var errs []error
		if !f.DevSecret.Set() && f.JWKSFile == "" && f.OIDCIssuer == "" {
			errs = append(errs, s.Errorf("dev-secret", "or --jwks-file or --oidc-issuer is required to verify tokens"))
		}
		if !f.ServiceSecret.Set() {
			errs = append(errs, s.Errorf("service-secret", "is required: services authenticate to each other with it"))
		}
		if _, err := ParseLevel(f.LogLevel); err != nil {
			errs = append(errs, s.Errorf("log-level", "%v", err))
		}
		return errors.Join(errs...)
	})
}

// ParseLevel reads a log level: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("unknown level %q", s)
	}
	return l, nil
}

// Logger is the service's JSON logger at --log-level, each line naming
// the service.
func (f *ServiceFlags) Logger(w io.Writer, service string) *slog.Logger {
	lvl, _ := ParseLevel(f.LogLevel)
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl})).With("service", service)
}

// Authenticator builds the verifier of user/agent tokens and of service
// tokens.
func (f *ServiceFlags) Authenticator(ctx context.Context) (*identity.Authenticator, error) {
	a, _, err := f.Verifiers(ctx)
	return a, err
}

// ServiceOnlyAuthenticator is Authenticator that also admits a Mandate
// service calling with just its own token, on its own authority: the
// executor appending the rows it spooled while the audit trail was down,
// or asking a backend for a receipt, has no user behind the call. Each
// such service decides what a service alone may do.
func (f *ServiceFlags) ServiceOnlyAuthenticator(ctx context.Context) (*identity.Authenticator, error) {
	_, users, err := f.Verifiers(ctx)
	if err != nil {
		return nil, err
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{
		Secret: []byte(f.ServiceSecret.Reveal()), Audience: f.Audience, Issuers: f.Issuers,
	})
	if err != nil {
		return nil, err
	}
	return identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services, AllowServiceOnly: true})
}

// Verifiers is Authenticator that also returns the user/agent token
// verifier, for a service that checks end users' tokens itself.
func (f *ServiceFlags) Verifiers(ctx context.Context) (*identity.Authenticator, *identity.Verifier, error) {
	var dev []byte
	if f.DevSecret.Set() {
		dev = []byte(f.DevSecret.Reveal())
	}
	users, err := identity.NewVerifier(ctx, identity.Config{
		Audience: f.Audience, Issuers: f.Issuers, DevSecret: dev,
		JWKSFile: f.JWKSFile, OIDCIssuerURL: f.OIDCIssuer,
	})
	if err != nil {
		return nil, nil, err
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{
		Secret: []byte(f.ServiceSecret.Reveal()), Audience: f.Audience, Issuers: f.Issuers,
	})
	if err != nil {
		return nil, nil, err
	}
	a, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services})
	return a, users, err
}

// Closers releases what a service opened, in reverse order.
type Closers []func()

// Add adds f, to run before everything added earlier.
func (c *Closers) Add(f func()) { *c = append(*c, f) }

// Close runs them. Its pointer receiver matters: `defer cl.Close()` must
// see what is added after the defer statement.
func (c *Closers) Close() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// Pool opens Postgres for store=postgres (nil for memory).
func (f *ServiceFlags) Pool(ctx context.Context, cl *Closers) (*pgxpool.Pool, error) {
	if f.Store != "postgres" {
		return nil, nil
	}
	p, err := pg.Open(ctx, f.DatabaseURL.Reveal(), pg.Options{WaitFor: DatabaseWait, ReplyTimeout: f.DatabaseReplyTimeout})
	if err != nil {
		return nil, err
	}
	cl.Add(p.Close)
	f.pool = p
	return p, nil
}

// Directory opens the policy directory behind a cache: Postgres with change
// notifications, or an empty in-memory directory.
func (f *ServiceFlags) Directory(pool *pgxpool.Pool, cl *Closers) directory.Resolver {
	cache := directory.NewCache(DirectoryStore(pool, nil, cl), directory.CacheOptions{TTL: 30 * time.Second})
	cl.Add(cache.Close)
	return cache
}

// DirectoryStore opens the policy directory itself: Postgres on pool (closed
// with cl), or an empty in-memory directory without one. log nil means
// slog.Default().
func DirectoryStore(pool *pgxpool.Pool, log *slog.Logger, cl *Closers) directory.Store {
	if pool == nil {
		return dirmem.New()
	}
	s := dirpg.New(pool, dirpg.Options{Logger: log})
	cl.Add(s.Close)
	return s
}

// Serve runs a service command's server until ctx ends: a server as cfg
// describes it, at the addresses and with the connection lifetime of the
// flags, with what register puts on
// it, in a Group to which start (when not nil) adds the service's loops and
// stop hooks.
func (f *ServiceFlags) Serve(ctx context.Context, cfg server.Config, register func(*server.Server), start func(*Group)) error {
	if cfg.Ready == nil && f.pool != nil {
		// A service on Postgres can serve only while its database answers:
		// /healthz and gRPC health say not-ready within a second or two of
		// it hanging or going away (server.Config.Ready).
		pool := f.pool
		cfg.Ready = pool.Ping
	}
	srv, err := server.New(f.ServerConfig(cfg))
	if err != nil {
		return err
	}
	register(srv)
	var p Group
	if start != nil {
		start(&p)
	}
	p.Serve(srv.Run)
	return p.Run(ctx)
}
