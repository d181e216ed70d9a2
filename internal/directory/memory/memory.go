package memory

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/mandate-dev/mandate/internal/directory"
)

// Store is an in-memory directory.Store, safe for concurrent use.
type Store struct {
	writeMu sync.Mutex // serialises Update

	mu      sync.RWMutex
	tenants map[string]*tenantState // published states are never modified

	notifier directory.Notifier
}

type tenantState struct {
	tenant directory.Tenant // its Features and Limits are never modified, only replaced
	roles  map[string]directory.Role
	users  map[string]directory.User
	agents map[string]directory.Agent
}

func (t *tenantState) clone() *tenantState {
	return &tenantState{
		tenant: t.tenant,
		roles:  maps.Clone(t.roles),
		users:  maps.Clone(t.users),
		agents: maps.Clone(t.agents),
	}
}

var _ directory.Store = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	return &Store{tenants: map[string]*tenantState{}}
}

// Lookup implements directory.Store.
func (s *Store) Lookup(ctx context.Context, tenant, userID, agentID string) (directory.Facts, error) {
	if err := ctx.Err(); err != nil {
		return directory.Facts{}, err
	}
	s.mu.RLock()
	t := s.tenants[tenant]
	s.mu.RUnlock()
	var f directory.Facts
	if t == nil {
		return f, nil
	}
	f.TenantFound = true
	f.Features = slices.Clone(t.tenant.Features)
	f.TrustCeiling = t.tenant.TrustCeiling
	f.Limits = maps.Clone(t.tenant.Limits)
	if u, ok := t.users[userID]; ok {
		f.UserFound = true
		f.User = cloneUser(u)
		for _, r := range u.Roles {
			f.Permissions = append(f.Permissions, t.roles[r].Permissions...)
		}
		f.Permissions = directory.Normalize(f.Permissions)
	}
	if agentID != "" {
		f.Agent, f.AgentFound = t.agents[agentID]
	}
	return f, nil
}

// Update implements directory.Store. Writers are serialised; readers are never blocked by fn.
func (s *Store) Update(ctx context.Context, fn func(directory.Tx) error) error {
	tx, err := s.commit(ctx, fn)
	if err != nil {
		return err
	}
	if len(tx.dirty) > 0 {
		tenants := slices.Sorted(maps.Keys(tx.dirty))
		// Announced after unlocking so that a watcher may read or write the store.
		s.notifier.Publish(context.WithoutCancel(ctx), tenants...)
	}
	return nil
}

// commit runs fn on copies and publishes them if it succeeds; a panic in fn leaves the store
// unchanged and unlocked.
func (s *Store) commit(ctx context.Context, fn func(directory.Tx) error) (*tx, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	t := &tx{s: s, dirty: map[string]*tenantState{}}
	if err := fn(t); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	for id, st := range t.dirty {
		s.tenants[id] = st
	}
	s.mu.Unlock()
	return t, nil
}

// Watch implements directory.Store.
func (s *Store) Watch(ctx context.Context) <-chan directory.Change {
	return s.notifier.Watch(ctx)
}

// tx sees the committed state plus its own copies of the tenants it wrote to. It runs under
// writeMu, so reading s.tenants without s.mu is safe: only a writer changes it.
type tx struct {
	s     *Store
	dirty map[string]*tenantState
}

func (t *tx) read(id string) *tenantState {
	if d, ok := t.dirty[id]; ok {
		return d
	}
	return t.s.tenants[id]
}

func (t *tx) write(id string) (*tenantState, error) {
	if d, ok := t.dirty[id]; ok {
		return d, nil
	}
	base := t.s.tenants[id]
	if base == nil {
		return nil, fmt.Errorf("%w: tenant %q does not exist", directory.ErrReference, id)
	}
	d := base.clone()
	t.dirty[id] = d
	return d, nil
}

