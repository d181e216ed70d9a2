package identity

import (
	"context"
	"time"
)

// Kind says what sort of caller a Principal is. It is a string so that it
// reads well in logs and audit records.
type Kind string

const (
	// KindUser is a human acting directly.
	KindUser Kind = "user"
	// KindAgent is an AI agent acting for a user (RFC 8693 `act` claim); the
	// user's permissions bound what it may do.
	KindAgent Kind = "agent"
	// KindService is a Mandate service acting on its own behalf, with no end
	// user behind the call.
	KindService Kind = "service"
)

// Principal is the verified caller. Everything in it comes from a token whose
// signature, lifetime, issuer and audience have been checked.
type Principal struct {
	// Kind distinguishes users, agents and services.
	Kind Kind
	// Tenant scopes every permission and every row the caller may touch.
	Tenant string
	// Org is the optional organisation inside the tenant.
	Org string
	// UserID is the user the call is made for (`sub`); for an agent it is the
	// user who delegated to it.
	UserID string
	// AgentID is the acting agent (`act.sub`), empty for users.
	AgentID string
	// Model and ModelVersion identify the agent's model for the audit trail.
	Model        string
	ModelVersion string
	// ServiceName is set for KindService principals.
	ServiceName string
	// Via names the service that relayed the call with x-mandate-on-behalf-of;
	// empty when the end user called directly.
	Via string
	// Issuer is the token's `iss`; user ids are only unique per issuer.
	Issuer string
	// TokenID is the token's `jti`, for correlating audit records.
	TokenID string
	// ExpiresAt is when the token stops being valid.
	ExpiresAt time.Time
	// IssuedAt is the token's `iat`, zero when the token has none. A
	// revocation in the directory voids every token issued before it
	// (directory.Resolution.Admit).
	IssuedAt time.Time
}

// Subject returns one string naming who is acting ("user:<id>",
// "agent:<id>" or "service:<name>"), so logs and audit records do not each
// reinvent the rule that the agent, not its user, is the actor.
func (p Principal) Subject() string {
	switch p.Kind {
	case KindUser:
		return "user:" + p.UserID
	case KindAgent:
		return "agent:" + p.AgentID
	case KindService:
		return "service:" + p.ServiceName
	default:
		return ""
	}
}

// callerKey holds what is known of a call's caller: its principal and the
// end user's token to forward, in one context value, so that the
// middleware stores both with one allocation pair rather than two.
type callerKey struct{}

type caller struct {
	p    Principal
	hasP bool
	raw  string
}

func callerFrom(ctx context.Context) caller {
	c, _ := ctx.Value(callerKey{}).(*caller)
	if c == nil {
		return caller{}
	}
	return *c
}

func withCaller(ctx context.Context, c caller) context.Context {
	return context.WithValue(ctx, callerKey{}, &c)
}

// WithPrincipal returns a context carrying p. Only the authentication
// middleware should call it outside tests: handlers trust what they find.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	c := callerFrom(ctx)
	c.p, c.hasP = p, true
	return withCaller(ctx, c)
}

// FromContext returns the authenticated caller, and false when the request
// did not pass through the authentication middleware (for example a health
// check), which handlers must treat as "no caller", never as a default one.
func FromContext(ctx context.Context) (Principal, bool) {
	c := callerFrom(ctx)
	return c.p, c.hasP
}

// WithRawToken records the end user's original bearer token so that an
// outgoing call can forward it in x-mandate-on-behalf-of; the next service
// then verifies the user itself instead of trusting our word for it.
func WithRawToken(ctx context.Context, token string) context.Context {
	c := callerFrom(ctx)
	c.raw = token
	return withCaller(ctx, c)
}

// withUser is WithPrincipal(WithRawToken(ctx, token), p) in one value.
func withUser(ctx context.Context, token string, p Principal) context.Context {
	return withCaller(ctx, caller{p: p, hasP: true, raw: token})
}

// RawTokenFromContext returns the token recorded by WithRawToken.
func RawTokenFromContext(ctx context.Context) (string, bool) {
	t := callerFrom(ctx).raw
	return t, t != ""
}
