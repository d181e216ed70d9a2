package app

import (
	"context"
	"fmt"
	"time"

	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/confirm/page"
)

// runToken mints a development token and prints only the token, so it can
// be captured with $(mandate token …).
func runToken(_ context.Context, args []string, io IO) error {
	var (
		secret                                    config.Secret
		user, tenant, org, agent, model, modelVer string
		issuer, audience                          string
		ttl                                       time.Duration
		login                                     string
	)
	s := config.New("token", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	s.SecretVar(&secret, "dev-secret", "HS256 development secret, at least 32 bytes")
	s.String(&user, "user", "", "user id (the token's sub)")
	s.String(&tenant, "tenant", "", "tenant of the user")
	s.String(&org, "org", "", "org of the user (optional)")
	s.String(&agent, "agent", "", "agent id: mint an agent-for-user token (RFC 8693 act claim)")
	s.String(&model, "model", "", "the agent's model, e.g. claude-sonnet")
	s.String(&modelVer, "model-version", "", "the agent's model version")
	s.String(&issuer, "issuer", DefaultIssuer, "token issuer (iss)")
	s.String(&audience, "audience", DefaultAudience, "token audience (aud)")
	s.Duration(&ttl, "ttl", time.Hour, "token lifetime")
	s.String(&login, "login-url", "", "print a one-time sign-in link to the approval pages at this base URL (e.g. http://127.0.0.1:8083) instead of a token")
	s.Require("dev-secret", func() bool { return !secret.Set() })
	s.Require("user", func() bool { return user == "" })
	s.Require("tenant", func() bool { return tenant == "" })
	s.Check(func() error {
		if ttl <= 0 || ttl > 30*24*time.Hour {
			return s.Errorf("ttl", "must be between 1s and 720h")
		}
		if login != "" && agent != "" {
			return s.Errorf("login-url", "is for humans: agents never sign in to approve")
		}
		if (model != "" || modelVer != "") && agent == "" {
			return s.Errorf("model", "is only meaningful with --agent")
		}
		if secret.Set() && len(secret.Reveal()) < identity.MinSecretBytes {
			return s.Errorf("dev-secret", "must be at least %d bytes", identity.MinSecretBytes)
		}
		return nil
	})
	if err := s.Parse(args); err != nil {
		return err
	}
	if login != "" {
		link, err := loginURL(login, secret, issuer, user, tenant, min(ttl, 15*time.Minute))
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(io.Stdout, link)
		return err
	}
	tok, err := identity.MintDev([]byte(secret.Reveal()), identity.MintRequest{
		Issuer: issuer, Audience: audience,
		User: user, Tenant: tenant, Org: org,
		Agent: agent, Model: model, ModelVersion: modelVer,
		TTL: ttl, Now: time.Now(),
	})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(io.Stdout, tok)
	return err
}

// loginURL prints a one-time sign-in link to the approval pages.
func loginURL(base string, secret config.Secret, issuer, user, tenant string, ttl time.Duration) (string, error) {
	if ttl > page.MaxLoginTTL {
		ttl = page.MaxLoginTTL
	}
	return page.LoginURL(base, []byte(secret.Reveal()), issuer, user, tenant, ttl)
}
