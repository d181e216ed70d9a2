package postgres_test

import (
	"context"
	"io/fs"
	"testing"
	"testing/fstest"

	"github.com/mandate-dev/mandate/internal/storage/migrate"
	"github.com/mandate-dev/mandate/internal/storage/migrate/migrator"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/executor/postgres"
)

// TestAMigrationBelowTheNewestIsApplied: 0008 (the outbox index) was
// written while another migration, 0007, was still on its way. A
// database that already has 0008 applies a 0007 that arrives later (the
// migrator allows versions out of order), and one migrated from scratch
// applies both, in version order.
func TestAMigrationBelowTheNewestIsApplied(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.New(t, postgres.Migrations) // 0001…0006, 0008
	files := fstest.MapFS{}
	if err := fs.WalkDir(postgres.Migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(postgres.Migrations.FS, path)
		files[path] = &fstest.MapFile{Data: b}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, ok := files["0007_later.sql"]; ok {
		t.Skip("0007 exists now: nothing arrives out of order")
	}
	files["0007_later.sql"] = &fstest.MapFile{Data: []byte("CREATE TABLE later_marker (x int);")}
	later := migrate.Set{Service: postgres.Migrations.Service, FS: files}
	if err := migrator.Run(ctx, pool, later); err != nil {
		t.Fatalf("applying a 0007 after 0008: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = 'executor' AND indexname = 'audit_spool_invocation'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("0008's index: %d, %v", n, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM executor.later_marker`).Scan(&n); err != nil {
		t.Fatalf("the late 0007 was not applied: %v", err)
	}
	fresh := pgtest.New(t, later)
	if err := fresh.QueryRow(ctx, `SELECT count(*) FROM executor.later_marker`).Scan(&n); err != nil {
		t.Fatalf("a fresh database without 0007: %v", err)
	}
}
