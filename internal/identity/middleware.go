package identity

import (
	"context"
	"crypto/subtle"
	"errors"
	"strings"

	"github.com/mandate-dev/mandate/internal/failure"
)

// OnBehalfOfHeader carries the end user's original bearer token on
// service-to-service calls ("Bearer <token>"). gRPC metadata keys are lower
// case; HTTP header lookup is case-insensitive, so one constant serves both.
const OnBehalfOfHeader = "x-mandate-on-behalf-of"

// AuthenticatorConfig wires the verifiers the middleware needs.
type AuthenticatorConfig struct {
	// Users verifies user and agent tokens. Required.
	Users *Verifier
	// Services verifies service tokens. Without it, calls carrying
	// x-mandate-on-behalf-of are refused with failure.CodeAuthenticationNotAService.
	Services *ServiceVerifier
	// AllowServiceOnly lets a service call with just its own token (no end
	// user), yielding a KindService principal. Off by default because
	// services pass the caller's principal along (docs/architecture/identity.md).
	AllowServiceOnly bool
}

// Authenticator turns request credentials into a Principal. The gRPC
// interceptors and the HTTP middleware are thin shells around Authenticate,
// so both transports apply exactly the same rules.
type Authenticator struct {
	users            *Verifier
	services         *ServiceVerifier
	allowServiceOnly bool
}

// NewAuthenticator validates cfg. It refuses a service secret equal to the
// user dev secret, because then a dev user token and a service token would
// be signed by the same key and only a claim would tell them apart.
func NewAuthenticator(cfg AuthenticatorConfig) (*Authenticator, error) {
	if cfg.Users == nil {
		return nil, errors.New("identity: AuthenticatorConfig.Users is required")
	}
	if cfg.AllowServiceOnly && cfg.Services == nil {
		return nil, errors.New("identity: AllowServiceOnly needs Services")
	}
	if cfg.Services != nil && cfg.Users.devSecret != nil &&
		subtle.ConstantTimeCompare(cfg.Services.secret, cfg.Users.devSecret) == 1 {
		return nil, errors.New("identity: the service secret must differ from the dev secret")
	}
	return &Authenticator{users: cfg.Users, services: cfg.Services, allowServiceOnly: cfg.AllowServiceOnly}, nil
}

// Authenticate verifies the values of the authorization and
// x-mandate-on-behalf-of headers and returns ctx carrying the Principal and
// the end user's raw token (for forwarding). With an on-behalf-of token the
// bearer must be a service token; the principal is then the end user with
// Via set to the service. The returned error is always an *Error.
func (a *Authenticator) Authenticate(ctx context.Context, authorization, onBehalfOf []string) (context.Context, error) {
	bearer, err := bearerToken(authorization, failure.CodeAuthenticationMissingCredentials)
	if err != nil {
		return ctx, err
	}
	if len(onBehalfOf) > 0 {
		if a.services == nil {
			return ctx, newError(failure.CodeAuthenticationNotAService, "on-behalf-of calls are not accepted here", nil)
		}
		svc, err := a.services.Verify(ctx, bearer)
		if err != nil {
			return ctx, err
		}
		userToken, err := bearerToken(onBehalfOf, failure.CodeAuthenticationInvalidToken)
		if err != nil {
			return ctx, err
		}
		p, err := a.users.Verify(ctx, userToken)
		if err != nil {
			return ctx, err
		}
		p.Via = svc.ServiceName
		return withUser(ctx, userToken, p), nil
	}
	p, err := a.users.Verify(ctx, bearer)
	if err == nil {
		return withUser(ctx, bearer, p), nil
	}
	if a.allowServiceOnly {
		if svc, serr := a.services.Verify(ctx, bearer); serr == nil {
			// No raw token: a service token is never forwarded as a user's.
			return WithPrincipal(ctx, svc), nil
		}
	}
	return ctx, err
}

// bearerToken extracts the token from exactly one "Bearer <token>" value.
// Several values are refused rather than picking one, since a proxy and a
// client disagreeing about which applies is how confusion bugs start.
func bearerToken(values []string, missingCode string) (string, error) {
	switch len(values) {
	case 0:
		return "", newError(missingCode, "no bearer token", nil)
	case 1:
	default:
		return "", newError(failure.CodeAuthenticationInvalidToken, "more than one bearer token", nil)
	}
	scheme, token, _ := strings.Cut(strings.TrimSpace(values[0]), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", newError(failure.CodeAuthenticationInvalidToken, `credentials must use the "Bearer" scheme`, nil)
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return "", newError(missingCode, "no bearer token", nil)
	}
	return token, nil
}
