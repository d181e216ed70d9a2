package migrator_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/storage/migrate"
	"github.com/mandate-dev/mandate/internal/storage/migrate/migrator"
	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

// childEnv, when set, makes the test binary act as a migrating process (see
// TestRunConcurrentProcesses) instead of running tests.
const childEnv = "MANDATE_MIGRATE_TEST_CHILD_DSN"

func TestMain(m *testing.M) {
	if dsn := os.Getenv(childEnv); dsn != "" {
		os.Exit(child(dsn))
	}
	goleak.VerifyTestMain(pgtest.M(m))
}

func child(dsn string) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pg.Open(ctx, dsn, pg.Options{MaxConns: 2})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer pool.Close()
	if err := migrator.Run(ctx, pool, slowSet()); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// slowSet has a slow migration in the middle so that two processes starting together overlap,
// and a migration whose second application would be visible (a second row).
func slowSet() migrate.Set {
	return migrate.Set{Service: "slow", FS: fstest.MapFS{
		"0001_table.sql": {Data: []byte("CREATE TABLE runs (note text NOT NULL);")},
		"0002_sleep.sql": {Data: []byte("SELECT pg_sleep(0.5); INSERT INTO runs VALUES ('0002');")},
		"0003_more.sql":  {Data: []byte("INSERT INTO runs VALUES ('0003'); ALTER TABLE runs ADD COLUMN extra int;")},
	}}
}

func shopSet() fstest.MapFS {
	return fstest.MapFS{
		"0001_init.sql": {Data: []byte(`
			CREATE TABLE items (id text PRIMARY KEY, price int NOT NULL);
			CREATE INDEX items_price ON items (price);`)},
		"0002_seed.sql": {Data: []byte(`INSERT INTO items VALUES ('apple', 3), ('pear', 4);`)},
		"README.md":     {Data: []byte("not a migration")},
	}
}

func TestRunAppliesInOrderInOwnSchema(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	if err := migrator.Run(ctx, pool, migrate.Set{Service: "shop", FS: shopSet()}); err != nil {
		t.Fatal(err)
	}
	recs := status(t, pool)
	if got := versions(recs); got != "shop:1:init shop:2:seed" {
		t.Fatalf("applied = %q", got)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM shop.items").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("shop.items has %d rows, want 2", n)
	}
	var inPublic bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('public.items') IS NOT NULL").Scan(&inPublic); err != nil {
		t.Fatal(err)
	}
	if inPublic {
		t.Fatal("migration created its table in public, not in the service schema")
	}
}

func TestRunTwiceChangesNothing(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	set := migrate.Set{Service: "shop", FS: shopSet()}
	if err := migrator.Run(ctx, pool, set); err != nil {
		t.Fatal(err)
	}
	before, schemaBefore := status(t, pool), catalog(t, pool)
	if err := migrator.Run(ctx, pool, set); err != nil {
		t.Fatal(err)
	}
	after, schemaAfter := status(t, pool), catalog(t, pool)
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("bookkeeping changed:\n%v\n%v", before, after)
	}
	if schemaBefore != schemaAfter {
		t.Fatalf("schema changed:\n%s\n%s", schemaBefore, schemaAfter)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM shop.items").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("seed applied again: %d rows", n)
	}
}

func TestRunAppliesOnlyNewMigrations(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	fsys := shopSet()
	if err := migrator.Run(ctx, pool, migrate.Set{Service: "shop", FS: fsys}); err != nil {
		t.Fatal(err)
	}
	fsys["0003_stock.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE items ADD COLUMN stock int NOT NULL DEFAULT 0;")}
	if err := migrator.Run(ctx, pool, migrate.Set{Service: "shop", FS: fsys}); err != nil {
		t.Fatal(err)
	}
	if got := versions(status(t, pool)); got != "shop:1:init shop:2:seed shop:3:stock" {
		t.Fatalf("applied = %q", got)
	}
}

func TestRunRejectsChangedMigration(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	fsys := shopSet()
	if err := migrator.Run(ctx, pool, migrate.Set{Service: "shop", FS: fsys}); err != nil {
		t.Fatal(err)
	}
	fsys["0002_seed.sql"] = &fstest.MapFile{Data: []byte(`INSERT INTO items VALUES ('apple', 3);`)}
	fsys["0003_stock.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE items ADD COLUMN stock int;")}
	err := migrator.Run(ctx, pool, migrate.Set{Service: "shop", FS: fsys})
	if !errors.Is(err, migrator.ErrChecksumMismatch) || !strings.Contains(err.Error(), "0002_seed") {
		t.Fatalf("err = %v, want ErrChecksumMismatch naming 0002_seed", err)
	}
	if got := versions(status(t, pool)); got != "shop:1:init shop:2:seed" {
		t.Fatalf("applied = %q; nothing after the mismatch may run", got)
	}
}

