package directory

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/mandate-dev/mandate/internal/limit"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// Errors returned (wrapped) by Store implementations.
var (
	// ErrNotFound reports that the addressed tenant, role, user or agent does not exist.
	ErrNotFound = errors.New("directory: not found")
	// ErrInvalid reports a malformed value: an empty or over-long identifier, a blank permission.
	ErrInvalid = errors.New("directory: invalid value")
	// ErrReference reports a write that names something missing from the same tenant: a role
	// or user of an unknown tenant, a user holding an undefined role, an agent acting for an
	// unknown user. References never cross tenants.
	ErrReference = errors.New("directory: reference to a missing entry")
)

// Tenant is a customer organisation and the scope of every other entry.
type Tenant struct {
	// ID identifies the tenant.
	ID string
	// DisplayName is a human-readable name.
	DisplayName string
	// Features are the tenant's entitlements, sorted and unique.
	Features []string
	// TrustCeiling is the highest risk level ("L0" … "L4") up to which an
	// answer given in an app's own window (a client-attested confirmation)
	// counts as the user's decision; above it the approval page, signed
	// in, is the only way. "" reads as DefaultTrustCeiling.
	TrustCeiling string
	// Limits are the tenant's own ceilings and windows for limits that
	// commands declare, keyed "<command code>/<limit id>"
	// (LimitKey); nil when the tenant overrides none.
	Limits map[string]LimitOverride
}

// LimitOverride is a tenant's own ceiling or window for one declared limit of a command.
type LimitOverride struct {
	Max    int64         // 0: the declared max
	Window time.Duration // 0: the declared window
}

// LimitKey is the key of a command's limit in Tenant.Limits and
// Resolution.Limits: "<command code>/<limit id>".
func LimitKey(command, limitID string) string { return command + "/" + limitID }

// SplitLimitKey splits a key of Tenant.Limits into the command code and
// the limit id; ok is false unless key is "<code>/<id>" with both parts
// non-empty and free of '/'.
func SplitLimitKey(key string) (command, limitID string, ok bool) {
	command, limitID, found := strings.Cut(key, "/")
	if !found || command == "" || limitID == "" || strings.Contains(limitID, "/") {
		return "", "", false
	}
	return command, limitID, true
}

// DefaultTrustCeiling is the trust ceiling of a tenant that sets none.
const DefaultTrustCeiling = "L2"

// Role is a named set of permissions, defined per tenant.
type Role struct {
	// Tenant owns the role.
	Tenant string
	// Name identifies the role within its tenant.
	Name string
	// Permissions are granted to holders of the role, sorted and unique.
	Permissions []string
}

// User is a human principal of one tenant. The same ID in two tenants is two different users.
type User struct {
	// Tenant owns the user.
	Tenant string
	// ID identifies the user within its tenant (the token's sub claim).
	ID string
	// Org is the user's organisational unit.
	Org string
	// Roles are names of roles of the same tenant, sorted and unique.
	Roles []string
	// Disabled users and every agent acting for them are inactive.
	Disabled bool
	// RevokedAt is the last time the user was disabled, zero if never.
	// Every credential issued before it — tokens, and approvals of calls
	// requested before it — stays void after the user is enabled again.
	// Stores keep the latest of the stored and the written value, so an
	// upsert that does not know it (a policy file) never undoes it.
	RevokedAt time.Time
}

// Agent is a registered AI agent that acts for one user of its tenant.
type Agent struct {
	// Tenant owns the agent.
	Tenant string
	// ID identifies the agent within its tenant (the token's act claim).
	ID string
	// UserID is the user the agent acts for; the agent holds exactly that user's permissions.
	UserID string
	// Disabled agents are inactive.
	Disabled bool
	// Host says who operates the client the agent runs in; "" reads as
	// HostHeadless. Only an interactive host's answers to a confirmation
	// form count as its user's decision.
	Host AgentHost
	// RevokedAt is the last time the agent was disabled (its access
	// revoked), zero if never; as User.RevokedAt.
	RevokedAt time.Time
}

// AgentHost says who operates the client an agent runs in.
type AgentHost string

const (
	// HostHeadless is the default: the agent runs unattended, or in a
	// runtime whose code — not its user — answers what the server asks. A
	// human confirms its calls on the approval page, signed in.
	HostHeadless AgentHost = "headless"
	// HostInteractive: the agent runs in a client its user operates (an IDE
	// or chat host with the user at the keyboard), so the client's answer
	// to a confirmation form is the user's.
	HostInteractive AgentHost = "interactive"
)

// Snapshot is everything a tenant holds, each list sorted by name or ID.
type Snapshot struct {
	// Tenant is the tenant itself.
	Tenant Tenant
	// Roles are the tenant's roles.
	Roles []Role
	// Users are the tenant's users.
	Users []User
	// Agents are the tenant's registered agents.
	Agents []Agent
}

