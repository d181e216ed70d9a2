package migrator

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/mandate-dev/mandate/internal/storage/migrate"
	"github.com/mandate-dev/mandate/internal/storage/pg"
)

// Record is one applied migration.
type Record struct {
	// Service is the owning service (and schema).
	Service string
	// Version is the applied migration's version.
	Version int
	// Name is the applied migration's description.
	Name string
	// Checksum is the hex SHA-256 of the file when it was applied.
	Checksum string
	// AppliedAt is when the migration's transaction ran.
	AppliedAt time.Time
}

// ErrChecksumMismatch is returned (wrapped) when an applied migration's file has changed since.
var ErrChecksumMismatch = errors.New("applied migration has changed")

// lockKey identifies the session advisory lock that serialises migration runs across processes.
// Its value is arbitrary but must never change: it is the one the hand-written runner before goose
// took, so that old and new processes exclude each other during a rolling upgrade.
const lockKey int64 = 0x6d616e6461746531 // "mandate1"

// lockPoll is how often a run waiting for another process's lock tries again, and lockTries how
// many times (together about ten minutes).
const (
	lockPoll  = 1 // seconds
	lockTries = 600
)

// Run applies every pending migration of sets, in the order given and by version within a set.
// It is idempotent and safe to call from several processes at once: goose's session advisory
// lock serialises runs, and each migration commits together with its version row.
func Run(ctx context.Context, pool *pgxpool.Pool, sets ...migrate.Set) error {
	type loaded struct {
		service string
		migs    []migrate.Migration
	}
	all := make([]loaded, 0, len(sets))
	services := map[string]bool{}
	for _, s := range sets {
		migs, err := s.Load()
		if err != nil {
			return err
		}
		if services[s.Service] {
			return fmt.Errorf("%w: service %q given twice", migrate.ErrInvalidSet, s.Service)
		}
		services[s.Service] = true
		all = append(all, loaded{s.Service, migs})
	}

	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockKey), lock.WithLockTimeout(lockPoll, lockTries))
	if err != nil {
		return fmt.Errorf("migrate: lock: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool) // closing it leaves the pool open
	defer func() { _ = db.Close() }()
	for _, l := range all {
		if err := up(ctx, db, locker, l.service, l.migs); err != nil {
			return err
		}
	}
	return nil
}

// up applies the pending migrations of one service with a goose provider: each file is a Go
// migration that runs the file as one simple-protocol statement (so a file may hold several
// statements and needs no goose annotations), in its service schema.
func up(ctx context.Context, db *sql.DB, locker lock.SessionLocker, service string, migs []migrate.Migration) error {
	if len(migs) == 0 {
		return nil // goose refuses a provider without migrations; there is nothing to do
	}
	gms := make([]*goose.Migration, 0, len(migs))
	for _, m := range migs {
		gms = append(gms, goose.NewGoMigration(int64(m.Version), &goose.GoFunc{
			RunTx: func(ctx context.Context, tx *sql.Tx) error { return apply(ctx, tx, service, m) },
		}, nil))
	}
	p, err := goose.NewProvider("", db, nil,
		goose.WithStore(newStore(service, migs)),
		goose.WithGoMigrations(gms...),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSessionLocker(locker),
		// Like the runner before goose: a migration merged with a lower version than one
		// already applied is applied, not refused.
		goose.WithAllowOutofOrder(true),
	)
	if err != nil {
		return fmt.Errorf("migrate: %s: %w", service, err)
	}
	_, err = p.Up(ctx)
	if partial, ok := errors.AsType[*goose.PartialError](err); ok && partial.Failed != nil && partial.Failed.Source != nil {
		// Migration errors go to operators (mandate migrate, service start-up), never to API
		// clients, so the driver's message is kept: it says what is wrong with the SQL.
		v := int(partial.Failed.Source.Version)
		return fmt.Errorf("migrate: %s %04d_%s: %w", service, v, nameOf(migs, v), partial.Err)
	}
	if errors.Is(err, ErrChecksumMismatch) {
		return err // names the service and file already
	}
	if err != nil {
		return fmt.Errorf("migrate: %s: %w", service, err)
	}
	return nil
}

func nameOf(migs []migrate.Migration, version int) string {
	for _, m := range migs {
		if m.Version == version {
			return m.Name
		}
	}
	return ""
}

func apply(ctx context.Context, tx *sql.Tx, service string, m migrate.Migration) error {
	schema := pgx.Identifier{service}.Sanitize()
	if _, err := tx.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+schema); err != nil {
		return err
	}
	// set_config(..., true) is SET LOCAL: it ends with the transaction.
	if _, err := tx.ExecContext(ctx, "SELECT set_config('search_path', $1, true)", schema+", public"); err != nil {
		return err
	}
	// No arguments: pgx uses the simple protocol, so a file may hold several statements.
	_, err := tx.ExecContext(ctx, m.SQL)
	return err
}

// Status lists the applied migrations of the given services (all services when none given),
// ordered by service and version. It returns no records when nothing was ever applied. A service
// last migrated by the runner before goose is listed from that runner's table.
func Status(ctx context.Context, pool *pgxpool.Pool, services ...string) ([]Record, error) {
	rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'goose\_%'`)
	if err != nil {
		return nil, pg.Wrap("migrate: status", err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, pg.Wrap("migrate: status", err)
	}
	var out []Record
	var migrated []string
	for _, t := range tables {
		service := strings.TrimPrefix(t, "goose_")
		if len(services) > 0 && !slices.Contains(services, service) {
			continue
		}
		migrated = append(migrated, service)
		recs, err := applied(ctx, pool, service)
		if err != nil {
			return nil, err
		}
		out = append(out, recs...)
	}
	legacy, err := legacyStatus(ctx, pool, services, migrated)
	if err != nil {
		return nil, err
	}
	out = append(out, legacy...)
	slices.SortFunc(out, func(a, b Record) int {
		if c := strings.Compare(a.Service, b.Service); c != 0 {
			return c
		}
		return a.Version - b.Version
	})
	return out, nil
}

func applied(ctx context.Context, pool *pgxpool.Pool, service string) ([]Record, error) {
	rows, err := pool.Query(ctx, `SELECT $1::text, version_id::int, name, checksum, tstamp FROM `+versionTable(service)+`
		WHERE is_applied AND version_id > 0 ORDER BY version_id`, service)
	if err != nil {
		return nil, pg.Wrap("migrate: status", err)
	}
	recs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Record])
	if err != nil {
		return nil, pg.Wrap("migrate: status", err)
	}
	return recs, nil
}

// legacyStatus lists what the runner before goose recorded for services that goose has not
// migrated yet.
func legacyStatus(ctx context.Context, pool *pgxpool.Pool, services, migrated []string) ([]Record, error) {
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('public.mandate_migrations') IS NOT NULL").Scan(&exists); err != nil {
		return nil, pg.Wrap("migrate: status", err)
	}
	if !exists {
		return nil, nil
	}
	if services == nil {
		services = []string{} // nil would be sent as NULL
	}
	if migrated == nil {
		migrated = []string{}
	}
	rows, err := pool.Query(ctx, `
		SELECT service, version, name, checksum, applied_at FROM public.mandate_migrations
		WHERE (cardinality($1::text[]) = 0 OR service = ANY($1)) AND service <> ALL($2::text[])`, services, migrated)
	if err != nil {
		return nil, pg.Wrap("migrate: status", err)
	}
	recs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Record])
	if err != nil {
		return nil, pg.Wrap("migrate: status", err)
	}
	return recs, nil
}