func TestRunFailedMigrationIsRolledBack(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	fsys := fstest.MapFS{
		"0001_ok.sql":     {Data: []byte("CREATE TABLE a (id int);")},
		"0002_broken.sql": {Data: []byte("CREATE TABLE b (id int); SELEKT 1;")},
	}
	err := migrator.Run(ctx, pool, migrate.Set{Service: "svc", FS: fsys})
	if err == nil || !strings.Contains(err.Error(), "svc 0002_broken") {
		t.Fatalf("err = %v, want an error naming svc 0002_broken", err)
	}
	if got := versions(status(t, pool)); got != "svc:1:ok" {
		t.Fatalf("applied = %q", got)
	}
	var hasB bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('svc.b') IS NOT NULL").Scan(&hasB); err != nil {
		t.Fatal(err)
	}
	if hasB {
		t.Fatal("table b from the failed migration survived")
	}
}

func TestRunSeveralServices(t *testing.T) {
	pool := pgtest.New(t)
	one := fstest.MapFS{"0001_t.sql": {Data: []byte("CREATE TABLE t (id int);")}}
	two := fstest.MapFS{"0001_t.sql": {Data: []byte("CREATE TABLE t (name text);")}}
	err := migrator.Run(context.Background(), pool, migrate.Set{Service: "one", FS: one}, migrate.Set{Service: "two", FS: two})
	if err != nil {
		t.Fatal(err)
	}
	if got := versions(status(t, pool)); got != "one:1:t two:1:t" {
		t.Fatalf("applied = %q", got)
	}
	got, err := migrator.Status(context.Background(), pool, "two")
	if err != nil || len(got) != 1 || got[0].Service != "two" {
		t.Fatalf("Status(two) = %v, %v", got, err)
	}
}

func TestRunSetWithoutMigrations(t *testing.T) {
	pool := pgtest.New(t)
	empty := migrate.Set{Service: "empty", FS: fstest.MapFS{"README.md": {Data: []byte("no migrations yet")}}}
	if err := migrator.Run(context.Background(), pool, empty, migrate.Set{Service: "shop", FS: shopSet()}); err != nil {
		t.Fatal(err)
	}
	if got := versions(status(t, pool)); got != "shop:1:init shop:2:seed" {
		t.Fatalf("applied = %q", got)
	}
}

// TestRunRefusesAServiceTwice: a service given twice is refused before
// anything is applied.
func TestRunRefusesAServiceTwice(t *testing.T) {
	pool := pgtest.New(t)
	s := migrate.Set{Service: "svc", FS: fstest.MapFS{"0001_a.sql": {Data: []byte("SELECT 1;")}}}
	if err := migrator.Run(context.Background(), pool, s, s); !errors.Is(err, migrate.ErrInvalidSet) {
		t.Fatalf("err = %v", err)
	}
	if recs := status(t, pool); len(recs) != 0 {
		t.Fatalf("applied %v despite the invalid input", recs)
	}
}

// TestRunConcurrentProcesses starts two OS processes (this test binary, re-executed) that
// migrate the same fresh database at the same moment.
func TestRunConcurrentProcesses(t *testing.T) {
	pool, dsn := pgtest.NewURL(t)
	var wg sync.WaitGroup
	outs := make([]string, 2)
	errs := make([]error, 2)
	start := make(chan struct{})
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"="+dsn)
			<-start
			out, err := cmd.CombinedOutput()
			outs[i], errs[i] = string(out), err
		}()
	}
	close(start)
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil {
			t.Fatalf("process %d: %v\n%s", i, errs[i], outs[i])
		}
	}
	if got := versions(status(t, pool)); got != "slow:1:table slow:2:sleep slow:3:more" {
		t.Fatalf("applied = %q, want each version once", got)
	}
	var notes string
	if err := pool.QueryRow(context.Background(), "SELECT string_agg(note, ',' ORDER BY note) FROM slow.runs").Scan(&notes); err != nil {
		t.Fatal(err)
	}
	if notes != "0002,0003" {
		t.Fatalf("slow.runs = %q, want each data migration applied once", notes)
	}
	// Both processes saw the lock: whichever ran second found nothing to do. A third run in
	// this process must also be a no-op.
	if err := migrator.Run(context.Background(), pool, slowSet()); err != nil {
		t.Fatal(err)
	}
	if got := versions(status(t, pool)); got != "slow:1:table slow:2:sleep slow:3:more" {
		t.Fatalf("applied after a third run = %q", got)
	}
}

func status(t *testing.T, pool *pgxpool.Pool) []migrator.Record {
	t.Helper()
	recs, err := migrator.Status(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func versions(recs []migrator.Record) string {
	var parts []string
	for _, r := range recs {
		parts = append(parts, fmt.Sprintf("%s:%d:%s", r.Service, r.Version, r.Name))
	}
	return strings.Join(parts, " ")
}

// catalog describes the non-system tables, columns and indexes of the database.
func catalog(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	err := pool.QueryRow(context.Background(), `
		SELECT string_agg(x, E'\n' ORDER BY x) FROM (
			SELECT table_schema || '.' || table_name || '.' || column_name || ':' || data_type AS x
			FROM information_schema.columns WHERE table_schema NOT IN ('pg_catalog', 'information_schema')
			UNION ALL
			SELECT schemaname || '.' || indexname FROM pg_indexes WHERE schemaname NOT IN ('pg_catalog')
		) c`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
