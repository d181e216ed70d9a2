package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/directory"
	dirpg "github.com/mandate-dev/mandate/internal/directory/postgres"
	"github.com/mandate-dev/mandate/internal/storage/migrate/migrator"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

// buildMandate compiles the binary once per test run.
func buildMandate(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mandate")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func mandate(t *testing.T, bin, dbURL string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "MANDATE_DATABASE_URL="+dbURL)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestMigrateAndPolicyApply runs the real binary against a fresh, empty
// database: migrate twice and then from two processes at once, then apply
// the demo policy twice, then a malformed policy.
func TestMigrateAndPolicyApply(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	pool, url := pgtest.NewURL(t) // empty: no migrations applied
	bin := buildMandate(t)
	ctx := context.Background()

	for i := range 2 {
		if out, err := mandate(t, bin, url, "migrate"); err != nil || !strings.Contains(out, "migrations up to date") {
			t.Fatalf("migrate #%d: %v\n%s", i+1, err, out)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	outs := make([]string, 2)
	for i := range 2 {
		wg.Go(func() { outs[i], errs[i] = mandate(t, bin, url, "migrate") })
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil {
			t.Fatalf("concurrent migrate %d: %v\n%s", i, errs[i], outs[i])
		}
	}
	recs, err := migrator.Status(ctx, pool, dirpg.Migrations.Service)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range recs {
		seen[r.Service+"/"+r.Name]++
	}
	if len(recs) == 0 {
		t.Fatal("no migrations recorded")
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s recorded %d times", k, n)
		}
	}

	policy := filepath.Join("..", "..", "examples", "policy", "demo.yaml")
	out, err := mandate(t, bin, url, "policy", "apply", "-f", policy)
	if err != nil || !strings.Contains(out, "users +") {
		t.Fatalf("policy apply: %v\n%s", err, out)
	}
	out, err = mandate(t, bin, url, "policy", "apply", "-f", policy)
	if err != nil || !strings.Contains(out, "tenants +0 ~0 -0, roles +0 ~0 -0, users +0 ~0 -0, agents +0 ~0 -0") {
		t.Fatalf("second apply changed something: %v\n%s", err, out)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("tenants:\n  - id: acme\n    features: [refunds]\n    rolez: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = mandate(t, bin, url, "policy", "apply", "-f", bad)
	if err == nil || !strings.Contains(out, "bad.yaml:4") || !strings.Contains(out, "nothing was changed") {
		t.Fatalf("malformed policy: %v\n%s", err, out)
	}
	store := dirpg.New(pool, dirpg.Options{})
	defer store.Close()
	res, err := directory.Resolve(ctx, store, "acme", "support-bot-is-not-a-user", "")
	if err != nil {
		t.Fatal(err)
	}
	if res.Active {
		t.Fatal("unknown user resolved active")
	}
	alice, err := directory.Resolve(ctx, store, "acme", "alice", "support-bot")
	if err != nil || !alice.Active || !alice.HasPermission("ticket.read") || alice.HasPermission("payment.refund") || !alice.HasFeature("refunds") {
		t.Fatalf("support-bot@alice after the malformed apply: %+v, %v", alice, err)
	}
}
