package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/internal/storage/migrate"
	"github.com/mandate-dev/mandate/internal/storage/migrate/migrator"
	"github.com/mandate-dev/mandate/internal/storage/pg"
)

// Environment variables read by the harness.
const (
	// EnvURL names the admin connection string; the role must be allowed to create databases.
	EnvURL = "MANDATE_TEST_DATABASE_URL"
	// EnvRequire, set to 1, turns "no server" from a skip into a failure (CI sets it).
	EnvRequire = "MANDATE_REQUIRE_POSTGRES"
	// DefaultURL is used when EnvURL is unset.
	DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
)

// URL returns the admin connection string the harness uses.
func URL() string {
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	return DefaultURL
}

type template struct {
	once sync.Once
	name string
	err  error
}

var (
	mu        sync.Mutex
	templates = map[string]*template{} // by migration-set key

	probeOnce sync.Once
	errProbe  error
)

// New returns a pool on a new, empty-but-migrated database: sets are applied once per test
// binary to a template database and every call clones it with CREATE DATABASE ... TEMPLATE. The
// pool is closed and the database dropped in t.Cleanup.
func New(t testing.TB, sets ...migrate.Set) *pgxpool.Pool {
	t.Helper()
	pool, _ := newDB(t, sets)
	return pool
}

// NewURL is like [New] but also returns the connection string of the new database, for tests
// that open their own pools or hand the database to another process.
func NewURL(t testing.TB, sets ...migrate.Set) (*pgxpool.Pool, string) {
	t.Helper()
	return newDB(t, sets)
}

func newDB(t testing.TB, sets []migrate.Set) (*pgxpool.Pool, string) {
	t.Helper()
	requireServer(t)
	ctx := context.Background()

	tmpl, err := templateFor(ctx, sets)
	if err != nil {
		t.Fatalf("pgtest: preparing template database: %v", err)
	}
	name := "mandate_test_" + randomSuffix()
	if err := withAdmin(ctx, func(c *pgx.Conn) error {
		return createDatabase(ctx, c, name, tmpl)
	}); err != nil {
		t.Fatalf("pgtest: creating database %s: %v", name, err)
	}
	dsn := dsnFor(name)
	pool, err := pg.Open(ctx, dsn, pg.Options{MaxConns: 8, ApplicationName: "mandate-test"})
	if err != nil {
		_ = dropDatabase(name)
		t.Fatalf("pgtest: connecting to %s: %v", name, err)
	}
	t.Cleanup(func() {
		pool.Close()
		if err := dropDatabase(name); err != nil {
			t.Errorf("pgtest: dropping database %s: %v", name, err)
		}
	})
	return pool, dsn
}

// Available reports whether tests get a database: a server answers at
// URL(), or EnvRequire is set (and New fails without one). Suites that can
// also run on in-memory stores use them when it is false, rather than skip.
func Available() bool {
	return probe() == nil || os.Getenv(EnvRequire) == "1"
}

// probe pings the server once per test binary.
func probe() error {
	probeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		errProbe = withAdmin(ctx, func(c *pgx.Conn) error { return c.Ping(ctx) })
	})
	return errProbe
}

func requireServer(t testing.TB) {
	t.Helper()
	if probe() == nil {
		return
	}
	msg := fmt.Sprintf("pgtest: no PostgreSQL server answers at %s (%v); start one or point %s at it",
		redact(URL()), errProbe, EnvURL)
	if os.Getenv(EnvRequire) == "1" {
		t.Fatalf("%s (%s=1, so this is a failure)", msg, EnvRequire)
	}
	t.Skipf("%s; set %s=1 to fail instead of skipping", msg, EnvRequire)
}

func templateFor(ctx context.Context, sets []migrate.Set) (string, error) {
	key, err := setsKey(sets)
	if err != nil {
		return "", err
	}
	mu.Lock()
	tm, ok := templates[key]
	if !ok {
		tm = &template{}
		templates[key] = tm
	}
	mu.Unlock()

	tm.once.Do(func() {
		name := "mandate_tmpl_" + randomSuffix()
		if err := withAdmin(ctx, func(c *pgx.Conn) error { return createDatabase(ctx, c, name, "template0") }); err != nil {
			tm.err = err
			return
		}
		tm.name = name // recorded before migrating so that Main drops it even if migrating fails
		pool, err := pg.Open(ctx, dsnFor(name), pg.Options{MaxConns: 2, ApplicationName: "mandate-test-template"})
		if err != nil {
			tm.err = err
			return
		}
		// The template must have no sessions when it is cloned, so the pool is closed here.
		defer pool.Close()
		tm.err = migrator.Run(ctx, pool, sets...)
	})
	return tm.name, tm.err
}

// setsKey identifies a list of sets by service names and file checksums, so that packages
// using different sets get different templates.
func setsKey(sets []migrate.Set) (string, error) {
	var b strings.Builder
	for _, s := range sets {
		migs, err := s.Load()
		if err != nil {
			return "", err
		}
		b.WriteString(s.Service)
		for _, m := range migs {
			fmt.Fprintf(&b, ":%d=%s", m.Version, m.Checksum)
		}
		b.WriteByte(';')
	}
	return b.String(), nil
}

func createDatabase(ctx context.Context, c *pgx.Conn, name, tmpl string) error {
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{tmpl}.Sanitize()
	var err error
	for range 50 {
		if _, err = c.Exec(ctx, sql); err == nil {
			return nil
		}
		// 55006 object_in_use: another session is still connected to the template (for
		// example a clone in flight in a parallel test); it goes away quickly.
		if !hasCode(err, "55006") {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

func dropDatabase(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return withAdmin(ctx, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		return err
	})
}

func withAdmin(ctx context.Context, fn func(*pgx.Conn) error) error {
	cfg, err := pgx.ParseConfig(URL())
	if err != nil {
		return fmt.Errorf("parsing %s: %w", EnvURL, err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 3 * time.Second
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
	return fn(c)
}

// dsnFor returns the admin URL with the database replaced by name.
func dsnFor(name string) string {
	raw := URL()
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		// Keyword/value form: a later dbname wins.
		return raw + " dbname=" + name
	}
	u.Path = "/" + name
	return u.String()
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

func randomSuffix() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func hasCode(err error, code string) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == code
}

// Cleanup drops the template databases this process created. [Main] and [M] call it; call it
// yourself only from a custom TestMain.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	for key, tm := range templates {
		if tm.name != "" {
			_ = dropDatabase(tm.name)
		}
		delete(templates, key)
	}
}

// M wraps m so that running it also drops the template databases afterwards. It composes with
// other TestMain helpers, e.g. goleak.VerifyTestMain(pgtest.M(m)).
func M(m *testing.M) interface{ Run() int } { return wrappedM{m} }

type wrappedM struct{ m *testing.M }

func (w wrappedM) Run() int {
	defer Cleanup()
	return w.m.Run()
}

// Main runs the tests and drops the template databases; use it as the whole TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M) {
	os.Exit(M(m).Run())
}
