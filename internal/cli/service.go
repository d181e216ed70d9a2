package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	dirpg "github.com/mandate-dev/mandate/internal/directory/postgres"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/telemetry"
)

// serviceFlags are the settings every Mandate service shares.
type serviceFlags struct {
	grpcAddr, httpAddr string
	storeKind          string
	databaseURL        config.Secret
	devSecret          config.Secret
	serviceSecret      config.Secret
	issuers, audience  []string
	jwksFile, oidcURL  string
	logLevel           string
	otlpEndpoint       string
	metrics            bool
}

func (f *serviceFlags) declare(s *config.Set, grpcAddr, httpAddr string) {
	s.String(&f.grpcAddr, "grpc-addr", grpcAddr, "gRPC listen address")
	s.String(&f.httpAddr, "http-addr", httpAddr, "HTTP (REST, health) listen address")
	s.String(&f.storeKind, "store", "postgres", "storage driver: postgres or memory (memory keeps nothing across restarts)")
	s.SecretVar(&f.databaseURL, "database-url", "Postgres connection string (store=postgres)")
	s.Check(func() error {
		switch f.storeKind {
		case "postgres":
			if !f.databaseURL.Set() {
				return s.Errorf("database-url", "is required with --store=postgres")
			}
		case "memory":
		default:
			return s.Errorf("store", "must be postgres or memory, not %q", f.storeKind)
		}
		return nil
	})
	f.declareIdentity(s)
}

// declareIdentity declares the token settings alone, for a service that
// keeps no data (the MCP bridge).
func (f *serviceFlags) declareIdentity(s *config.Set) {
	s.SecretVar(&f.devSecret, "dev-secret", "HS256 secret for user and agent tokens (development)")
	s.SecretVar(&f.serviceSecret, "service-secret", "HS256 secret for service-to-service tokens")
	s.Strings(&f.issuers, "issuer", []string{DefaultIssuer}, "accepted token issuers")
	s.Strings(&f.audience, "audience", []string{DefaultAudience}, "accepted token audiences")
	s.String(&f.jwksFile, "jwks-file", "", "JWKS file with RS256/ES256/EdDSA keys for user and agent tokens")
	s.String(&f.oidcURL, "oidc-issuer", "", "OIDC issuer URL whose discovery document names the signing keys")
	s.String(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	otlpFlag(s, &f.otlpEndpoint)
	metricsFlag(s, &f.metrics)
	s.Check(func() error {
		var errs []error
		if !f.devSecret.Set() && f.jwksFile == "" && f.oidcURL == "" {
			errs = append(errs, s.Errorf("dev-secret", "or --jwks-file or --oidc-issuer is required to verify tokens"))
		}
		if !f.serviceSecret.Set() {
			errs = append(errs, s.Errorf("service-secret", "is required: services authenticate to each other with it"))
		}
		if _, err := parseLevel(f.logLevel); err != nil {
			errs = append(errs, s.Errorf("log-level", "%v", err))
		}
		return errors.Join(errs...)
	})
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("unknown level %q", s)
	}
	return l, nil
}

func (f *serviceFlags) logger(w io.Writer, service string) *slog.Logger {
	lvl, _ := parseLevel(f.logLevel)
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl})).With("service", service)
}

// authenticator builds the verifier of user/agent tokens and of service
// tokens.
func (f *serviceFlags) authenticator(ctx context.Context) (*identity.Authenticator, error) {
	a, _, err := f.verifiers(ctx)
	return a, err
}

// serviceOnlyAuthenticator is authenticator that also admits a Mandate
// service calling with just its own token, on its own authority: the
// executor appending the rows it spooled while the audit trail was down,
// or asking a backend for a receipt, has no user behind the call. Each
// such service decides what a service alone may do.
func (f *serviceFlags) serviceOnlyAuthenticator(ctx context.Context) (*identity.Authenticator, error) {
	_, users, err := f.verifiers(ctx)
	if err != nil {
		return nil, err
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{
		Secret: []byte(f.serviceSecret.Reveal()), Audience: f.audience, Issuers: f.issuers,
	})
	if err != nil {
		return nil, err
	}
	return identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services, AllowServiceOnly: true})
}

// verifiers is authenticator that also returns the user/agent token
// verifier, for a service that checks end users' tokens itself.
func (f *serviceFlags) verifiers(ctx context.Context) (*identity.Authenticator, *identity.Verifier, error) {
	var dev []byte
	if f.devSecret.Set() {
		dev = []byte(f.devSecret.Reveal())
	}
	users, err := identity.NewVerifier(ctx, identity.Config{
		Audience: f.audience, Issuers: f.issuers, DevSecret: dev,
		JWKSFile: f.jwksFile, OIDCIssuerURL: f.oidcURL,
	})
	if err != nil {
		return nil, nil, err
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{
		Secret: []byte(f.serviceSecret.Reveal()), Audience: f.audience, Issuers: f.issuers,
	})
	if err != nil {
		return nil, nil, err
	}
	a, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services})
	return a, users, err
}

// closers releases what a service opened, in reverse order.
type closers []func()

func (c *closers) add(f func()) { *c = append(*c, f) }

// close runs them. Its pointer receiver matters: `defer cl.close()` must
// see what is added after the defer statement.
func (c *closers) close() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// pool opens Postgres for store=postgres (nil for memory).
func (f *serviceFlags) pool(ctx context.Context, cl *closers) (*pgxpool.Pool, error) {
	if f.storeKind != "postgres" {
		return nil, nil
	}
	p, err := openPool(ctx, f.databaseURL)
	if err != nil {
		return nil, err
	}
	cl.add(p.Close)
	return p, nil
}

// directory opens the policy directory behind a cache: Postgres with change
// notifications, or an empty in-memory directory.
func (f *serviceFlags) directory(pool *pgxpool.Pool, cl *closers) directory.Resolver {
	var store directory.Store
	if pool != nil {
		s := dirpg.New(pool, dirpg.Options{})
		cl.add(s.Close)
		store = s
	} else {
		store = dirmem.New()
	}
	cache := directory.NewCache(store, directory.CacheOptions{TTL: 30 * time.Second})
	cl.add(cache.Close)
	return cache
}

// serviceDialer returns how a service dials the other Mandate services: as
// service `name` (a service token, with the caller's token relayed), with
// the trace context on every call. Connections are closed with cl.
func (f *serviceFlags) serviceDialer(name string, cl *closers) (func(addr string) (*grpc.ClientConn, error), error) {
	src, err := identity.NewServiceTokenSource([]byte(f.serviceSecret.Reveal()), f.issuers[0], f.audience[0], name, time.Hour)
	if err != nil {
		return nil, err
	}
	return func(addr string) (*grpc.ClientConn, error) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), telemetry.GRPCClientOption(),
			grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)),
			grpc.WithStreamInterceptor(identity.StreamClientInterceptor(src)))
		if err != nil {
			return nil, fmt.Errorf("dialing %s: %w", addr, err)
		}
		cl.add(func() { _ = conn.Close() })
		return conn, nil
	}, nil
}
