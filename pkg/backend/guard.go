package backend

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/grpc"

	"github.com/mandate-dev/mandate/internal/identity"
)

// DefaultRelay is the service name in the executor's service tokens: the one service whose
// calls a backend serves unless Config.Relay names another.
const DefaultRelay = identity.ExecutorService

// Headers (gRPC metadata keys) of a call the executor dispatches.
const (
	// AuthorizationHeader carries "Bearer <the executor's service token>".
	AuthorizationHeader = "authorization"
	// OnBehalfOfHeader carries "Bearer <the end user's or agent's own token>", as the
	// user presented it to Mandate.
	OnBehalfOfHeader = identity.OnBehalfOfHeader
)

// receiptService is the prefix of the methods the executor calls with its service token
// alone: it asks whether an invocation ran when no user is behind the question (reconciling).
const receiptService = "/mandate.v1.ReceiptService/"

// Config configures a Guard. Issuers, Audience and ServiceSecret are required, and at least one
// key source of users' tokens (DevSecret, JWKSFile, OIDCIssuerURL).
type Config struct {
	// ServiceSecret is the HS256 key Mandate's services sign their service tokens with
	// (`mandate … --service-secret`), at least 32 bytes. It must differ from DevSecret.
	ServiceSecret []byte
	// DevSecret is the HS256 key of users' tokens in `mandate dev`; nil in production.
	DevSecret []byte
	// JWKSFile is the path of a JWK Set with the public keys of users' tokens (RS256, ES256,
	// EdDSA), read once by New.
	JWKSFile string
	// OIDCIssuerURL is an OpenID Connect issuer whose keys verify users' tokens; New fetches
	// them and they are refreshed in the background until New's context ends.
	OIDCIssuerURL string
	// HTTPClient fetches the OIDC documents; nil means a client with a 10s timeout.
	HTTPClient *http.Client
	// Issuers are the accepted `iss` values of both kinds of token, as Mandate's services are
	// configured (`--issuer`).
	Issuers []string
	// Audience are the accepted `aud` values (`--audience`); a token must name one.
	Audience []string
	// Relay is the `mandate_service` of the one service whose relayed calls are served;
	// empty means DefaultRelay, the executor.
	Relay string
}

// Guard authenticates the calls a backend receives and admits only those the relaying Mandate
// service (the executor) made. It is safe for concurrent use.
type Guard struct {
	auth  *identity.Authenticator
	relay string
}

// New validates cfg and loads the keys of users' tokens. With an OIDC issuer it fetches them
// now, so a misconfigured issuer fails at startup, and keeps them fresh until ctx ends.
func New(ctx context.Context, cfg Config) (*Guard, error) {
	if cfg.Relay == "" {
		cfg.Relay = DefaultRelay
	}
	users, err := identity.NewVerifier(ctx, identity.Config{
		Audience: cfg.Audience, Issuers: cfg.Issuers, DevSecret: cfg.DevSecret,
		JWKSFile: cfg.JWKSFile, OIDCIssuerURL: cfg.OIDCIssuerURL, HTTPClient: cfg.HTTPClient,
	})
	if err != nil {
		return nil, backendError(err)
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{
		Secret: cfg.ServiceSecret, Audience: cfg.Audience, Issuers: cfg.Issuers,
	})
	if err != nil {
		return nil, backendError(err)
	}
	// AllowServiceOnly: the executor asks for receipts with its token alone; admit confines
	// such calls to the ReceiptService.
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services, AllowServiceOnly: true})
	if err != nil {
		return nil, backendError(err)
	}
	return &Guard{auth: auth, relay: cfg.Relay}, nil
}

// backendError names this package in a configuration error of the one it is built on.
func backendError(err error) error { return fmt.Errorf("backend: %w", err) }

// Relay is the service whose relayed calls the Guard admits.
func (g *Guard) Relay() string { return g.relay }

// ServerOptions installs the Guard's interceptors on a grpc.Server, ahead of any interceptor
// given in a later option.
func (g *Guard) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(g.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(g.StreamServerInterceptor()),
	}
}

// UnaryServerInterceptor serves a unary call only when the relay's service token and a valid
// user's token came with it (or, for mandate.v1.ReceiptService, the relay's service token
// alone). A missing, invalid or expired token is refused with Unauthenticated and an
// `authentication.*` code at stage authenticate; a user calling directly, a call relayed by
// another service, or a service token alone outside the ReceiptService with PermissionDenied
// and CodeScopeNotViaExecutor at stage scope_check. Health checks and server reflection are
// served without a token.
func (g *Guard) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	authn := g.auth.UnaryServerInterceptor()
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return authn(ctx, req, info, func(ctx context.Context, req any) (any, error) {
			ctx, err := g.admit(ctx, info.FullMethod)
			if err != nil {
				return nil, err
			}
			return handler(ctx, req)
		})
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streams.
func (g *Guard) StreamServerInterceptor() grpc.StreamServerInterceptor {
	authn := g.auth.StreamServerInterceptor()
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return authn(srv, ss, info, func(srv any, ss grpc.ServerStream) error {
			ctx, err := g.admit(ss.Context(), info.FullMethod)
			if err != nil {
				return err
			}
			return handler(srv, &admittedStream{ServerStream: ss, ctx: ctx})
		})
	}
}

// admittedStream carries the context admit returned; a ServerStream's context cannot be
// replaced any other way.
type admittedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *admittedStream) Context() context.Context { return s.ctx }

// relayKey marks a context whose call the Guard admitted, with the relay's name, so that
// CallerFrom holds the call to the same relay.
type relayKey struct{}

// admit runs after identity's interceptor, which authenticated the call or, for a public
// method (health, reflection), let it through without a principal: the list of public methods
// stays identity's alone.
func (g *Guard) admit(ctx context.Context, fullMethod string) (context.Context, error) {
	p, ok := identity.FromContext(ctx)
	if !ok {
		return ctx, nil
	}
	switch {
	case p.Kind == identity.KindService:
		if p.ServiceName != g.relay || !strings.HasPrefix(fullMethod, receiptService) {
			return ctx, notRelayed("a service token alone is accepted for receipts only; a command needs the user the " + g.relay + " relays")
		}
	case p.Via == "":
		return ctx, notRelayed("this backend only serves calls made through Mandate; call the command through the " + g.relay)
	case p.Via != g.relay:
		return ctx, notRelayed("this backend only serves calls relayed by the " + g.relay)
	}
	return context.WithValue(ctx, relayKey{}, g.relay), nil
}

func notRelayed(msg string) error {
	r := Refuse(StageScopeCheck, CodeScopeNotViaExecutor, msg)
	r.Remedy = "call the command through the executor"
	return r.GRPCStatus().Err()
}
