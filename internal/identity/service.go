package identity

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/mandate-dev/mandate/internal/failure"
)

// serviceSubjectPrefix makes a service's `sub` impossible to confuse with a
// user id in audit records.
const serviceSubjectPrefix = "service:"

// serviceNameRE keeps service names short and log-safe.
var serviceNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ServiceConfig configures a ServiceVerifier.
type ServiceConfig struct {
	// Secret is the HS256 key shared by Mandate's services. It must differ
	// from the user dev secret: the separation of keys is what keeps a user
	// from ever passing as a service. At least MinSecretBytes long.
	Secret []byte
	// Audience and Issuers have the same meaning as in Config. Required.
	Audience []string
	Issuers  []string
	// MaxTokenBytes, Leeway and Now default as in Config.
	MaxTokenBytes int
	Leeway        time.Duration
	Now           func() time.Time
	// CacheSize is as in Config. The service secret never changes within a
	// process, so nothing but `exp` and the bound ends an entry.
	CacheSize int
}

// ServiceVerifier checks service tokens: HS256 with the service secret and a
// `mandate_service` claim. Nothing else verifies, so user and agent tokens
// never pass, whatever claims they carry. It is safe for concurrent use.
type ServiceVerifier struct {
	check  checker
	secret []byte
	cache  *tokenCache // nil when caching is off
}

// NewServiceVerifier validates cfg.
func NewServiceVerifier(cfg ServiceConfig) (*ServiceVerifier, error) {
	chk, err := newChecker(cfg.Audience, cfg.Issuers, cfg.MaxTokenBytes, cfg.Leeway, cfg.Now)
	if err != nil {
		return nil, err
	}
	if len(cfg.Secret) < MinSecretBytes {
		return nil, fmt.Errorf("identity: service Secret must be at least %d bytes", MinSecretBytes)
	}
	return &ServiceVerifier{check: chk, secret: slices.Clone(cfg.Secret), cache: newTokenCache(cfg.CacheSize)}, nil
}

// Verify checks a service token and returns a KindService principal. A
// token not signed with the service secret is refused with
// failure.CodeAuthenticationNotAService rather than failure.CodeAuthenticationInvalidToken: from this verifier's point
// of view that is exactly what it is.
//
// Service tokens are reused for half their lifetime (ServiceTokenSource), so
// a verified one is remembered until its `exp` like a user's.
func (v *ServiceVerifier) Verify(ctx context.Context, token string) (Principal, error) {
	return v.cache.verify(ctx, token, &v.check, v.verify)
}

func (v *ServiceVerifier) verify(ctx context.Context, token string) (Principal, error) {
	c, err := v.check.verify(ctx, token, v.resolveKey, failure.CodeAuthenticationNotAService)
	if err != nil {
		return Principal{}, err
	}
	if !c.Service.set || c.Service.value == "" {
		return Principal{}, newError(failure.CodeAuthenticationNotAService, "token has no mandate_service claim", nil)
	}
	if c.Subject != serviceSubjectPrefix+c.Service.value {
		return Principal{}, newError(failure.CodeAuthenticationNotAService, "service token sub does not match mandate_service", nil)
	}
	return Principal{
		Kind:        KindService,
		ServiceName: c.Service.value,
		Issuer:      c.Issuer,
		TokenID:     c.ID,
		ExpiresAt:   c.Expiry.Time(),
	}, nil
}

func (v *ServiceVerifier) resolveKey(_ context.Context, h jose.Header) (any, error) {
	if jose.SignatureAlgorithm(h.Algorithm) != jose.HS256 {
		return nil, newError(failure.CodeAuthenticationNotAService, "service tokens are HS256 with the service secret", nil)
	}
	return v.secret, nil
}

// MintService signs a service token for serviceName with the service secret.
// Services mint their own short-lived tokens instead of holding long-lived
// ones; see ServiceTokenSource for the cached variant.
func MintService(secret []byte, issuer, audience, serviceName string, ttl time.Duration) (string, error) {
	return mintService(secret, issuer, audience, serviceName, ttl, time.Now())
}

func mintService(secret []byte, issuer, audience, serviceName string, ttl time.Duration, now time.Time) (string, error) {
	if issuer == "" || audience == "" {
		return "", errors.New("identity: MintService needs issuer and audience")
	}
	if !serviceNameRE.MatchString(serviceName) {
		return "", fmt.Errorf("identity: service name %q must match %s", serviceName, serviceNameRE)
	}
	c := baseClaims(issuer, audience, serviceSubjectPrefix+serviceName, ttl, now)
	c.Service = serviceName
	return signHS256(secret, c)
}

// TokenSource supplies the bearer token a client attaches to outgoing calls.
type TokenSource interface {
	Token(ctx context.Context) (string, error)
}

// ServiceTokenSource mints service tokens and reuses each one for half its
// lifetime, so every outgoing call does not pay for a signature and a token
// never expires in flight. It is safe for concurrent use.
type ServiceTokenSource struct {
	secret                 []byte
	issuer, audience, name string
	ttl                    time.Duration
	now                    func() time.Time

	mu      sync.Mutex
	token   string
	renewAt time.Time
}

// NewServiceTokenSource validates its arguments by minting a first token.
func NewServiceTokenSource(secret []byte, issuer, audience, serviceName string, ttl time.Duration) (*ServiceTokenSource, error) {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	s := &ServiceTokenSource{
		secret: slices.Clone(secret), issuer: issuer, audience: audience, name: serviceName,
		ttl: ttl, now: time.Now,
	}
	if _, err := s.Token(context.Background()); err != nil {
		return nil, err
	}
	return s, nil
}

// Token returns a cached service token, minting a new one when the cached
// one is past half its lifetime.
func (s *ServiceTokenSource) Token(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.token != "" && now.Before(s.renewAt) {
		return s.token, nil
	}
	tok, err := mintService(s.secret, s.issuer, s.audience, s.name, s.ttl, now)
	if err != nil {
		return "", err
	}
	s.token, s.renewAt = tok, now.Add(s.ttl/2)
	return tok, nil
}
