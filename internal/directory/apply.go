package directory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Counts tallies the changes Apply made to one kind of entry.
type Counts struct {
	// Created entries did not exist before.
	Created int
	// Updated entries existed and differed from the file.
	Updated int
	// Removed entries existed but are missing from their tenant in the file: roles are
	// deleted, users and agents are disabled (see the package documentation).
	Removed int
}

func (c Counts) total() int { return c.Created + c.Updated + c.Removed }

// Summary reports what Apply changed. Applying the same file twice yields a zero Summary the
// second time.
type Summary struct {
	// Tenants counts tenant changes (display name, features, trust ceiling, limit overrides).
	Tenants Counts
	// Roles counts role changes.
	Roles Counts
	// Users counts user changes.
	Users Counts
	// Agents counts agent changes.
	Agents Counts
}

// Changes is the total number of entries created, updated or removed.
func (s Summary) Changes() int {
	return s.Tenants.total() + s.Roles.total() + s.Users.total() + s.Agents.total()
}

// String renders the summary for humans, e.g. "tenants +1 ~0 -0, roles +2 ~0 -0, ...".
func (s Summary) String() string {
	f := func(name string, c Counts) string {
		return fmt.Sprintf("%s +%d ~%d -%d", name, c.Created, c.Updated, c.Removed)
	}
	return f("tenants", s.Tenants) + ", " + f("roles", s.Roles) + ", " + f("users", s.Users) + ", " + f("agents", s.Agents)
}

// ApplyOption adjusts Apply.
type ApplyOption func(*applyConfig)

type applyConfig struct{ file string }

// FileName names the policy file in error messages (default "policy.yaml").
func FileName(name string) ApplyOption {
	return func(c *applyConfig) { c.file = name }
}

// Apply parses a YAML policy file and makes the store match it, in one transaction: a file
// with any error changes nothing, and its error (a *PolicyError) names the line. See the
// package documentation for the format and for what happens to entries the file leaves out.
func Apply(ctx context.Context, s Store, src []byte, opts ...ApplyOption) (Summary, error) {
	cfg := applyConfig{file: DefaultPolicyFile}
	for _, o := range opts {
		o(&cfg)
	}
	pol, err := ParsePolicy(cfg.file, src)
	if err != nil {
		return Summary{}, err
	}
	return ApplyPolicy(ctx, s, pol)
}

// ApplyPolicy makes the store match an already parsed policy, in one transaction.
func ApplyPolicy(ctx context.Context, s Store, pol Policy) (Summary, error) {
	var sum Summary
	err := s.Update(ctx, func(tx Tx) error {
		sum = Summary{} // Update may run fn more than once
		for _, want := range pol.Tenants {
			if err := applyTenant(ctx, tx, want, &sum); err != nil {
				return fmt.Errorf("tenant %q: %w", want.Tenant.ID, err)
			}
		}
		return nil
	})
	if err != nil {
		return Summary{}, fmt.Errorf("directory: apply: %w", err)
	}
	return sum, nil
}

