package postgres

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/storage/migrate"
	"github.com/mandate-dev/mandate/internal/storage/pg"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations creates the directory schema; migrator.Run (`mandate migrate`) applies it before New.
var Migrations = migrate.Set{Service: "directory", FS: mustSub(migrationFiles, "migrations")}

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // the directory is embedded above; this cannot fail
	}
	return sub
}

// Channel is the LISTEN/NOTIFY channel; the payload is the tenant id that changed.
const Channel = "mandate_directory"

// writeLockKey serialises directory writes across processes (pg_advisory_xact_lock).
const writeLockKey int64 = 0x6d646972656374 // "mdirect"

// Options tunes a Store.
type Options struct {
	// Logger receives listener connection problems. Default slog.Default().
	Logger *slog.Logger
	// ReconnectMin and ReconnectMax bound the listener's reconnect backoff. Defaults 100ms and
	// 5s.
	ReconnectMin, ReconnectMax time.Duration
	// WatchReadyTimeout bounds how long Watch waits for the listener to have LISTEN in place.
	// Default 5s. A Watch that gives up still receives changes once the listener connects,
	// preceded by a change to all tenants.
	WatchReadyTimeout time.Duration
	// WriteRetries is how many times Update runs fn in total when the transaction fails with
	// a serialization failure or deadlock. Default 3.
	WriteRetries int
}

// Store is the PostgreSQL directory.Store. It does not own the pool.
type Store struct {
	pool *pgxpool.Pool
	opts Options

	notifier directory.Notifier

	mu       sync.Mutex
	closed   bool
	watchers int
	stop     context.CancelFunc // stops the current listener run; nil when none runs
	run      *listenerRun       // the current listener run
	wg       sync.WaitGroup     // listener goroutines, including ones still stopping
}

var _ directory.Store = (*Store)(nil)

// New returns a Store on pool, whose database must have [Migrations] applied.
func New(pool *pgxpool.Pool, opts Options) *Store {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ReconnectMin <= 0 {
		opts.ReconnectMin = 100 * time.Millisecond
	}
	if opts.ReconnectMax < opts.ReconnectMin {
		opts.ReconnectMax = max(5*time.Second, opts.ReconnectMin)
	}
	if opts.WatchReadyTimeout <= 0 {
		opts.WatchReadyTimeout = 5 * time.Second
	}
	if opts.WriteRetries <= 0 {
		opts.WriteRetries = 3
	}
	return &Store{pool: pool, opts: opts}
}

// Pool returns the pool the store uses.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close stops the listener, if one runs, and waits for it to end; later Watch calls only see
// changes made through this Store. Channels returned by Watch are closed when their own
// contexts end.
func (s *Store) Close() {
	s.mu.Lock()
	s.closed = true
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
	s.mu.Unlock()
	s.wg.Wait()
}

const lookupSQL = `
SELECT t.features,
       t.trust_ceiling,
       t.limits,
       u.id IS NOT NULL,
       coalesce(u.org, ''),
       coalesce(u.disabled, false),
       u.revoked_at,
       coalesce((SELECT array_agg(ur.role ORDER BY ur.role)
                   FROM directory.user_roles ur
                  WHERE ur.tenant_id = t.id AND ur.user_id = u.id), '{}'),
       coalesce((SELECT array_agg(DISTINCT p ORDER BY p)
                   FROM directory.user_roles ur
                   JOIN directory.roles r ON r.tenant_id = ur.tenant_id AND r.name = ur.role
                  CROSS JOIN LATERAL unnest(r.permissions) AS p
                  WHERE ur.tenant_id = t.id AND ur.user_id = u.id), '{}'),
       a.id IS NOT NULL,
       coalesce(a.user_id, ''),
       coalesce(a.disabled, false),
       coalesce(a.host, ''),
       a.revoked_at
  FROM directory.tenants t
  LEFT JOIN directory.users u  ON u.tenant_id = t.id AND u.id = $2
  LEFT JOIN directory.agents a ON a.tenant_id = t.id AND a.id = $3
 WHERE t.id = $1`