func (t *tx) Snapshot(ctx context.Context, tenant string) (directory.Snapshot, error) {
	st := t.read(tenant)
	if st == nil {
		return directory.Snapshot{}, fmt.Errorf("%w: tenant %q", directory.ErrNotFound, tenant)
	}
	snap := directory.Snapshot{Tenant: st.tenant}
	snap.Tenant.Features = slices.Clone(st.tenant.Features)
	snap.Tenant.Limits = maps.Clone(st.tenant.Limits)
	for _, r := range st.roles {
		r.Permissions = slices.Clone(r.Permissions)
		snap.Roles = append(snap.Roles, r)
	}
	for _, u := range st.users {
		snap.Users = append(snap.Users, cloneUser(u))
	}
	for _, a := range st.agents {
		snap.Agents = append(snap.Agents, a)
	}
	directory.SortSnapshot(&snap)
	return snap, nil
}

func (t *tx) PutTenant(ctx context.Context, tn directory.Tenant) error {
	tn, err := tn.Check()
	if err != nil {
		return err
	}
	st := t.read(tn.ID)
	if st == nil {
		st = &tenantState{
			roles:  map[string]directory.Role{},
			users:  map[string]directory.User{},
			agents: map[string]directory.Agent{},
		}
	} else {
		st = st.clone()
	}
	st.tenant = tn
	t.dirty[tn.ID] = st
	return nil
}

func (t *tx) PutRole(ctx context.Context, r directory.Role) error {
	r, err := r.Check()
	if err != nil {
		return err
	}
	st, err := t.write(r.Tenant)
	if err != nil {
		return err
	}
	st.roles[r.Name] = r
	return nil
}

func (t *tx) DeleteRole(ctx context.Context, tenant, name string) error {
	st := t.read(tenant)
	if st == nil {
		return fmt.Errorf("%w: tenant %q", directory.ErrNotFound, tenant)
	}
	if _, ok := st.roles[name]; !ok {
		return fmt.Errorf("%w: role %q in tenant %q", directory.ErrNotFound, name, tenant)
	}
	st, err := t.write(tenant)
	if err != nil {
		return err
	}
	delete(st.roles, name)
	for id, u := range st.users {
		if i := slices.Index(u.Roles, name); i >= 0 {
			u.Roles = slices.Delete(slices.Clone(u.Roles), i, i+1)
			st.users[id] = u
		}
	}
	return nil
}

func (t *tx) PutUser(ctx context.Context, u directory.User) error {
	u, err := u.Check()
	if err != nil {
		return err
	}
	st := t.read(u.Tenant)
	if st == nil {
		return fmt.Errorf("%w: tenant %q does not exist", directory.ErrReference, u.Tenant)
	}
	for _, r := range u.Roles {
		if _, ok := st.roles[r]; !ok {
			return fmt.Errorf("%w: role %q is not defined in tenant %q", directory.ErrReference, r, u.Tenant)
		}
	}
	st, err = t.write(u.Tenant)
	if err != nil {
		return err
	}
	u.RevokedAt = directory.LaterRevocation(st.users[u.ID].RevokedAt, u.RevokedAt)
	st.users[u.ID] = u
	return nil
}

func (t *tx) PutAgent(ctx context.Context, a directory.Agent) error {
	a, err := a.Check()
	if err != nil {
		return err
	}
	st := t.read(a.Tenant)
	if st == nil {
		return fmt.Errorf("%w: tenant %q does not exist", directory.ErrReference, a.Tenant)
	}
	if _, ok := st.users[a.UserID]; !ok {
		return fmt.Errorf("%w: user %q does not exist in tenant %q", directory.ErrReference, a.UserID, a.Tenant)
	}
	st, err = t.write(a.Tenant)
	if err != nil {
		return err
	}
	a.RevokedAt = directory.LaterRevocation(st.agents[a.ID].RevokedAt, a.RevokedAt)
	st.agents[a.ID] = a
	return nil
}

func cloneUser(u directory.User) directory.User {
	u.Roles = slices.Clone(u.Roles)
	return u
}
