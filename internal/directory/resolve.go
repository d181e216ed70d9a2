package directory

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/mandate-dev/mandate/internal/manifest"
)

// Reasons a Resolution is inactive. They are stable strings, fit for audit records and refusal
// details.
const (
	ReasonTenantUnknown      = "tenant.unknown"
	ReasonUserUnknown        = "user.unknown"
	ReasonUserDisabled       = "user.disabled"
	ReasonAgentNotRegistered = "agent.not_registered"
	ReasonAgentWrongUser     = "agent.wrong_user"
	ReasonAgentDisabled      = "agent.disabled"
	// ReasonCredentialRevoked: the token was issued before the user or
	// the agent was last disabled; enabling them again does not bring it
	// back.
	ReasonCredentialRevoked = "credential.revoked" //nolint:gosec // G101: a reason code, not a credential
)

// Resolution is the directory's answer about one principal: a user acting directly, or an agent
// acting for a user.
type Resolution struct {
	// Tenant, UserID and AgentID echo the principal that was resolved.
	Tenant, UserID, AgentID string
	// Active is false when the principal may do nothing at all; Reason says why.
	Active bool
	// Reason is one of the Reason constants when Active is false, empty otherwise.
	Reason string
	// Permissions are the user's permissions (an agent holds exactly its user's), sorted;
	// empty when inactive.
	Permissions []string
	// Features are the tenant's entitlements, sorted; empty when inactive.
	Features []string
	// Org is the user's organisational unit, when the user is known.
	Org string
	// Roles are the user's roles, sorted, when the user is known.
	Roles []string
	// Interactive reports, for an active principal, whether the client it
	// calls from is operated by its user: always for a user acting
	// directly, and for an agent whose host is HostInteractive. Only then
	// does an answer elicited through that client count as the user's
	// decision on a confirmation.
	Interactive bool
	// TrustCeiling is the tenant's trust ceiling (DefaultTrustCeiling when
	// it sets none): client-attested answers count only up to this risk.
	TrustCeiling string
	// Limits are the tenant's own ceilings and windows for limits that
	// commands declare (Tenant.Limits), keyed "<command code>/<limit id>";
	// a zero field keeps the declared value. Nil when the tenant overrides
	// none, and when inactive. Each Resolution has its own map.
	Limits map[string]LimitOverride
	// RevokedAt is the latest revocation of the user or of the agent, zero
	// if none: what was issued before it is void (Admit, IssuedBefore).
	RevokedAt time.Time
}

// Admit applies the revocation rule to a token issued at iat (zero: the
// token has no iat): a token issued before the user or the agent was last
// disabled is void, even after they are enabled again, and r then reads as
// inactive with ReasonCredentialRevoked. JWT times have whole seconds, so
// a token of the revocation's own second is void too; an issuer that mints
// right after re-enabling (the dev OAuth server) dates its tokens no
// earlier than NotBefore.
func (r Resolution) Admit(iat time.Time) Resolution {
	if r.Active && !r.RevokedAt.IsZero() && iat.Before(r.NotBefore()) {
		r.Active = false
		r.Reason = ReasonCredentialRevoked
		r.Permissions, r.Features, r.Limits = nil, nil, nil
		r.Interactive = false
	}
	return r
}

// NotBefore is the earliest `iat` a token of this principal may carry:
// the second after its latest revocation, or zero.
func (r Resolution) NotBefore() time.Time {
	if r.RevokedAt.IsZero() {
		return time.Time{}
	}
	return r.RevokedAt.Truncate(time.Second).Add(time.Second)
}

// IssuedBefore reports whether t (when a challenge was opened, say) is at
// or before the principal's latest revocation: what was asked for then is
// void.
func (r Resolution) IssuedBefore(t time.Time) bool {
	return !r.RevokedAt.IsZero() && !t.After(r.RevokedAt)
}

// TrustCeilingLevel is TrustCeiling as a number, 0 … 4.
func (r Resolution) TrustCeilingLevel() int {
	if l := manifest.RiskLevel(r.TrustCeiling); l >= 0 {
		return l
	}
	return manifest.RiskLevel(DefaultTrustCeiling)
}

// EffectiveLimit is the limit l that command declares, as it applies to
// r's tenant: its Max and Window replaced by those the tenant's override
// (Limits[LimitKey(command, l.ID)]) sets, the declared ones kept where it
// sets none. The window keeps the manifest's spelling ("43200s").
func (r Resolution) EffectiveLimit(command string, l manifest.Limit) manifest.Limit {
	o, ok := r.Limits[LimitKey(command, l.ID)]
	if !ok {
		return l
	}
	if o.Max > 0 {
		l.Max = o.Max
	}
	if o.Window > 0 {
		l.Window = strconv.FormatFloat(o.Window.Seconds(), 'f', -1, 64) + "s"
	}
	return l
}