func applyTenant(ctx context.Context, tx Tx, want Snapshot, sum *Summary) error {
	have, err := tx.Snapshot(ctx, want.Tenant.ID)
	switch {
	case errors.Is(err, ErrNotFound):
		if err := tx.PutTenant(ctx, want.Tenant); err != nil {
			return err
		}
		sum.Tenants.Created++
	case err != nil:
		return err
	case !sameTenant(have.Tenant, want.Tenant):
		if err := tx.PutTenant(ctx, want.Tenant); err != nil {
			return err
		}
		sum.Tenants.Updated++
	}

	// Order matters for references: roles before the users holding them, users before their
	// agents; removals last, once nothing in the file points at them.
	if err := upsert(ctx, have.Roles, want.Roles, roleName, sameRole, tx.PutRole, &sum.Roles); err != nil {
		return err
	}
	// Disabling through the file is a revocation like any other: it voids
	// what was issued before it (User.RevokedAt).
	now := RevocationNow()
	wasUser := map[string]bool{}
	for _, u := range have.Users {
		wasUser[u.ID] = !u.Disabled
	}
	putUser := func(ctx context.Context, u User) error {
		if u.Disabled && wasUser[u.ID] {
			u.RevokedAt = now
		}
		return tx.PutUser(ctx, u)
	}
	wasAgent := map[string]bool{}
	for _, a := range have.Agents {
		wasAgent[a.ID] = !a.Disabled
	}
	putAgent := func(ctx context.Context, a Agent) error {
		if a.Disabled && wasAgent[a.ID] {
			a.RevokedAt = now
		}
		return tx.PutAgent(ctx, a)
	}
	if err := upsert(ctx, have.Users, want.Users, userID, sameUser, putUser, &sum.Users); err != nil {
		return err
	}
	if err := upsert(ctx, have.Agents, want.Agents, agentID, sameAgent, putAgent, &sum.Agents); err != nil {
		return err
	}
	wantAgents := keys(want.Agents, agentID)
	for _, a := range have.Agents {
		if !a.Disabled && !wantAgents[a.ID] {
			a.Disabled, a.RevokedAt = true, now
			if err := tx.PutAgent(ctx, a); err != nil {
				return err
			}
			sum.Agents.Removed++
		}
	}
	wantUsers := keys(want.Users, userID)
	for _, u := range have.Users {
		if !u.Disabled && !wantUsers[u.ID] {
			u.Disabled, u.RevokedAt = true, now
			if err := tx.PutUser(ctx, u); err != nil {
				return err
			}
			sum.Users.Removed++
		}
	}
	wantRoles := keys(want.Roles, roleName)
	for _, r := range have.Roles {
		if !wantRoles[r.Name] {
			if err := tx.DeleteRole(ctx, r.Tenant, r.Name); err != nil {
				return err
			}
			sum.Roles.Removed++
		}
	}
	return nil
}

func roleName(r Role) string { return r.Name }
func userID(u User) string   { return u.ID }
func agentID(a Agent) string { return a.ID }

func keys[T any](items []T, key func(T) string) map[string]bool {
	m := make(map[string]bool, len(items))
	for _, it := range items {
		m[key(it)] = true
	}
	return m
}

func upsert[T any](ctx context.Context, have, want []T, key func(T) string, same func(a, b T) bool,
	put func(context.Context, T) error, c *Counts) error {
	byKey := make(map[string]T, len(have))
	for _, h := range have {
		byKey[key(h)] = h
	}
	for _, w := range want {
		h, found := byKey[key(w)]
		switch {
		case !found:
			c.Created++
		case same(h, w):
			continue
		default:
			c.Updated++
		}
		if err := put(ctx, w); err != nil {
			return err
		}
	}
	return nil
}
func sameTenant(a, b Tenant) bool {
	return a.ID == b.ID && a.DisplayName == b.DisplayName && slices.Equal(a.Features, b.Features) && a.TrustCeiling == b.TrustCeiling &&
		maps.Equal(a.Limits, b.Limits) // by value; nil and empty alike
}

func sameRole(a, b Role) bool {
	return a.Tenant == b.Tenant && a.Name == b.Name && slices.Equal(a.Permissions, b.Permissions)
}

func sameUser(a, b User) bool {
	return a.Tenant == b.Tenant && a.ID == b.ID && a.Org == b.Org && a.Disabled == b.Disabled && slices.Equal(a.Roles, b.Roles)
}

// sameAgent compares what a policy file states; RevokedAt is the store's.
func sameAgent(a, b Agent) bool {
	a.RevokedAt, b.RevokedAt = time.Time{}, time.Time{}
	return a == b
}

// SortSnapshot orders the lists of s by name or ID, the order [Tx.Snapshot] promises; for Store
// implementations.
func SortSnapshot(s *Snapshot) {
	slices.SortFunc(s.Roles, func(a, b Role) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(s.Users, func(a, b User) int { return cmp.Compare(a.ID, b.ID) })
	slices.SortFunc(s.Agents, func(a, b Agent) int { return cmp.Compare(a.ID, b.ID) })
}