// RevocationNow is the instant a revocation records: now, at the
// microsecond precision every store keeps.
func RevocationNow() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// LaterRevocation returns the later of two revocation instants: what a
// Store keeps when an entry is written over one it holds.
func LaterRevocation(stored, written time.Time) time.Time {
	if written.After(stored) {
		return written
	}
	return stored
}

// Facts is what a Store knows about one principal, the raw material of [Resolve]. Each Found
// flag is false when the entry does not exist in the requested tenant.
type Facts struct {
	// TenantFound reports whether the tenant exists; nothing else is filled when it does not.
	TenantFound bool
	// Features are the tenant's features.
	Features []string
	// TrustCeiling is the tenant's trust ceiling, "" for the default.
	TrustCeiling string
	// Limits are the tenant's limit overrides (Tenant.Limits), nil when none.
	Limits map[string]LimitOverride
	// UserFound reports whether the user exists in the tenant.
	UserFound bool
	// User is the user, when found.
	User User
	// Permissions is the sorted union of the permissions of the user's roles.
	Permissions []string
	// AgentFound reports whether the agent exists in the tenant (false when no agent was asked).
	AgentFound bool
	// Agent is the agent, when found.
	Agent Agent
}

// Change announces that directory data of a tenant changed. An empty Tenant means that anything
// may have changed (for example after a lost connection) and consumers must forget everything.
type Change struct {
	// Tenant whose data changed, or "" for all tenants.
	Tenant string

	ack func()
}

// Ack tells the publisher that the consumer has acted on the change. Consumers of
// [Store.Watch] must call it for every change they receive: writers in the same process wait for
// it, which is what makes a change visible through every Cache when Update returns.
func (c Change) Ack() {
	if c.ack != nil {
		c.ack()
	}
}

// Store is the directory's storage: point reads for resolution, atomic writes, and change
// notifications. Implementations: memory (tests, mandate dev) and postgres.
type Store interface {
	// Lookup returns what the store knows about a principal in tenant. agentID may be empty (a
	// user acting directly). Every read is scoped to tenant.
	Lookup(ctx context.Context, tenant, userID, agentID string) (Facts, error)
	// Update runs fn in one transaction: every write in it becomes visible at once, or none
	// does when fn (or the commit) fails. After a successful commit the store announces a
	// Change for every tenant written to.
	Update(ctx context.Context, fn func(Tx) error) error
	// Watch delivers changes until ctx ends, then closes the channel. Every receiver must call
	// Change.Ack.
	Watch(ctx context.Context) <-chan Change
}

// Tx is the view of a Store inside Update. Writes are upserts of whole entries and are checked
// against the tenant's other entries (see [ErrReference]).
type Tx interface {
	// Snapshot returns everything tenant holds, as seen inside the transaction, or
	// ErrNotFound.
	Snapshot(ctx context.Context, tenant string) (Snapshot, error)
	// PutTenant creates or replaces a tenant.
	PutTenant(ctx context.Context, t Tenant) error
	// PutRole creates or replaces a role; its tenant must exist.
	PutRole(ctx context.Context, r Role) error
	// DeleteRole removes a role and drops it from every user holding it, or returns
	// ErrNotFound.
	DeleteRole(ctx context.Context, tenant, name string) error
	// PutUser creates or replaces a user; its tenant and roles must exist.
	PutUser(ctx context.Context, u User) error
	// PutAgent creates or replaces an agent; its tenant and user must exist.
	PutAgent(ctx context.Context, a Agent) error
}

// MaxIDLength bounds every identifier and name in the directory, in bytes.
const MaxIDLength = 256

// CheckID returns ErrInvalid unless s is a usable identifier: non-empty, at most MaxIDLength
// bytes of valid UTF-8, with no white space or control characters.
func CheckID(what, s string) error {
	if s == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalid, what)
	}
	if len(s) > MaxIDLength {
		return fmt.Errorf("%w: %s is longer than %d bytes", ErrInvalid, what, MaxIDLength)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	}
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return fmt.Errorf("%w: %s %q contains white space or control characters", ErrInvalid, what, s)
		}
	}
	return nil
}

func checkIDs(what string, ss []string) error {
	for _, s := range ss {
		if err := CheckID(what, s); err != nil {
			return err
		}
	}
	return nil
}

// Normalize returns a sorted copy of ss without duplicates; nil for an empty list.
func Normalize(ss []string) []string {
	if len(ss) == 0 {
		return nil
	}
	out := slices.Clone(ss)
	slices.Sort(out)
	return slices.Compact(out)
}

