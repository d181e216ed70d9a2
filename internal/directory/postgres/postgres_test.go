package postgres_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/directory/directorytest"
	"github.com/mandate-dev/mandate/internal/directory/postgres"
	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

var ctx = context.Background()

func TestConformance(t *testing.T) {
	directorytest.Run(t, func(t *testing.T) directory.Store {
		s := postgres.New(pgtest.New(t, postgres.Migrations), postgres.Options{})
		t.Cleanup(s.Close)
		return s
	})
}

// twoInstances returns two stores on the same database through separate pools, as two
// processes would have them.
func twoInstances(t *testing.T) (a, b *postgres.Store) {
	t.Helper()
	_, dsn := pgtest.NewURL(t, postgres.Migrations)
	open := func() *postgres.Store {
		pool, err := pg.Open(ctx, dsn, pg.Options{MaxConns: 4})
		if err != nil {
			t.Fatal(err)
		}
		s := postgres.New(pool, postgres.Options{ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
		t.Cleanup(func() { s.Close(); pool.Close() })
		return s
	}
	a, b = open(), open()
	if _, err := directory.Apply(ctx, a, []byte(directorytest.Seed)); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// invalidations returns a cache on s whose invalidations are reported on the channel. NewCache
// returns once the listener is in place, so every later commit is heard.
func invalidations(t *testing.T, s directory.Store) (*directory.Cache, <-chan string) {
	t.Helper()
	ch := make(chan string, 64)
	c := directory.NewCache(s, directory.CacheOptions{TTL: time.Hour, OnInvalidate: func(tenant string) { ch <- tenant }})
	t.Cleanup(c.Close)
	return c, ch
}

func waitFor(t *testing.T, ch <-chan string, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-ch:
			if got == want {
				return
			}
		case <-timeout:
			t.Fatalf("no invalidation for tenant %q within 10s", want)
		}
	}
}

func TestChangeThroughOtherInstanceReachesCache(t *testing.T) {
	a, b := twoInstances(t)
	cache, inv := invalidations(t, b)
	for _, p := range [][2]string{{"alice", ""}, {"alice", "support-bot"}, {"bob", "bob-bot"}} {
		for range 2 {
			if r, err := cache.Resolve(ctx, "acme", p[0], p[1]); err != nil || !r.Active {
				t.Fatalf("warming %v: %+v, %v", p, r, err)
			}
		}
	}
	hits := cache.Stats().Hits

	if err := directory.SetUserDisabled(ctx, a, "acme", "alice", true); err != nil {
		t.Fatal(err)
	}
	// The only wait is for the NOTIFY to cross from instance a to instance b; the TTL is an
	// hour and nothing is restarted.
	waitFor(t, inv, "acme")
	for _, agent := range []string{"", "support-bot"} {
		r, err := cache.Resolve(ctx, "acme", "alice", agent)
		if err != nil {
			t.Fatal(err)
		}
		if r.Active || r.Reason != directory.ReasonUserDisabled {
			t.Fatalf("alice/%q through the other instance's cache: active=%v reason=%q", agent, r.Active, r.Reason)
		}
	}
	if got := cache.Stats().Hits; got != hits {
		t.Fatalf("%d answers came from stale entries", got-hits)
	}
	// bob's entry was dropped too (per tenant), but is still correct.
	if r, err := cache.Resolve(ctx, "acme", "bob", "bob-bot"); err != nil || !r.Active {
		t.Fatalf("bob-bot: %+v, %v", r, err)
	}

	// A policy file applied through a it reaches b the same way.
	if _, err := directory.Apply(ctx, a, []byte(directorytest.Seed)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, inv, "acme")
	if r, err := cache.Resolve(ctx, "acme", "alice", "support-bot"); err != nil || !r.Active {
		t.Fatalf("support-bot after re-applying the seed: %+v, %v", r, err)
	}
}

func TestRolledBackUpdateIsNotAnnounced(t *testing.T) {
	a, b := twoInstances(t)
	_, inv := invalidations(t, b)
	boom := errors.New("boom")
	err := a.Update(ctx, func(tx directory.Tx) error {
		if err := tx.PutUser(ctx, directory.User{Tenant: "acme", ID: "zoe"}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if err := directory.SetUserDisabled(ctx, a, "globex", "alice", true); err != nil {
		t.Fatal(err)
	}
	// Notifications arrive in commit order: had the rolled-back change been announced, acme
	// would come first.
	select {
	case got := <-inv:
		if got != "globex" {
			t.Fatalf("first announcement is for %q, want globex", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no announcement")
	}
}

func TestListenerReconnects(t *testing.T) {
	a, b := twoInstances(t)
	cache, inv := invalidations(t, b)
	if _, err := cache.Resolve(ctx, "acme", "alice", ""); err != nil {
		t.Fatal(err)
	}

	admin, err := pgxpool.New(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var killed int
	err = admin.QueryRow(ctx, `
		SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		 WHERE application_name = $1 AND datname = $2`,
		postgres.ListenerApplicationName, b.Pool().Config().ConnConfig.Database).Scan(&killed)
	if err != nil || killed != 1 {
		t.Fatalf("terminated %d listeners (err %v), want 1", killed, err)
	}
	// Losing the connection drops everything; reconnecting does again.
	waitFor(t, inv, "")
	waitFor(t, inv, "")

	if err := directory.SetUserDisabled(ctx, a, "acme", "alice", true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, inv, "acme")
	r, err := cache.Resolve(ctx, "acme", "alice", "")
	if err != nil || r.Reason != directory.ReasonUserDisabled {
		t.Fatalf("after reconnect: %+v, %v", r, err)
	}
}

func TestListenerStopsWithLastWatcher(t *testing.T) {
	_, b := twoInstances(t)
	c1, _ := invalidations(t, b)
	c1.Close()
	// goleak in TestMain checks that no listener goroutine survives; here, the connection.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		err := b.Pool().QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()",
			postgres.ListenerApplicationName).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d listener connections remain after the last watcher left", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestReferencesStayInsideTenantInSQL(t *testing.T) {
	// Even bypassing the store, the schema refuses an agent of one tenant acting for a user of
	// another.
	a, _ := twoInstances(t)
	_, err := a.Pool().Exec(ctx, "INSERT INTO directory.agents (tenant_id, id, user_id) VALUES ('globex', 'x-bot', 'bob')")
	if pg.Classify(err) != pg.KindForeignKeyViolation {
		t.Fatalf("err = %v, want a foreign-key violation", err)
	}
	_, err = a.Pool().Exec(ctx, "INSERT INTO directory.user_roles (tenant_id, user_id, role) VALUES ('globex', 'alice', 'lead')")
	if pg.Classify(err) != pg.KindForeignKeyViolation {
		t.Fatalf("err = %v, want a foreign-key violation", err)
	}
}

// TestLimitsColumn: a tenant's limit overrides are stored as the JSON
// object migration 0004 documents — the window a Go duration string, a
// field the override leaves to the manifest omitted — and such an object
// written by hand reads back; anything else is refused by the column.
func TestLimitsColumn(t *testing.T) {
	s := postgres.New(pgtest.New(t, postgres.Migrations), postgres.Options{})
	t.Cleanup(s.Close)
	src := "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds: {max: 10000, window: 12h}\n      ticket.refund/tenant-hourly: {window: 90m}\n  - id: globex\n"
	if _, err := directory.Apply(ctx, s, []byte(src)); err != nil {
		t.Fatal(err)
	}
	for tenant, want := range map[string]string{
		"acme":   `{"ticket.refund/agent-daily-refunds": {"max": 10000, "window": "12h0m0s"}, "ticket.refund/tenant-hourly": {"window": "1h30m0s"}}`,
		"globex": `{}`,
	} {
		var same bool
		if err := s.Pool().QueryRow(ctx, "SELECT limits = $2::jsonb FROM directory.tenants WHERE id = $1", tenant, want).Scan(&same); err != nil || !same {
			var got string
			_ = s.Pool().QueryRow(ctx, "SELECT limits::text FROM directory.tenants WHERE id = $1", tenant).Scan(&got)
			t.Errorf("%s: limits column %s, want %s (err %v)", tenant, got, want, err)
		}
	}

	if _, err := s.Pool().Exec(ctx, `UPDATE directory.tenants SET limits = '{"a.b/c": {"window": "24h"}, "d.e/f": {"max": 3}}' WHERE id = 'globex'`); err != nil {
		t.Fatal(err)
	}
	want := map[string]directory.LimitOverride{"a.b/c": {Window: 24 * time.Hour}, "d.e/f": {Max: 3}}
	if f, err := s.Lookup(ctx, "globex", "nobody", ""); err != nil || !reflect.DeepEqual(f.Limits, want) {
		t.Errorf("hand-written limits read back as %v (err %v), want %v", f.Limits, err, want)
	}

	if _, err := s.Pool().Exec(ctx, `UPDATE directory.tenants SET limits = '[]' WHERE id = 'globex'`); err == nil {
		t.Error("the limits column took a JSON array")
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE directory.tenants SET limits = '{"a.b/c": {"window": "a day"}}' WHERE id = 'globex'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, "globex", "nobody", ""); err == nil || !strings.Contains(err.Error(), "a day") {
		t.Errorf("a corrupt window: err = %v, want one naming it", err)
	}
}
