package directory

import (
	"context"
	"errors"
	"fmt"
)

// Action is what applying a policy would do to one entry.
type Action string

// The actions of a [Plan], as [Apply] counts them in its [Summary].
const (
	// ActionAdd creates an entry that does not exist.
	ActionAdd Action = "add"
	// ActionChange rewrites an entry that differs from the file.
	ActionChange Action = "change"
	// ActionRemove deletes a role, or disables a user or agent, that the
	// file no longer lists.
	ActionRemove Action = "remove"
)

// PlannedChange is one entry a policy would add, change or remove.
type PlannedChange struct {
	// Kind is "tenant", "role", "user" or "agent".
	Kind string
	// Tenant is the tenant of the entry.
	Tenant string
	// Name is the role name or the user or agent id ("" for a tenant).
	Name string
	// Action is what applying the policy would do.
	Action Action
}

// String renders the change for humans, e.g. "add role acme/support".
func (c PlannedChange) String() string {
	if c.Kind == "tenant" {
		return fmt.Sprintf("%s tenant %s", c.Action, c.Tenant)
	}
	return fmt.Sprintf("%s %s %s/%s", c.Action, c.Kind, c.Tenant, c.Name)
}

// Plan is what [ApplyPolicy] would change, entry by entry, in file order
// per tenant: the tenant, then roles, users and agents.
type Plan struct {
	// Changes lists every entry that would change; none when applying the
	// policy would change nothing.
	Changes []PlannedChange
}

// Summary counts the plan's changes as [ApplyPolicy] would report them.
func (p Plan) Summary() Summary {
	var s Summary
	for _, c := range p.Changes {
		var counts *Counts
		switch c.Kind {
		case "tenant":
			counts = &s.Tenants
		case "role":
			counts = &s.Roles
		case "user":
			counts = &s.Users
		default:
			counts = &s.Agents
		}
		switch c.Action {
		case ActionAdd:
			counts.Created++
		case ActionChange:
			counts.Updated++
		case ActionRemove:
			counts.Removed++
		}
	}
	return s
}

// errPlanOnly ends the transaction PlanPolicy reads in, so that it
// commits nothing.
var errPlanOnly = errors.New("directory: plan only")

// PlanPolicy reports what [ApplyPolicy] would change in s, and changes
// nothing: it reads every tenant of the policy in one transaction that it
// then rolls back. It compares entries as ApplyPolicy does, and
// TestPlanMatchesApply holds the two to the same counts.
func PlanPolicy(ctx context.Context, s Store, pol Policy) (Plan, error) {
	var plan Plan
	err := s.Update(ctx, func(tx Tx) error {
		plan = Plan{} // Update may run fn more than once
		for _, want := range pol.Tenants {
			have, err := tx.Snapshot(ctx, want.Tenant.ID)
			switch {
			case errors.Is(err, ErrNotFound):
				have = Snapshot{}
				plan.add("tenant", want.Tenant.ID, "", ActionAdd)
			case err != nil:
				return fmt.Errorf("tenant %q: %w", want.Tenant.ID, err)
			case !sameTenant(have.Tenant, want.Tenant):
				plan.add("tenant", want.Tenant.ID, "", ActionChange)
			}
			planUpserts(&plan, "role", want.Tenant.ID, have.Roles, want.Roles, roleName, sameRole, func(Role) bool { return true })
			planUpserts(&plan, "user", want.Tenant.ID, have.Users, want.Users, userID, sameUser, func(u User) bool { return !u.Disabled })
			planUpserts(&plan, "agent", want.Tenant.ID, have.Agents, want.Agents, agentID, sameAgent, func(a Agent) bool { return !a.Disabled })
		}
		return errPlanOnly
	})
	if err != nil && !errors.Is(err, errPlanOnly) {
		return Plan{}, fmt.Errorf("directory: plan: %w", err)
	}
	return plan, nil
}

func (p *Plan) add(kind, tenant, name string, a Action) {
	p.Changes = append(p.Changes, PlannedChange{Kind: kind, Tenant: tenant, Name: name, Action: a})
}

// planUpserts plans one kind of entry as applyTenant writes it: every
// entry of the file that is new or differs, then every entry the file
// leaves out that removal would touch (live: every role, enabled users and
// agents, since those already disabled stay as they are).
func planUpserts[T any](p *Plan, kind, tenant string, have, want []T, key func(T) string, same func(a, b T) bool, live func(T) bool) {
	byKey := make(map[string]T, len(have))
	for _, h := range have {
		byKey[key(h)] = h
	}
	for _, w := range want {
		h, found := byKey[key(w)]
		switch {
		case !found:
			p.add(kind, tenant, key(w), ActionAdd)
		case !same(h, w):
			p.add(kind, tenant, key(w), ActionChange)
		}
	}
	wanted := keys(want, key)
	for _, h := range have {
		if live(h) && !wanted[key(h)] {
			p.add(kind, tenant, key(h), ActionRemove)
		}
	}
}
