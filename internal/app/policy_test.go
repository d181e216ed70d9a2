package app

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/examples/policy"
	"github.com/mandate-dev/mandate/internal/compile"
	"github.com/mandate-dev/mandate/internal/compile/compiletest"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// policyRun runs `mandate policy apply` on a memory directory; opened
// reports whether the command opened it.
func policyRun(t *testing.T, store directory.Store, args ...string) (stdout, stderr string, opened bool, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	open := func(context.Context, config.Secret) (directory.Store, func(), error) {
		opened = true
		return store, func() {}, nil
	}
	env := func(string) (string, bool) { return "", false }
	args = append([]string{"apply", "--database-url", "postgres://unused.invalid/mandate"}, args...)
	err = policyApply(context.Background(), args, IO{Stdout: &out, Stderr: &errOut, Env: env}, open)
	return out.String(), errOut.String(), opened, err
}

func writePolicy(t *testing.T, src string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// directoryState is every tenant of the demo and of the test files.
func directoryState(t *testing.T, s directory.Store) map[string]directory.Snapshot {
	t.Helper()
	out := map[string]directory.Snapshot{}
	err := s.Update(context.Background(), func(tx directory.Tx) error {
		for _, id := range []string{"acme", "globex", "initech"} {
			if snap, err := tx.Snapshot(context.Background(), id); err == nil {
				out[id] = snap
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func seededStore(t *testing.T) *memory.Store {
	t.Helper()
	s := memory.New()
	if _, err := directory.Apply(context.Background(), s, policy.Demo); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPolicyApplyChecksTheManifest: a file that does not fit the sample
// manifest is refused before the directory is opened, and a warning only
// refuses with --strict.
func TestPolicyApplyChecksTheManifest(t *testing.T) {
	cases := []struct {
		name        string
		file        string
		flags       []string
		wantRefused bool
		wantStderr  []string
	}{
		{"an erase nobody may approve", `
tenants:
  - id: initech
    roles: {finance: [customer.erase]}
    users: [{id: carol, roles: [finance]}]
`, nil, true, []string{`error: tenant "initech": customer.erase is approved by a holder of "privacy.approve" and no enabled user holds it`}},
		{"the only approver is the requester", `
tenants:
  - id: initech
    roles: {finance: [customer.erase, privacy.approve]}
    users: [{id: carol, roles: [finance]}]
`, nil, true, []string{"only carol holds it"}},
		{"a mistyped permission warns", `
tenants:
  - id: initech
    roles: {support: [ticket.raed]}
`, nil, false, []string{`warning: tenant "initech": role "support" grants "ticket.raed"`, `did you mean "ticket.read"?`}},
		{"a mistyped permission is refused with --strict", `
tenants:
  - id: initech
    roles: {support: [ticket.raed]}
`, []string{"--strict"}, true, []string{`warning: tenant "initech": role "support" grants "ticket.raed"`}},
		{"a feature no command requires warns", `
tenants:
  - id: initech
    features: [refundz]
`, nil, false, []string{`feature "refundz" is required by no command (did you mean "refunds"?)`}},
		{"a platform permission is known", `
tenants:
  - id: initech
    roles: {auditor: [audit.read]}
`, nil, false, nil},
		{"a limit override of a declared limit", `
tenants:
  - id: initech
    limits:
      ticket.refund/agent-daily-refunds: {max: 10000, window: 12h}
`, nil, false, nil},
		{"a limit override of a command the manifest lacks", `
tenants:
  - id: initech
    limits:
      ticket.refnd/agent-daily-refunds: {max: 10000}
`, nil, true, []string{`error: tenant "initech": limit override "ticket.refnd/agent-daily-refunds" overrides nothing: no command ticket.refnd is in the manifest (did you mean "ticket.refund/agent-daily-refunds"?)`}},
		{"a limit override of a limit the command does not declare", `
tenants:
  - id: initech
    limits:
      ticket.refund/daily-refunds: {window: 1h}
`, nil, true, []string{`error: tenant "initech": limit override "ticket.refund/daily-refunds" overrides nothing: ticket.refund declares no limit "daily-refunds" (it declares agent-daily-refunds)`, `did you mean "ticket.refund/agent-daily-refunds"?`}},
		{"a limit override of a command that declares none", `
tenants:
  - id: initech
    limits:
      ticket.get/agent-daily-refunds: {max: 1}
`, nil, true, []string{`"ticket.get/agent-daily-refunds" overrides nothing: ticket.get declares no limits`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			store := seededStore(t)
			before := directoryState(t, store)
			path := writePolicy(t, tc.file)
			stdout, stderr, opened, err := policyRun(t, store, append([]string{"-f", path}, tc.flags...)...)
			for _, want := range tc.wantStderr {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr does not say %q:\n%s", want, stderr)
				}
			}
			if !tc.wantRefused {
				if err != nil || !strings.Contains(stdout, "applied "+path) {
					t.Fatalf("err %v, stdout %q; want the file applied", err, stdout)
				}
				if _, ok := directoryState(t, store)["initech"]; !ok {
					t.Error("the applied file did not create its tenant")
				}
				if tc.wantStderr == nil && stderr != "" {
					t.Errorf("unexpected findings: %s", stderr)
				}
				return
			}
			if !errors.Is(err, errPolicyRefused) || !strings.Contains(err.Error(), "the embedded helpdesk sample manifest") {
				t.Fatalf("err = %v, want a refusal naming the sample manifest", err)
			}
			if opened {
				t.Error("a refused file opened the directory")
			}
			if after := directoryState(t, store); !reflect.DeepEqual(before, after) {
				t.Error("a refused file changed the directory")
			}
		})
	}
}

// TestPolicyApplyLimitOverrides: a tenant's override of the sample's
// refund budget is applied, reaches the resolution of its principals, is
// no change the second time, and a dry run names the tenant it changes.
func TestPolicyApplyLimitOverrides(t *testing.T) {
	store := seededStore(t)
	src := strings.Replace(string(policy.Demo), "    trust_ceiling: L3\n",
		"    trust_ceiling: L3\n    limits:\n      ticket.refund/agent-daily-refunds: {max: 10000, window: 12h}\n", 1)
	if src == string(policy.Demo) {
		t.Fatal("the demo policy has no trust_ceiling line to add limits after")
	}
	path := writePolicy(t, src)
	stdout, stderr, _, err := policyRun(t, store, "-f", path, "--dry-run")
	if err != nil || stderr != "" || !strings.Contains(stdout, "would change tenant acme\n") || strings.Count(stdout, "would ") != 1 {
		t.Fatalf("dry run: %v, stdout %q, stderr %q", err, stdout, stderr)
	}
	stdout, _, _, err = policyRun(t, store, "-f", path)
	if err != nil || !strings.Contains(stdout, "tenants +0 ~1 -0, roles +0 ~0 -0, users +0 ~0 -0, agents +0 ~0 -0") {
		t.Fatalf("apply: %v, %q", err, stdout)
	}
	want := map[string]directory.LimitOverride{"ticket.refund/agent-daily-refunds": {Max: 10000, Window: 12 * time.Hour}}
	if got := directoryState(t, store)["acme"].Tenant.Limits; !reflect.DeepEqual(got, want) {
		t.Errorf("acme's limits %v, want %v", got, want)
	}
	res, err := directory.Resolve(context.Background(), store, "acme", "carol", "finance-bot")
	if err != nil || !res.Active || !reflect.DeepEqual(res.Limits, want) {
		t.Errorf("carol/finance-bot resolves %+v (%v), want limits %v", res, err, want)
	}
	if got := directoryState(t, store)["globex"].Tenant.Limits; got != nil {
		t.Errorf("globex's limits %v, want none", got)
	}
	stdout, _, _, err = policyRun(t, store, "-f", path)
	if err != nil || !strings.Contains(stdout, "tenants +0 ~0 -0, roles +0 ~0 -0, users +0 ~0 -0, agents +0 ~0 -0") {
		t.Fatalf("applying it again: %v, %q", err, stdout)
	}
}

// TestPolicyApplyRefusalExitCode: through Run, a refusal exits non-zero
// and names the finding, with no database to reach.
func TestPolicyApplyRefusalExitCode(t *testing.T) {
	path := writePolicy(t, "tenants:\n  - id: initech\n    roles: {finance: [customer.erase]}\n    users: [{id: carol, roles: [finance]}]\n")
	code, _, stderr := run(t, map[string]string{"MANDATE_DATABASE_URL": "postgres://127.0.0.1:1/nowhere?connect_timeout=1"},
		"policy", "apply", "-f", path)
	if code == 0 || !strings.Contains(stderr, "customer.erase") || !strings.Contains(stderr, "nothing was changed") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
}

// TestPolicyApplyUsesTheGivenManifest: with --manifest, the file is
// checked against the deployment's commands, not the sample's.
func TestPolicyApplyUsesTheGivenManifest(t *testing.T) {
	dir := compiletest.Testdata(t)
	out, err := compile.Compile(compiletest.Protos(t, dir, "clean.proto"), []string{"clean.proto"})
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	mpath, dpath := filepath.Join(tmp, "manifest.json"), filepath.Join(tmp, "descriptors.binpb")
	if err := os.WriteFile(mpath, out.Manifest, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dpath, out.DescriptorSet, 0o600); err != nil {
		t.Fatal(err)
	}
	// The fixture's ledger.books.close (L4) is approved by a holder of
	// ledger.approve, whom this file does not have.
	path := writePolicy(t, "tenants:\n  - id: initech\n    roles: {closer: [ledger.close]}\n    users: [{id: erin, roles: [closer]}]\n")
	store := memory.New()
	_, stderr, opened, err := policyRun(t, store, "-f", path, "--manifest", mpath, "--descriptors", dpath)
	if !errors.Is(err, errPolicyRefused) || !strings.Contains(err.Error(), mpath) || opened {
		t.Fatalf("err = %v (opened %v), want a refusal against %s", err, opened, mpath)
	}
	if !strings.Contains(stderr, `ledger.books.close is approved by a holder of "ledger.approve"`) {
		t.Errorf("stderr:\n%s", stderr)
	}
	// Against the sample the same file only warns: ledger.close is unknown there.
	_, stderr, _, err = policyRun(t, memory.New(), "-f", path)
	if err != nil || !strings.Contains(stderr, `warning: tenant "initech": role "closer" grants "ledger.close"`) {
		t.Fatalf("against the sample: err %v, stderr:\n%s", err, stderr)
	}
}

// TestPolicyApplyDryRun: --dry-run lists what the file would add, change
// and remove, and writes nothing; applying it then does exactly that.
func TestPolicyApplyDryRun(t *testing.T) {
	store := seededStore(t)
	before := directoryState(t, store)
	// The demo with bob gone, a new agent for alice, globex's role widened
	// and a new tenant.
	src := strings.Replace(string(policy.Demo), "      - {id: bob, org: support, roles: [manager]}\n", "", 1)
	src = strings.Replace(src, "      - {id: payout-bot, user: carol}\n", "      - {id: payout-bot, user: carol}\n      - {id: triage-bot, user: alice}\n", 1)
	src = strings.Replace(src, "      support: [ticket.read, payment.refund]\n", "      support: [ticket.read, payment.refund, expense.report.submit]\n", 1)
	src += "  - id: initech\n    roles: {support: [ticket.read]}\n"
	path := writePolicy(t, src)

	stdout, stderr, _, err := policyRun(t, store, "-f", path, "--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, stderr)
	}
	wantLines := []string{
		"would remove user acme/bob",
		"would add agent acme/triage-bot",
		"would change role globex/support",
		"would add tenant initech",
		"would add role initech/support",
		"tenants +1 ~0 -0, roles +1 ~1 -0, users +0 ~0 -1, agents +1 ~0 -0; nothing was changed",
	}
	for _, want := range wantLines {
		if !strings.Contains(stdout, want) {
			t.Errorf("dry run does not say %q:\n%s", want, stdout)
		}
	}
	if n := strings.Count(stdout, "would "); n != 5 {
		t.Errorf("dry run lists %d changes, want 5:\n%s", n, stdout)
	}
	if after := directoryState(t, store); !reflect.DeepEqual(before, after) {
		t.Fatal("--dry-run changed the directory")
	}

	stdout, _, _, err = policyRun(t, store, "-f", path)
	if err != nil || !strings.Contains(stdout, "tenants +1 ~0 -0, roles +1 ~1 -0, users +0 ~0 -1, agents +1 ~0 -0") {
		t.Fatalf("apply after the dry run: %v, %q", err, stdout)
	}
	stdout, _, _, err = policyRun(t, store, "-f", path, "--dry-run")
	if err != nil || strings.Contains(stdout, "would ") || !strings.Contains(stdout, "tenants +0 ~0 -0, roles +0 ~0 -0, users +0 ~0 -0, agents +0 ~0 -0") {
		t.Fatalf("dry run after applying: %v, %q", err, stdout)
	}
}

// TestDemoPolicyFitsTheSample: the demo directory `mandate dev` seeds has
// nothing to warn about against the sample manifest it governs, with the
// permissions Mandate's own services check (platformPermissions, which
// mandate policy apply passes too).
func TestDemoPolicyFitsTheSample(t *testing.T) {
	m, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	pol, err := directory.ParsePolicy("demo.yaml", policy.Demo)
	if err != nil {
		t.Fatal(err)
	}
	if got := directory.CheckPolicy(pol, m.Commands(), platformPermissions); len(got) != 0 {
		t.Errorf("demo.yaml against the sample: %q", got)
	}
}
