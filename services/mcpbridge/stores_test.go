package mcpbridge_test

import (
	"testing"

	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	dirpg "github.com/mandate-dev/mandate/internal/directory/postgres"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/audit"
	auditmem "github.com/mandate-dev/mandate/services/audit/memory"
	auditpg "github.com/mandate-dev/mandate/services/audit/postgres"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmmem "github.com/mandate-dev/mandate/services/confirm/memory"
	confirmpg "github.com/mandate-dev/mandate/services/confirm/postgres"
	"github.com/mandate-dev/mandate/services/executor"
	execmem "github.com/mandate-dev/mandate/services/executor/memory"
	execpg "github.com/mandate-dev/mandate/services/executor/postgres"
)

// stores hold the data of a test's services: on a fresh Postgres database
// when a server answers (pgtest.Available), else in memory, as mandate dev
// keeps them, so that the suite runs the whole pipeline on a machine
// without Postgres too. Each is closed when the test ends.
type stores struct {
	dir     directory.Store
	audit   audit.Store
	exec    executor.Store
	confirm confirm.Store
}

func newStores(t testing.TB) stores {
	t.Helper()
	if !pgtest.Available() {
		dir, au, cf := dirmem.New(), auditmem.New(auditmem.Options{}), confirmmem.New(confirmmem.Options{})
		t.Cleanup(func() {
			cf.Close()
			au.Close()
		})
		return stores{dir: dir, audit: au, exec: execmem.New(execmem.Options{}), confirm: cf}
	}
	pool := pgtest.New(t, dirpg.Migrations, auditpg.Migrations, execpg.Migrations, confirmpg.Migrations)
	dir, au, cf := dirpg.New(pool, dirpg.Options{}), auditpg.New(pool, auditpg.Options{}), confirmpg.New(pool, confirmpg.Options{})
	t.Cleanup(func() {
		cf.Close()
		au.Close()
		dir.Close()
	})
	return stores{dir: dir, audit: au, exec: execpg.New(pool, execpg.Options{}), confirm: cf}
}
