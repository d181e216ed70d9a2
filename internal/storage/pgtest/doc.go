// Package pgtest is the Postgres harness for tests. [New] hands each test a fresh database,
// cloned from a template database that is migrated once per test binary, and drops it when the
// test ends; [Main] (or [M]) in TestMain drops the templates when the binary exits. The server is
// taken from MANDATE_TEST_DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable). When no server answers, tests
// skip with a message saying so, unless MANDATE_REQUIRE_POSTGRES=1, in which case they fail.
package pgtest
