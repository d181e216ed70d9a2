package migrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/internal/storage/pg"
)

// Set is the migrations of one service.
type Set struct {
	// Service names the service and its Postgres schema; it must match [a-z][a-z0-9_]*.
	Service string
	// FS holds the migration files NNNN_description.sql at its root. Other files are ignored.
	FS fs.FS
}

// Migration is one migration file of a [Set].
type Migration struct {
	// Version is the number prefix of the file name.
	Version int
	// Name is the description part of the file name.
	Name string
	// SQL is the file's content.
	SQL string
	// Checksum is the hex SHA-256 of SQL.
	Checksum string
}

// Record is one row of the bookkeeping table.
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

// ErrInvalidSet is returned (wrapped) for a malformed Set: bad service name, bad file name,
// duplicate version.
var ErrInvalidSet = errors.New("invalid migration set")

var (
	serviceRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)
	fileRE    = regexp.MustCompile(`^([0-9]{4,})_([a-z0-9_]+)\.sql$`)
)

// lockKey identifies the advisory lock that serialises migration runs across processes. Its
// value is arbitrary but must never change.
const lockKey int64 = 0x6d616e6461746531 // "mandate1"

// Load reads and validates the migrations of s, sorted by version.
func (s Set) Load() ([]Migration, error) {
	if !serviceRE.MatchString(s.Service) {
		return nil, fmt.Errorf("%w: service name %q must match %s", ErrInvalidSet, s.Service, serviceRE)
	}
	if s.FS == nil {
		return nil, fmt.Errorf("%w: %s: no file system", ErrInvalidSet, s.Service)
	}
	entries, err := fs.ReadDir(s.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalidSet, s.Service, err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		if e.IsDir() || path.Ext(e.Name()) != ".sql" {
			continue
		}
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("%w: %s: file %q is not named NNNN_description.sql", ErrInvalidSet, s.Service, e.Name())
		}
		v, err := strconv.Atoi(m[1])
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("%w: %s: file %q has no positive version", ErrInvalidSet, s.Service, e.Name())
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("%w: %s: files %q and %q share version %d", ErrInvalidSet, s.Service, prev, e.Name(), v)
		}
		seen[v] = e.Name()
		body, err := fs.ReadFile(s.FS, e.Name())
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalidSet, s.Service, err)
		}
		sum := sha256.Sum256(body)
		out = append(out, Migration{Version: v, Name: m[2], SQL: string(body), Checksum: hex.EncodeToString(sum[:])})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out, nil
}

const createBookkeeping = `
CREATE TABLE IF NOT EXISTS public.mandate_migrations (
	service    text        NOT NULL,
	version    integer     NOT NULL,
	name       text        NOT NULL,
	checksum   text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (service, version)
)`

// Run applies every pending migration of sets, in the order given and by version within a set.
// It is idempotent and safe to call from several processes at once: a session advisory lock
// serialises runs, and each migration commits together with its bookkeeping row.
func Run(ctx context.Context, pool *pgxpool.Pool, sets ...Set) error {
	type loaded struct {
		service string
		migs    []Migration
	}
	all := make([]loaded, 0, len(sets))
	services := map[string]bool{}
	for _, s := range sets {
		migs, err := s.Load()
		if err != nil {
			return err
		}
		if services[s.Service] {
			return fmt.Errorf("%w: service %q given twice", ErrInvalidSet, s.Service)
		}
		services[s.Service] = true
		all = append(all, loaded{s.Service, migs})
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		return pg.Wrap("migrate: acquire", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return pg.Wrap("migrate: lock", err)
	}
	defer func() {
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(unlockCtx, "SELECT pg_advisory_unlock($1)", lockKey); err != nil {
			// Do not hand a connection that may still hold the lock back to the pool; closing
			// it ends the session and so releases the lock.
			_ = conn.Hijack().Close(unlockCtx)
		}
	}()

	// Created under the lock: concurrent CREATE TABLE IF NOT EXISTS can still collide.
	if _, err := conn.Exec(ctx, createBookkeeping); err != nil {
		return pg.Wrap("migrate: bookkeeping table", err)
	}
	for _, l := range all {
		applied, err := appliedChecksums(ctx, conn, l.service)
		if err != nil {
			return err
		}
		for _, m := range l.migs {
			if sum, ok := applied[m.Version]; ok {
				if sum != m.Checksum {
					return fmt.Errorf("migrate: %s %04d_%s: %w (recorded checksum %.12s, file %.12s)",
						l.service, m.Version, m.Name, ErrChecksumMismatch, sum, m.Checksum)
				}
				continue
			}
			if err := apply(ctx, conn, l.service, m); err != nil {
				return err
			}
		}
	}
	return nil
}

func appliedChecksums(ctx context.Context, conn *pgxpool.Conn, service string) (map[int]string, error) {
	rows, err := conn.Query(ctx, "SELECT version, checksum FROM public.mandate_migrations WHERE service = $1", service)
	if err != nil {
		return nil, pg.Wrap("migrate: read applied", err)
	}
	out := map[int]string{}
	var v int
	var sum string
	_, err = pgx.ForEachRow(rows, []any{&v, &sum}, func() error {
		out[v] = sum
		return nil
	})
	if err != nil {
		return nil, pg.Wrap("migrate: read applied", err)
	}
	return out, nil
}

func apply(ctx context.Context, conn *pgxpool.Conn, service string, m Migration) error {
	schema := pgx.Identifier{service}.Sanitize()
	err := pg.InTx(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+schema); err != nil {
			return err
		}
		// set_config(..., true) is SET LOCAL: it ends with the transaction.
		if _, err := tx.Exec(ctx, "SELECT set_config('search_path', $1, true)", schema+", public"); err != nil {
			return err
		}
		// No arguments: pgx uses the simple protocol, so a file may hold several statements.
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return err
		}
		_, err := tx.Exec(ctx,
			"INSERT INTO public.mandate_migrations (service, version, name, checksum) VALUES ($1, $2, $3, $4)",
			service, m.Version, m.Name, m.Checksum)
		return err
	})
	if err != nil {
		// Migration errors go to operators (mandate migrate, service start-up), never to API
		// clients, so the driver's message is kept: it says what is wrong with the SQL.
		return fmt.Errorf("migrate: %s %04d_%s: %w", service, m.Version, m.Name, err)
	}
	return nil
}

// Status lists the applied migrations of the given services (all services when none given),
// ordered by service and version. It returns no records when nothing was ever applied.
func Status(ctx context.Context, pool *pgxpool.Pool, services ...string) ([]Record, error) {
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
	rows, err := pool.Query(ctx, `
		SELECT service, version, name, checksum, applied_at FROM public.mandate_migrations
		WHERE cardinality($1::text[]) = 0 OR service = ANY($1)
		ORDER BY service, version`, services)
	if err != nil {
		return nil, pg.Wrap("migrate: status", err)
	}
	recs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Record])
	if err != nil {
		return nil, pg.Wrap("migrate: status", err)
	}
	return recs, nil
}