// Lookup implements directory.Store in one round trip.
func (s *Store) Lookup(ctx context.Context, tenant, userID, agentID string) (directory.Facts, error) {
	f := directory.Facts{User: directory.User{Tenant: tenant, ID: userID}, Agent: directory.Agent{Tenant: tenant, ID: agentID}}
	var userRevoked, agentRevoked *time.Time
	var limits []byte
	err := s.pool.QueryRow(ctx, lookupSQL, tenant, userID, agentID).Scan(
		&f.Features, &f.TrustCeiling, &limits, &f.UserFound, &f.User.Org, &f.User.Disabled, &userRevoked, &f.User.Roles, &f.Permissions,
		&f.AgentFound, &f.Agent.UserID, &f.Agent.Disabled, &f.Agent.Host, &agentRevoked)
	if errors.Is(err, pgx.ErrNoRows) {
		return directory.Facts{}, nil
	}
	if err != nil {
		return directory.Facts{}, pg.Wrap("directory: lookup", err)
	}
	f.TenantFound = true
	f.User.RevokedAt, f.Agent.RevokedAt = instant(userRevoked), instant(agentRevoked)
	if f.Limits, err = decodeLimits(limits); err != nil {
		return directory.Facts{}, fmt.Errorf("directory: lookup: tenant %q: %w", tenant, err)
	}
	// Empty lists come back as empty slices; the memory store returns nil. Keep them alike.
	for _, l := range []*[]string{&f.Features, &f.User.Roles, &f.Permissions} {
		if len(*l) == 0 {
			*l = nil
		}
	}
	if !f.UserFound {
		f.User = directory.User{}
	}
	if !f.AgentFound {
		f.Agent = directory.Agent{}
	}
	return f, nil
}

// Update implements directory.Store. fn may run more than once when the transaction hits a
// serialization failure or deadlock.
func (s *Store) Update(ctx context.Context, fn func(directory.Tx) error) error {
	var (
		touched map[string]bool
		echoes  echoReg
	)
	err := pg.InTx(ctx, s.pool, func(ptx pgx.Tx) error {
		s.forgetEchoes(echoes) // a previous attempt failed: its notifications were never sent
		echoes = echoReg{}
		if _, err := ptx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", writeLockKey); err != nil {
			return pg.Wrap("directory: update", err)
		}
		t := &tx{tx: ptx, touched: map[string]bool{}}
		if err := fn(t); err != nil {
			return err
		}
		touched = t.touched
		tenants := slices.Sorted(maps.Keys(touched))
		for _, tenant := range tenants {
			if _, err := ptx.Exec(ctx, "SELECT pg_notify($1, $2)", Channel, tenant); err != nil {
				return pg.Wrap("directory: notify", err)
			}
		}
		echoes = s.expectEchoes(ptx.Conn().PgConn().PID(), tenants)
		return nil
	}, pg.WithRetry(s.opts.WriteRetries))
	if err != nil {
		s.forgetEchoes(echoes)
		return err
	}
	if len(touched) > 0 {
		// Watchers in this process hear about the change before Update returns; the listener
		// drops the NOTIFY echo of it.
		s.notifier.Publish(context.WithoutCancel(ctx), slices.Sorted(maps.Keys(touched))...)
	}
	return nil
}

type tx struct {
	tx      pgx.Tx
	touched map[string]bool
}

func (t *tx) Snapshot(ctx context.Context, tenant string) (directory.Snapshot, error) {
	var snap directory.Snapshot
	var limits []byte
	err := t.tx.QueryRow(ctx, "SELECT id, display_name, features, trust_ceiling, limits FROM directory.tenants WHERE id = $1", tenant).
		Scan(&snap.Tenant.ID, &snap.Tenant.DisplayName, &snap.Tenant.Features, &snap.Tenant.TrustCeiling, &limits)
	if errors.Is(err, pgx.ErrNoRows) {
		return directory.Snapshot{}, fmt.Errorf("%w: tenant %q", directory.ErrNotFound, tenant)
	}
	if err != nil {
		return directory.Snapshot{}, pg.Wrap("directory: snapshot", err)
	}
	if snap.Tenant.Limits, err = decodeLimits(limits); err != nil {
		return directory.Snapshot{}, fmt.Errorf("directory: snapshot: tenant %q: %w", tenant, err)
	}
	rows, _ := t.tx.Query(ctx, "SELECT tenant_id, name, permissions FROM directory.roles WHERE tenant_id = $1 ORDER BY name", tenant)
	if snap.Roles, err = pgx.CollectRows(rows, pgx.RowToStructByPos[directory.Role]); err != nil {
		return directory.Snapshot{}, pg.Wrap("directory: snapshot", err)
	}
	rows, _ = t.tx.Query(ctx, `
		SELECT u.tenant_id, u.id, u.org,
		       coalesce((SELECT array_agg(role ORDER BY role) FROM directory.user_roles ur
		                  WHERE ur.tenant_id = u.tenant_id AND ur.user_id = u.id), '{}'),
		       u.disabled, u.revoked_at
		  FROM directory.users u WHERE u.tenant_id = $1 ORDER BY u.id`, tenant)
	if snap.Users, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (directory.User, error) {
		var u directory.User
		var revoked *time.Time
		err := row.Scan(&u.Tenant, &u.ID, &u.Org, &u.Roles, &u.Disabled, &revoked)
		u.RevokedAt = instant(revoked)
		return u, err
	}); err != nil {
		return directory.Snapshot{}, pg.Wrap("directory: snapshot", err)
	}
	rows, _ = t.tx.Query(ctx, "SELECT tenant_id, id, user_id, disabled, host, revoked_at FROM directory.agents WHERE tenant_id = $1 ORDER BY id", tenant)
	if snap.Agents, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (directory.Agent, error) {
		var a directory.Agent
		var revoked *time.Time
		err := row.Scan(&a.Tenant, &a.ID, &a.UserID, &a.Disabled, &a.Host, &revoked)
		a.RevokedAt = instant(revoked)
		return a, err
	}); err != nil {
		return directory.Snapshot{}, pg.Wrap("directory: snapshot", err)
	}
	snap.Tenant.Features = directory.Normalize(snap.Tenant.Features)
	for i := range snap.Roles {
		snap.Roles[i].Permissions = directory.Normalize(snap.Roles[i].Permissions)
	}
	for i := range snap.Users {
		snap.Users[i].Roles = directory.Normalize(snap.Users[i].Roles)
	}
	return snap, nil
}

