package pgtest_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/storage/migrate"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

var set = migrate.Set{Service: "demo", FS: fstest.MapFS{
	"0001_init.sql": {Data: []byte("CREATE TABLE notes (id int PRIMARY KEY);")},
}}

func TestNewGivesFreshMigratedDatabases(t *testing.T) {
	ctx := context.Background()
	a, b := pgtest.New(t, set), pgtest.New(t, set)
	if _, err := a.Exec(ctx, "INSERT INTO demo.notes VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM demo.notes").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("second database sees %d rows written to the first", n)
	}
	if a.Config().ConnConfig.Database == b.Config().ConnConfig.Database {
		t.Fatal("both pools point at the same database")
	}
}

func TestDatabaseDroppedAfterTest(t *testing.T) {
	var name string
	t.Run("inner", func(t *testing.T) {
		pool := pgtest.New(t, set)
		name = pool.Config().ConnConfig.Database
	})
	if exists(t, name) {
		t.Fatalf("database %s still exists after its test ended", name)
	}
}

func TestTemplatesDroppedByCleanup(t *testing.T) {
	other := migrate.Set{Service: "other", FS: fstest.MapFS{"0001_x.sql": {Data: []byte("CREATE TABLE x (id int);")}}}
	pgtest.New(t, other)
	if n := countTemplates(t); n == 0 {
		t.Fatal("no template database found")
	}
	pgtest.Cleanup()
	if n := countTemplates(t); n != 0 {
		t.Fatalf("%d template databases left after Cleanup", n)
	}
}

// TestNoServer re-runs this test binary against an address where nothing listens.
func TestNoServer(t *testing.T) {
	if os.Getenv("PGTEST_CHILD") == "1" {
		pgtest.New(t)
		t.Fatal("New returned without a server")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	run := func(require string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestNoServer$", "-test.v")
		cmd.Env = append(os.Environ(), "PGTEST_CHILD=1",
			pgtest.EnvURL+"=postgres://postgres:pw@"+addr+"/postgres?sslmode=disable",
			pgtest.EnvRequire+"="+require)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Run("skips", func(t *testing.T) {
		out, err := run("")
		if err != nil || !strings.Contains(out, "--- SKIP: TestNoServer") || !strings.Contains(out, "no PostgreSQL server answers") {
			t.Fatalf("err = %v, output:\n%s", err, out)
		}
		if strings.Contains(out, ":pw@") {
			t.Fatalf("skip message shows the password:\n%s", out)
		}
	})
	t.Run("fails when required", func(t *testing.T) {
		out, err := run("1")
		if err == nil || !strings.Contains(out, "--- FAIL: TestNoServer") || !strings.Contains(out, "MANDATE_REQUIRE_POSTGRES=1") {
			t.Fatalf("err = %v, output:\n%s", err, out)
		}
	})
}

func exists(t *testing.T, name string) bool {
	t.Helper()
	var ok bool
	query(t, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name, &ok)
	return ok
}

func countTemplates(t *testing.T) int {
	t.Helper()
	// Only the templates of this process matter; other test binaries may run in parallel, so
	// count those whose database holds the "other" schema.
	ctx := context.Background()
	c, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(ctx) }()
	rows, err := c.Query(ctx, "SELECT datname FROM pg_database WHERE datname LIKE 'mandate_tmpl_%'")
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, name := range names {
		cfg := c.Config().Copy()
		cfg.Database = name
		dc, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			continue // dropped meanwhile
		}
		var has bool
		_ = dc.QueryRow(ctx, "SELECT to_regclass('other.x') IS NOT NULL").Scan(&has)
		_ = dc.Close(ctx)
		if has {
			n++
		}
	}
	return n
}

func query(t *testing.T, sql string, arg any, dst any) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(ctx) }()
	if err := c.QueryRow(ctx, sql, arg).Scan(dst); err != nil {
		t.Fatal(err)
	}
}
