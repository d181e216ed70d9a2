// Package migrator applies the migrations that the services declare as migrate.Set with goose
// (github.com/pressly/goose/v3): `mandate migrate` runs it, and so do the tests' databases
// (internal/storage/pgtest). Each service has its own goose version table,
// public.goose_<service>, which also records every applied file's name and SHA-256 checksum:
// [Run] skips what is recorded, refuses to continue when an applied file has changed (goose has
// no such guard), and holds goose's session advisory lock so that several processes starting at
// once apply every migration exactly once.
//
// Databases migrated by the hand-written runner that came before goose recorded their versions in
// public.mandate_migrations; when goose first creates a service's version table it carries that
// service's records over, so such databases upgrade without re-applying anything.
package migrator
