package migrator_test

import (
	"context"
	"errors"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/internal/storage/migrate"
	"github.com/mandate-dev/mandate/internal/storage/migrate/migrator"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

// legacyApply leaves the database as the runner before goose did after applying set: the
// migrations' effects in the service schema and one public.mandate_migrations row per file.
func legacyApply(t *testing.T, pool *pgxpool.Pool, set migrate.Set, appliedAt time.Time) {
	t.Helper()
	ctx := context.Background()
	migs, err := set.Load()
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `CREATE TABLE IF NOT EXISTS public.mandate_migrations (
		service    text        NOT NULL,
		version    integer     NOT NULL,
		name       text        NOT NULL,
		checksum   text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (service, version))`)
	mustExec(t, pool, "CREATE SCHEMA "+set.Service)
	for _, m := range migs {
		mustExec(t, pool, "SET search_path = "+set.Service+", public; "+m.SQL+"; RESET search_path")
		if _, err := pool.Exec(ctx, `INSERT INTO public.mandate_migrations (service, version, name, checksum, applied_at)
			VALUES ($1, $2, $3, $4, $5)`, set.Service, m.Version, m.Name, m.Checksum, appliedAt); err != nil {
			t.Fatal(err)
		}
	}
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestRunUpgradesADatabaseOfTheOldRunner(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	appliedAt := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	fsys := shopSet()
	legacyApply(t, pool, migrate.Set{Service: "shop", FS: fsys}, appliedAt)
	// Before the new runner ran, status reads the old table.
	if got := versions(status(t, pool)); got != "shop:1:init shop:2:seed" {
		t.Fatalf("status of the old database = %q", got)
	}

	fsys["0003_stock.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE items ADD COLUMN stock int NOT NULL DEFAULT 0;")}
	if err := migrator.Run(ctx, pool, migrate.Set{Service: "shop", FS: fsys}); err != nil {
		t.Fatal(err)
	}
	recs := status(t, pool)
	if got := versions(recs); got != "shop:1:init shop:2:seed shop:3:stock" {
		t.Fatalf("applied = %q", got)
	}
	if !recs[0].AppliedAt.Equal(appliedAt) || !recs[1].AppliedAt.Equal(appliedAt) {
		t.Fatalf("carried-over records lost their time: %v, %v", recs[0].AppliedAt, recs[1].AppliedAt)
	}
	var n, stock int
	if err := pool.QueryRow(ctx, "SELECT count(*), sum(stock) FROM shop.items").Scan(&n, &stock); err != nil {
		t.Fatal(err)
	}
	if n != 2 || stock != 0 {
		t.Fatalf("shop.items has %d rows (stock %d); the old migrations must not run again", n, stock)
	}
	var goose bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('public.goose_shop') IS NOT NULL").Scan(&goose); err != nil {
		t.Fatal(err)
	}
	if !goose {
		t.Fatal("no goose version table public.goose_shop")
	}

	// Running again is a no-op, and the old records are not carried over a second time.
	if err := migrator.Run(ctx, pool, migrate.Set{Service: "shop", FS: fsys}); err != nil {
		t.Fatal(err)
	}
	if got := versions(status(t, pool)); got != "shop:1:init shop:2:seed shop:3:stock" {
		t.Fatalf("applied after a second run = %q", got)
	}
}

func TestRunChecksCarriedOverChecksums(t *testing.T) {
	pool := pgtest.New(t)
	fsys := shopSet()
	legacyApply(t, pool, migrate.Set{Service: "shop", FS: fsys}, time.Now())
	fsys["0001_init.sql"] = &fstest.MapFile{Data: []byte("CREATE TABLE items (id text PRIMARY KEY);")}
	fsys["0003_stock.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE items ADD COLUMN stock int;")}
	err := migrator.Run(context.Background(), pool, migrate.Set{Service: "shop", FS: fsys})
	if !errors.Is(err, migrator.ErrChecksumMismatch) {
		t.Fatalf("err = %v, want ErrChecksumMismatch", err)
	}
	if got := versions(status(t, pool)); got != "shop:1:init shop:2:seed" {
		t.Fatalf("applied = %q; nothing may run after a mismatch", got)
	}
}

func TestRunLeavesOtherServicesOfTheOldRunner(t *testing.T) {
	pool := pgtest.New(t)
	legacyApply(t, pool, migrate.Set{Service: "shop", FS: shopSet()}, time.Now())
	other := fstest.MapFS{"0001_t.sql": {Data: []byte("CREATE TABLE t (id int);")}}
	if err := migrator.Run(context.Background(), pool, migrate.Set{Service: "other", FS: other}); err != nil {
		t.Fatal(err)
	}
	// shop was not migrated by goose yet: status still lists it from the old table.
	if got := versions(status(t, pool)); got != "other:1:t shop:1:init shop:2:seed" {
		t.Fatalf("applied = %q", got)
	}
}