// exists reports whether sql (a SELECT EXISTS) is true. Reference checks run before writes so
// that a refused write leaves the transaction usable, as in the memory store; the foreign keys
// stay as the last line of defence.
func (t *tx) exists(ctx context.Context, sql string, args ...any) (bool, error) {
	var ok bool
	if err := t.tx.QueryRow(ctx, sql, args...).Scan(&ok); err != nil {
		return false, pg.Wrap("directory: check reference", err)
	}
	return ok, nil
}

func (t *tx) requireTenant(ctx context.Context, tenant string) error {
	ok, err := t.exists(ctx, "SELECT EXISTS (SELECT FROM directory.tenants WHERE id = $1)", tenant)
	if err == nil && !ok {
		err = fmt.Errorf("%w: tenant %q does not exist", directory.ErrReference, tenant)
	}
	return err
}

// writeErr maps a failed write: a foreign-key violation means a reference to a missing entry
// of the same tenant; anything else is a storage error.
func writeErr(op string, err error, missing string) error {
	if pg.Classify(err) == pg.KindForeignKeyViolation {
		return fmt.Errorf("%w: %s", directory.ErrReference, missing)
	}
	return pg.Wrap(op, err)
}

func (t *tx) PutTenant(ctx context.Context, tn directory.Tenant) error {
	tn, err := tn.Check()
	if err != nil {
		return err
	}
	features := tn.Features
	if features == nil {
		features = []string{}
	}
	limits, err := encodeLimits(tn.Limits)
	if err != nil {
		return err
	}
	_, err = t.tx.Exec(ctx, `
		INSERT INTO directory.tenants (id, display_name, features, trust_ceiling, limits) VALUES ($1, $2, $3, $4, $5::jsonb)
		ON CONFLICT (id) DO UPDATE SET display_name = excluded.display_name, features = excluded.features,
		       trust_ceiling = excluded.trust_ceiling, limits = excluded.limits`,
		tn.ID, tn.DisplayName, features, tn.TrustCeiling, limits)
	if err != nil {
		return pg.Wrap("directory: put tenant", err)
	}
	t.touched[tn.ID] = true
	return nil
}

func (t *tx) PutRole(ctx context.Context, r directory.Role) error {
	r, err := r.Check()
	if err != nil {
		return err
	}
	if err := t.requireTenant(ctx, r.Tenant); err != nil {
		return err
	}
	perms := r.Permissions
	if perms == nil {
		perms = []string{}
	}
	_, err = t.tx.Exec(ctx, `
		INSERT INTO directory.roles (tenant_id, name, permissions) VALUES ($1, $2, $3)
		ON CONFLICT (tenant_id, name) DO UPDATE SET permissions = excluded.permissions`,
		r.Tenant, r.Name, perms)
	if err != nil {
		return writeErr("directory: put role", err, fmt.Sprintf("tenant %q does not exist", r.Tenant))
	}
	t.touched[r.Tenant] = true
	return nil
}