// Check validates t and returns it normalised.
func (t Tenant) Check() (Tenant, error) {
	if err := CheckID("tenant id", t.ID); err != nil {
		return t, err
	}
	if len(t.DisplayName) > MaxIDLength {
		return t, fmt.Errorf("%w: display name of tenant %q is longer than %d bytes", ErrInvalid, t.ID, MaxIDLength)
	}
	t.Features = Normalize(t.Features)
	if t.TrustCeiling != "" && manifest.RiskLevel(t.TrustCeiling) < 0 {
		return t, fmt.Errorf("%w: trust ceiling of tenant %q must be one of L0 … L4", ErrInvalid, t.ID)
	}
	if len(t.Limits) == 0 {
		t.Limits = nil
	} else {
		t.Limits = maps.Clone(t.Limits)
	}
	for key, o := range t.Limits {
		if err := o.check(key); err != nil {
			return t, fmt.Errorf("%w: limit override of tenant %q: %w", ErrInvalid, t.ID, err)
		}
	}
	return t, checkIDs("feature", t.Features)
}

// check validates one entry of Tenant.Limits; the error is a bare message.
func (o LimitOverride) check(key string) error {
	if err := CheckID("limit key", key); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
	}
	if _, _, ok := SplitLimitKey(key); !ok {
		return fmt.Errorf("key %q is not \"<command code>/<limit id>\"", key)
	}
	switch {
	case o.Max < 0:
		return fmt.Errorf("%s: max %d is not positive", key, o.Max)
	case o.Window < 0 || o.Window > limit.MaxWindow:
		return fmt.Errorf("%s: window %s is not within (0, %s]", key, o.Window, limit.MaxWindow)
	case o.Max == 0 && o.Window == 0:
		return fmt.Errorf("%s: overrides neither max nor window", key)
	}
	return nil
}

// Check validates r and returns it normalised.
func (r Role) Check() (Role, error) {
	if err := CheckID("tenant id", r.Tenant); err != nil {
		return r, err
	}
	if err := CheckID("role name", r.Name); err != nil {
		return r, err
	}
	r.Permissions = Normalize(r.Permissions)
	return r, checkIDs("permission", r.Permissions)
}

// Check validates u and returns it normalised.
func (u User) Check() (User, error) {
	if err := CheckID("tenant id", u.Tenant); err != nil {
		return u, err
	}
	if err := CheckID("user id", u.ID); err != nil {
		return u, err
	}
	if len(u.Org) > MaxIDLength {
		return u, fmt.Errorf("%w: org of user %q is longer than %d bytes", ErrInvalid, u.ID, MaxIDLength)
	}
	u.Roles = Normalize(u.Roles)
	return u, checkIDs("role name", u.Roles)
}

// Check validates a and returns it.
func (a Agent) Check() (Agent, error) {
	if err := CheckID("tenant id", a.Tenant); err != nil {
		return a, err
	}
	if err := CheckID("agent id", a.ID); err != nil {
		return a, err
	}
	switch a.Host {
	case "":
		a.Host = HostHeadless
	case HostHeadless, HostInteractive:
	default:
		return a, fmt.Errorf("%w: host of agent %q must be %q or %q", ErrInvalid, a.ID, HostHeadless, HostInteractive)
	}
	return a, CheckID("agent user", a.UserID)
}

// SetUserDisabled disables or re-enables a user. Disabling also makes every agent acting for
// the user inactive, from the next resolution on.
func SetUserDisabled(ctx context.Context, s Store, tenant, userID string, disabled bool) error {
	return s.Update(ctx, func(tx Tx) error {
		snap, err := tx.Snapshot(ctx, tenant)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(snap.Users, func(u User) bool { return u.ID == userID })
		if i < 0 {
			return fmt.Errorf("%w: user %q in tenant %q", ErrNotFound, userID, tenant)
		}
		u := snap.Users[i]
		if u.Disabled == disabled {
			return nil
		}
		u.Disabled = disabled
		if disabled {
			u.RevokedAt = RevocationNow()
		}
		return tx.PutUser(ctx, u)
	})
}

// SetAgentDisabled disables or re-enables a registered agent.
func SetAgentDisabled(ctx context.Context, s Store, tenant, agentID string, disabled bool) error {
	return s.Update(ctx, func(tx Tx) error {
		snap, err := tx.Snapshot(ctx, tenant)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(snap.Agents, func(a Agent) bool { return a.ID == agentID })
		if i < 0 {
			return fmt.Errorf("%w: agent %q in tenant %q", ErrNotFound, agentID, tenant)
		}
		a := snap.Agents[i]
		if a.Disabled == disabled {
			return nil
		}
		a.Disabled = disabled
		if disabled {
			a.RevokedAt = RevocationNow()
		}
		return tx.PutAgent(ctx, a)
	})
}