// Resolver answers who a principal is. *Cache implements it, and [Direct] adapts a Store.
type Resolver interface {
	// Resolve resolves a principal; see [Resolve].
	Resolve(ctx context.Context, tenant, userID, agentID string) (Resolution, error)
}

// Direct returns a Resolver that asks s on every call, without caching.
func Direct(s Store) Resolver { return direct{s} }

type direct struct{ s Store }

func (d direct) Resolve(ctx context.Context, tenant, userID, agentID string) (Resolution, error) {
	return Resolve(ctx, d.s, tenant, userID, agentID)
}

// Resolve looks the principal up in s and applies the directory's rules. agentID is empty for a
// user acting directly. Inactive principals are not errors: the error is reserved for storage
// failures. The rules, in order: the tenant must exist; the user must exist in it and be enabled;
// an agent must be registered in the same tenant, act for this very user and be enabled. An
// active principal gets its user's permissions and its tenant's features and limit overrides,
// nothing more.
func Resolve(ctx context.Context, s Store, tenant, userID, agentID string) (Resolution, error) {
	r := Resolution{Tenant: tenant, UserID: userID, AgentID: agentID}
	if tenant == "" {
		r.Reason = ReasonTenantUnknown
		return r, nil
	}
	if userID == "" {
		r.Reason = ReasonUserUnknown
		return r, nil
	}
	f, err := s.Lookup(ctx, tenant, userID, agentID)
	if err != nil {
		return Resolution{}, err
	}
	return Decide(r, f), nil
}

// Decide applies the resolution rules to facts about the principal named in r. Store
// implementations never need it; it is exported for resolvers built on other fact sources.
func Decide(r Resolution, f Facts) Resolution {
	switch {
	case !f.TenantFound:
		r.Reason = ReasonTenantUnknown
		return r
	case !f.UserFound:
		r.Reason = ReasonUserUnknown
		return r
	}
	r.Org = f.User.Org
	r.Roles = slices.Clone(f.User.Roles)
	r.TrustCeiling = f.TrustCeiling
	if r.TrustCeiling == "" {
		r.TrustCeiling = DefaultTrustCeiling
	}
	r.RevokedAt = f.User.RevokedAt
	if r.AgentID != "" && f.AgentFound {
		r.RevokedAt = LaterRevocation(r.RevokedAt, f.Agent.RevokedAt)
	}
	switch {
	case f.User.Disabled:
		r.Reason = ReasonUserDisabled
	case r.AgentID != "" && !f.AgentFound:
		r.Reason = ReasonAgentNotRegistered
	case r.AgentID != "" && f.Agent.UserID != r.UserID:
		r.Reason = ReasonAgentWrongUser
	case r.AgentID != "" && f.Agent.Disabled:
		r.Reason = ReasonAgentDisabled
	default:
		r.Active = true
		r.Permissions = slices.Clone(f.Permissions)
		r.Features = slices.Clone(f.Features)
		if len(f.Limits) > 0 {
			r.Limits = maps.Clone(f.Limits)
		}
		r.Interactive = r.AgentID == "" || f.Agent.Host == HostInteractive
	}
	return r
}

// HasPermission reports whether r is active and holds permission p.
func (r Resolution) HasPermission(p string) bool {
	_, ok := slices.BinarySearch(r.Permissions, p)
	return r.Active && ok
}

// HasFeature reports whether r is active and its tenant has feature f.
func (r Resolution) HasFeature(f string) bool {
	_, ok := slices.BinarySearch(r.Features, f)
	return r.Active && ok
}

// MayCall is the rule of who may call a command, as the catalog lists it
// and the pipeline's load, entitlement and permission stages enforce it: r
// is active, the command is published, the tenant has its required
// feature and the user holds every permission it declares.
func (r Resolution) MayCall(cmd *manifest.Command) bool {
	if !r.Active || !cmd.Published() {
		return false
	}
	if cmd.RequiredFeature != "" && !r.HasFeature(cmd.RequiredFeature) {
		return false
	}
	for _, perm := range cmd.Permissions {
		if !r.HasPermission(perm) {
			return false
		}
	}
	return true
}

// clone returns a deep copy so that callers cannot modify a cached resolution.
func (r Resolution) clone() Resolution {
	r.Permissions = slices.Clone(r.Permissions)
	r.Features = slices.Clone(r.Features)
	r.Roles = slices.Clone(r.Roles)
	r.Limits = maps.Clone(r.Limits)
	return r
}