func (t *tx) DeleteRole(ctx context.Context, tenant, name string) error {
	tag, err := t.tx.Exec(ctx, "DELETE FROM directory.roles WHERE tenant_id = $1 AND name = $2", tenant, name)
	if err != nil {
		return pg.Wrap("directory: delete role", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: role %q in tenant %q", directory.ErrNotFound, name, tenant)
	}
	t.touched[tenant] = true
	return nil
}

func (t *tx) PutUser(ctx context.Context, u directory.User) error {
	u, err := u.Check()
	if err != nil {
		return err
	}
	if err := t.requireTenant(ctx, u.Tenant); err != nil {
		return err
	}
	var missing []string
	if err := t.tx.QueryRow(ctx, `
		SELECT coalesce(array_agg(r ORDER BY r), '{}') FROM unnest($2::text[]) AS r
		 WHERE NOT EXISTS (SELECT FROM directory.roles WHERE tenant_id = $1 AND name = r)`,
		u.Tenant, u.Roles).Scan(&missing); err != nil {
		return pg.Wrap("directory: put user", err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: role %q is not defined in tenant %q", directory.ErrReference, missing[0], u.Tenant)
	}
	_, err = t.tx.Exec(ctx, `
		INSERT INTO directory.users (tenant_id, id, org, disabled, revoked_at) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (tenant_id, id) DO UPDATE SET org = excluded.org, disabled = excluded.disabled,
		       revoked_at = GREATEST(users.revoked_at, excluded.revoked_at)`,
		u.Tenant, u.ID, u.Org, u.Disabled, nullInstant(u.RevokedAt))
	if err != nil {
		return writeErr("directory: put user", err, fmt.Sprintf("tenant %q does not exist", u.Tenant))
	}
	roles := u.Roles
	if roles == nil {
		roles = []string{}
	}
	if _, err := t.tx.Exec(ctx, `
		DELETE FROM directory.user_roles
		 WHERE tenant_id = $1 AND user_id = $2 AND NOT (role = ANY($3))`, u.Tenant, u.ID, roles); err != nil {
		return pg.Wrap("directory: put user", err)
	}
	if _, err := t.tx.Exec(ctx, `
		INSERT INTO directory.user_roles (tenant_id, user_id, role)
		SELECT $1, $2, unnest($3::text[])
		ON CONFLICT DO NOTHING`, u.Tenant, u.ID, roles); err != nil {
		return writeErr("directory: put user", err, fmt.Sprintf("a role of user %q is not defined in tenant %q", u.ID, u.Tenant))
	}
	t.touched[u.Tenant] = true
	return nil
}

func (t *tx) PutAgent(ctx context.Context, a directory.Agent) error {
	a, err := a.Check()
	if err != nil {
		return err
	}
	if err := t.requireTenant(ctx, a.Tenant); err != nil {
		return err
	}
	ok, err := t.exists(ctx, "SELECT EXISTS (SELECT FROM directory.users WHERE tenant_id = $1 AND id = $2)", a.Tenant, a.UserID)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: user %q does not exist in tenant %q", directory.ErrReference, a.UserID, a.Tenant)
	}
	_, err = t.tx.Exec(ctx, `
		INSERT INTO directory.agents (tenant_id, id, user_id, disabled, host, revoked_at) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (tenant_id, id) DO UPDATE SET user_id = excluded.user_id, disabled = excluded.disabled, host = excluded.host,
		       revoked_at = GREATEST(agents.revoked_at, excluded.revoked_at)`,
		a.Tenant, a.ID, a.UserID, a.Disabled, string(a.Host), nullInstant(a.RevokedAt))
	if err != nil {
		return writeErr("directory: put agent", err, fmt.Sprintf("user %q does not exist in tenant %q", a.UserID, a.Tenant))
	}
	t.touched[a.Tenant] = true
	return nil
}

// storedLimit is one entry of the tenants.limits column: a zero field is
// omitted and keeps the declared value; the window is a Go duration string
// ("12h0m0s"), which time.ParseDuration reads back exactly.
type storedLimit struct {
	Max    int64  `json:"max,omitempty"`
	Window string `json:"window,omitempty"`
}

// encodeLimits renders Tenant.Limits as the limits column's JSON object.
func encodeLimits(m map[string]directory.LimitOverride) (string, error) {
	rows := make(map[string]storedLimit, len(m))
	for k, o := range m {
		var w string
		if o.Window != 0 {
			w = o.Window.String()
		}
		rows[k] = storedLimit{Max: o.Max, Window: w}
	}
	b, err := json.Marshal(rows) // keys sorted: the same overrides, the same text
	if err != nil {
		return "", fmt.Errorf("directory: put tenant: limits: %w", err)
	}
	return string(b), nil
}

// decodeLimits reads the limits column; nil when it holds none, like the
// memory store.
func decodeLimits(b []byte) (map[string]directory.LimitOverride, error) {
	var rows map[string]storedLimit
	if err := json.Unmarshal(b, &rows); err != nil {
		return nil, fmt.Errorf("limits column: %w", err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	out := make(map[string]directory.LimitOverride, len(rows))
	for k, r := range rows {
		o := directory.LimitOverride{Max: r.Max}
		if r.Window != "" {
			d, err := time.ParseDuration(r.Window)
			if err != nil {
				return nil, fmt.Errorf("limits column: %s: %w", k, err)
			}
			o.Window = d
		}
		out[k] = o
	}
	return out, nil
}

// instant reads a nullable timestamptz as the directory's zero-or-UTC time.
func instant(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// nullInstant writes the zero time as NULL (GREATEST ignores NULLs).
func nullInstant(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
