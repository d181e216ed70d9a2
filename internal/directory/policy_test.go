package directory_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/directory/directorytest"
	"github.com/mandate-dev/mandate/internal/limit"
	"github.com/mandate-dev/mandate/internal/manifest"
)

func TestParsePolicy(t *testing.T) {
	src := `
version: 1
tenants:
  - id: acme
    display_name: Acme
    features: [refunds, expenses]
    roles:
      support: &perms [ticket.read, expense.report.submit]
      backup: *perms
    users:
      - id: alice
        org: support
        roles: [support, backup]
      - {id: 1234, disabled: true}
    agents:
      - {id: support-bot, user: alice}
`
	pol, err := directory.ParsePolicy("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := directory.Policy{Tenants: []directory.Snapshot{{
		Tenant: directory.Tenant{ID: "acme", DisplayName: "Acme", Features: []string{"expenses", "refunds"}},
		Roles: []directory.Role{
			{Tenant: "acme", Name: "backup", Permissions: []string{"expense.report.submit", "ticket.read"}},
			{Tenant: "acme", Name: "support", Permissions: []string{"expense.report.submit", "ticket.read"}},
		},
		Users: []directory.User{
			{Tenant: "acme", ID: "1234", Disabled: true},
			{Tenant: "acme", ID: "alice", Org: "support", Roles: []string{"backup", "support"}},
		},
		Agents: []directory.Agent{{Tenant: "acme", ID: "support-bot", UserID: "alice", Host: directory.HostHeadless}},
	}}}
	if !reflect.DeepEqual(pol, want) {
		t.Fatalf("got  %+v\nwant %+v", pol, want)
	}
}

// TestParsePolicyLimits: a tenant's limit overrides, each setting max,
// window or both, parse into Tenant.Limits keyed "<code>/<id>"; a tenant
// without any has nil Limits.
func TestParsePolicyLimits(t *testing.T) {
	src := `
tenants:
  - id: acme
    limits:
      ticket.refund/agent-daily-refunds:
        max: 10000
        window: 12h
      ticket.refund/tenant-hourly-refunds: {max: 0x20}
      expense.report.submit/per-user-rate: &w {window: 86400s}
      customer.erase/weekly: *w
  - id: globex
    limits: {}
  - id: initech
`
	pol, err := directory.ParsePolicy("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]directory.LimitOverride{
		"ticket.refund/agent-daily-refunds":   {Max: 10000, Window: 12 * time.Hour},
		"ticket.refund/tenant-hourly-refunds": {Max: 32},
		"expense.report.submit/per-user-rate": {Window: 24 * time.Hour},
		"customer.erase/weekly":               {Window: 24 * time.Hour},
	}
	if got := pol.Tenants[0].Tenant.Limits; !reflect.DeepEqual(got, want) {
		t.Errorf("acme limits = %v, want %v", got, want)
	}
	for _, snap := range pol.Tenants[1:] {
		if snap.Tenant.Limits != nil {
			t.Errorf("%s limits = %#v, want nil", snap.Tenant.ID, snap.Tenant.Limits)
		}
	}
	if _, err := directory.ParsePolicy("p.yaml", []byte("tenants:\n  - id: acme\n    limits: {a.b/c: {window: 744h}}\n")); err != nil {
		t.Errorf("a window of exactly 31 days: %v", err)
	}
}

// TestTenantCheckLimits: stores refuse limit overrides the parser would,
// as ErrInvalid, and keep a copy of the map they are given.
func TestTenantCheckLimits(t *testing.T) {
	for name, o := range map[string]map[string]directory.LimitOverride{
		"negative max":         {"a.b/c": {Max: -1}},
		"negative window":      {"a.b/c": {Window: -time.Hour}},
		"window over 31 days":  {"a.b/c": {Window: 745 * time.Hour}},
		"overrides nothing":    {"a.b/c": {}},
		"key without slash":    {"a.b": {Max: 1}},
		"key without limit id": {"a.b/": {Max: 1}},
		"key without command":  {"/c": {Max: 1}},
		"key with two slashes": {"a/b/c": {Max: 1}},
		"key with a space":     {"a.b/c d": {Max: 1}},
	} {
		if _, err := (directory.Tenant{ID: "acme", Limits: o}).Check(); !errors.Is(err, directory.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	in := map[string]directory.LimitOverride{"a.b/c": {Max: 5}}
	tn, err := directory.Tenant{ID: "acme", Limits: in}.Check()
	if err != nil {
		t.Fatal(err)
	}
	in["a.b/c"] = directory.LimitOverride{Max: 6}
	if tn.Limits["a.b/c"].Max != 5 {
		t.Error("Check returned the caller's map, not a copy")
	}
	if tn, _ := (directory.Tenant{ID: "acme", Limits: map[string]directory.LimitOverride{}}).Check(); tn.Limits != nil {
		t.Errorf("empty limits normalised to %#v, want nil", tn.Limits)
	}
}

// TestEffectiveLimit: an override replaces the declared max and/or window
// of its own limit only, in the manifest's spelling.
func TestEffectiveLimit(t *testing.T) {
	declared := manifest.Limit{ID: "agent-daily-refunds", Per: manifest.LimitPerAgent, Window: "86400s", Max: 5000, SumField: "amount.amount_minor"}
	res := directory.Resolution{Limits: map[string]directory.LimitOverride{
		"ticket.refund/agent-daily-refunds": {Window: 12 * time.Hour},
		"ticket.refund/other":               {Max: 1},
	}}
	got := res.EffectiveLimit("ticket.refund", declared)
	if got.Window != "43200s" || got.Max != 5000 || got.SumField != declared.SumField {
		t.Errorf("window override: %+v", got)
	}
	if w, err := limit.Window(got.Window); err != nil || w != 12*time.Hour {
		t.Errorf("window %q reads back as %v, %v", got.Window, w, err)
	}
	res.Limits["ticket.refund/agent-daily-refunds"] = directory.LimitOverride{Max: 10000}
	if got := res.EffectiveLimit("ticket.refund", declared); got.Max != 10000 || got.Window != "86400s" {
		t.Errorf("max override: %+v", got)
	}
	if got := res.EffectiveLimit("expense.report.submit", declared); !reflect.DeepEqual(got, declared) {
		t.Errorf("another command's limit: %+v", got)
	}
	if got := (directory.Resolution{}).EffectiveLimit("ticket.refund", declared); !reflect.DeepEqual(got, declared) {
		t.Errorf("no overrides: %+v", got)
	}
}

func TestParsePolicyErrors(t *testing.T) {
	for _, tc := range directorytest.MalformedCases {
		t.Run(tc.Name, func(t *testing.T) {
			_, err := directory.ParsePolicy("x.yaml", []byte(tc.YAML))
			var perr *directory.PolicyError
			if !errors.As(err, &perr) || perr.Line != tc.Line || !strings.Contains(perr.Msg, tc.Msg) {
				t.Fatalf("err = %v, want line %d and %q", err, tc.Line, tc.Msg)
			}
		})
	}
}

func TestSummaryString(t *testing.T) {
	s := directory.Summary{Users: directory.Counts{Created: 1, Removed: 2}}
	if got := s.String(); got != "tenants +0 ~0 -0, roles +0 ~0 -0, users +1 ~0 -2, agents +0 ~0 -0" {
		t.Fatalf("String() = %q", got)
	}
	if s.Changes() != 3 {
		t.Fatalf("Changes() = %d", s.Changes())
	}
}
