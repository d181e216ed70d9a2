package directorytest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/directory"
)

// Seed is the policy every test starts from. Two tenants share user id "alice" and role name
// "support" on purpose: they must stay two different users and two different roles.
const Seed = `# conformance seed
version: 1
tenants:
  - id: acme
    display_name: Acme Corp
    features: [refunds, expenses]
    roles:
      support: [ticket.read, expense.report.submit]
      lead: [ticket.read, ticket.assign]
      admin: [directory.manage]
    users:
      - {id: alice, org: support, roles: [support, lead]}
      - {id: bob, org: finance, roles: [support]}
      - {id: carol, org: ops, disabled: true}
      - {id: dave, org: ops}
    agents:
      - {id: support-bot, user: alice}
      - {id: bob-bot, user: bob, host: interactive}
      - {id: retired-bot, user: alice, disabled: true}
      - {id: carol-bot, user: carol}
  - id: globex
    features: [expenses]
    roles:
      support: [globex.only]
    users:
      - {id: alice, org: globex-sales, roles: [support]}
    agents:
      - {id: globex-bot, user: alice}
`

// SeedSummary is what applying Seed to an empty store reports.
var SeedSummary = directory.Summary{
	Tenants: directory.Counts{Created: 2},
	Roles:   directory.Counts{Created: 4},
	Users:   directory.Counts{Created: 5},
	Agents:  directory.Counts{Created: 5},
}

// Run runs the conformance suite. newStore must return an empty store that is independent of
// the stores returned by other calls; cleanup is up to newStore (t.Cleanup).
func Run(t *testing.T, newStore func(t *testing.T) directory.Store) {
	s := &suite{newStore: newStore}
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"SeedSummary", s.testSeedSummary},
		{"Resolve", s.testResolve},
		{"TenantIsolation", s.testTenantIsolation},
		{"DisableUserTakesEffectAtOnce", s.testDisableUser},
		{"RevocationVoidsWhatCameBefore", s.testRevocation},
		{"TrustCeiling", s.testTrustCeiling},
		{"LimitOverrides", s.testLimitOverrides},
		{"PolicyChangeTakesEffectAtOnce", s.testPolicyChange},
		{"ApplyIdempotent", s.testApplyIdempotent},
		{"ApplyDeclarative", s.testApplyDeclarative},
		{"ApplyMalformedChangesNothing", s.testApplyMalformed},
		{"ApplyAtomic", s.testApplyAtomic},
		{"Tx", s.testTx},
		{"Watch", s.testWatch},
		{"ConcurrentUse", s.testConcurrent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // every test has its own stores
			tt.fn(t)
		})
	}
}

type suite struct {
	newStore func(t *testing.T) directory.Store
}

var ctx = context.Background()

// seeded returns a new store holding Seed.
func (s *suite) seeded(t *testing.T) directory.Store {
	t.Helper()
	st := s.newStore(t)
	if _, err := directory.Apply(ctx, st, []byte(Seed)); err != nil {
		t.Fatalf("applying the seed: %v", err)
	}
	return st
}

func (s *suite) testSeedSummary(t *testing.T) {
	st := s.newStore(t)
	sum, err := directory.Apply(ctx, st, []byte(Seed))
	if err != nil {
		t.Fatal(err)
	}
	if sum != SeedSummary {
		t.Fatalf("summary = %v, want %v", sum, SeedSummary)
	}
	snap := snapshot(t, st, "acme")
	if snap.Tenant.DisplayName != "Acme Corp" || strings.Join(snap.Tenant.Features, ",") != "expenses,refunds" {
		t.Fatalf("tenant = %+v", snap.Tenant)
	}
	if got := names(snap); got != "roles=admin,lead,support users=alice,bob,carol,dave agents=bob-bot,carol-bot,retired-bot,support-bot" {
		t.Fatalf("snapshot = %s", got)
	}
}

// describe renders a resolution compactly, in the form the test cases spell out.
func describe(r directory.Resolution) string {
	if !r.Active {
		return fmt.Sprintf("inactive %s org=%s roles=%s", r.Reason, r.Org, strings.Join(r.Roles, ","))
	}
	return fmt.Sprintf("active perms=%s features=%s org=%s roles=%s",
		strings.Join(r.Permissions, ","), strings.Join(r.Features, ","), r.Org, strings.Join(r.Roles, ","))
}

const (
	aliceAcme  = "active perms=expense.report.submit,ticket.assign,ticket.read features=expenses,refunds org=support roles=lead,support"
	bobAcme    = "active perms=expense.report.submit,ticket.read features=expenses,refunds org=finance roles=support"
	aliceGlobx = "active perms=globex.only features=expenses org=globex-sales roles=support"
)

type resolveCase struct {
	name, tenant, user, agent string
	want                      string
}

var resolveCases = []resolveCase{
	{"user with two roles", "acme", "alice", "", aliceAcme},
	{"user with one role", "acme", "bob", "", bobAcme},
	{"user without roles", "acme", "dave", "", "active perms= features=expenses,refunds org=ops roles="},
	{"agent holds exactly its user's permissions", "acme", "alice", "support-bot", aliceAcme},
	{"another user's agent", "acme", "bob", "bob-bot", bobAcme},
	{"disabled user", "acme", "carol", "", "inactive user.disabled org=ops roles="},
	{"agent of a disabled user", "acme", "carol", "carol-bot", "inactive user.disabled org=ops roles="},
	{"disabled agent", "acme", "alice", "retired-bot", "inactive agent.disabled org=support roles=lead,support"},
	{"unregistered agent", "acme", "alice", "ghost-bot", "inactive agent.not_registered org=support roles=lead,support"},
	{"agent acting for someone else", "acme", "bob", "support-bot", "inactive agent.wrong_user org=finance roles=support"},
	{"unknown user", "acme", "mallory", "", "inactive user.unknown org= roles="},
	{"unknown user with a real agent", "acme", "mallory", "support-bot", "inactive user.unknown org= roles="},
	{"unknown tenant", "initech", "alice", "", "inactive tenant.unknown org= roles="},
	{"empty tenant", "", "alice", "", "inactive tenant.unknown org= roles="},
	{"empty user", "acme", "", "", "inactive user.unknown org= roles="},
	{"same user id, other tenant", "globex", "alice", "", aliceGlobx},
	{"other tenant's own agent", "globex", "alice", "globex-bot", aliceGlobx},
	{"agent id of another tenant", "globex", "alice", "support-bot", "inactive agent.not_registered org=globex-sales roles=support"},
	{"user id of another tenant", "globex", "bob", "", "inactive user.unknown org= roles="},
	{"tenant id case matters", "ACME", "alice", "", "inactive tenant.unknown org= roles="},
}

func (s *suite) testResolve(t *testing.T) {
	st := s.seeded(t)
	cache := newCache(t, st)
	resolvers := map[string]directory.Resolver{"direct": directory.Direct(st), "cache": cache}
	for _, rname := range []string{"direct", "cache"} {
		r := resolvers[rname]
		for round := range 2 { // the second round is served from the cache
			for _, tc := range resolveCases {
				t.Run(fmt.Sprintf("%s/%d/%s", rname, round, tc.name), func(t *testing.T) {
					res, err := r.Resolve(ctx, tc.tenant, tc.user, tc.agent)
					if err != nil {
						t.Fatal(err)
					}
					if got := describe(res); got != tc.want {
						t.Fatalf("got  %s\nwant %s", got, tc.want)
					}
					if res.Tenant != tc.tenant || res.UserID != tc.user || res.AgentID != tc.agent {
						t.Fatalf("principal echoed as %q/%q/%q", res.Tenant, res.UserID, res.AgentID)
					}
				})
			}
		}
	}
	if st := cache.Stats(); st.Hits < uint64(len(resolveCases)) {
		t.Errorf("cache stats %+v: the second round should have been hits", st)
	}

	t.Run("interactive hosts", func(t *testing.T) {
		// Only a user acting directly and an agent whose host is
		// interactive answer confirmation forms for their user; agents
		// default to headless.
		for _, c := range []struct {
			user, agent string
			want        bool
		}{{"alice", "", true}, {"alice", "support-bot", false}, {"bob", "bob-bot", true}, {"alice", "retired-bot", false}} {
			res := resolve(t, st, "acme", c.user, c.agent)
			if res.Interactive != c.want {
				t.Errorf("%s/%s: Interactive = %v, want %v", c.user, c.agent, res.Interactive, c.want)
			}
		}
		for _, a := range snapshot(t, st, "acme").Agents {
			want := directory.HostHeadless
			if a.ID == "bob-bot" {
				want = directory.HostInteractive
			}
			if a.Host != want {
				t.Errorf("agent %s: host %q, want %q", a.ID, a.Host, want)
			}
		}
	})

	t.Run("helpers", func(t *testing.T) {
		res := resolve(t, st, "acme", "alice", "support-bot")
		checks := []struct {
			name string
			got  bool
			want bool
		}{
			{"held permission", res.HasPermission("ticket.assign"), true},
			{"permission of another role", res.HasPermission("directory.manage"), false},
			{"permission of the other tenant", res.HasPermission("globex.only"), false},
			{"feature", res.HasFeature("refunds"), true},
			{"missing feature", res.HasFeature("payroll"), false},
		}
		for _, c := range checks {
			if c.got != c.want {
				t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
			}
		}
		inactive := resolve(t, st, "acme", "alice", "retired-bot")
		if inactive.HasPermission("ticket.read") || inactive.HasFeature("refunds") || len(inactive.Permissions) != 0 {
			t.Errorf("an inactive principal holds something: %+v", inactive)
		}
	})

	t.Run("cached results are copies", func(t *testing.T) {
		a, _ := cache.Resolve(ctx, "acme", "alice", "")
		a.Permissions[0] = "root"
		b, _ := cache.Resolve(ctx, "acme", "alice", "")
		if describe(b) != aliceAcme {
			t.Fatalf("mutating a result changed the cache: %s", describe(b))
		}
	})
}

func (s *suite) testTenantIsolation(t *testing.T) {
	st := s.seeded(t)
	cache := newCache(t, st)
	warm(t, cache, "acme", "alice", "")
	warm(t, cache, "globex", "alice", "")

	t.Run("disabling a user leaves the same id in another tenant alone", func(t *testing.T) {
		if err := directory.SetUserDisabled(ctx, st, "acme", "alice", true); err != nil {
			t.Fatal(err)
		}
		for _, r := range []directory.Resolver{directory.Direct(st), cache} {
			if got := describe(must(r.Resolve(ctx, "globex", "alice", "globex-bot"))); got != aliceGlobx {
				t.Fatalf("globex/alice = %s", got)
			}
			if got := must(r.Resolve(ctx, "acme", "alice", "")); got.Reason != directory.ReasonUserDisabled {
				t.Fatalf("acme/alice = %s", describe(got))
			}
		}
	})
	t.Run("writes cannot reference another tenant", func(t *testing.T) {
		tests := []struct {
			name string
			fn   func(directory.Tx) error
		}{
			{"user holding a role defined only in another tenant", func(tx directory.Tx) error {
				return tx.PutUser(ctx, directory.User{Tenant: "globex", ID: "zed", Roles: []string{"lead"}})
			}},
			{"agent acting for a user of another tenant", func(tx directory.Tx) error {
				return tx.PutAgent(ctx, directory.Agent{Tenant: "globex", ID: "sneaky-bot", UserID: "bob"})
			}},
			{"role in an unknown tenant", func(tx directory.Tx) error {
				return tx.PutRole(ctx, directory.Role{Tenant: "initech", Name: "support", Permissions: []string{"x"}})
			}},
			{"user in an unknown tenant", func(tx directory.Tx) error {
				return tx.PutUser(ctx, directory.User{Tenant: "initech", ID: "alice"})
			}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				before := snapshotAll(t, st)
				err := st.Update(ctx, tt.fn)
				if !errors.Is(err, directory.ErrReference) {
					t.Fatalf("err = %v, want ErrReference", err)
				}
				if after := snapshotAll(t, st); !reflect.DeepEqual(before, after) {
					t.Fatalf("store changed:\n%+v\n%+v", before, after)
				}
			})
		}
	})
	t.Run("snapshots hold only their tenant", func(t *testing.T) {
		if got := names(snapshot(t, st, "globex")); got != "roles=support users=alice agents=globex-bot" {
			t.Fatalf("globex snapshot = %s", got)
		}
	})
	t.Run("a change is announced for its tenant only", func(t *testing.T) {
		w := watch(t, st)
		if err := directory.SetAgentDisabled(ctx, st, "globex", "globex-bot", true); err != nil {
			t.Fatal(err)
		}
		if got := w.tenants(); got != "globex" {
			t.Fatalf("announced %q, want globex", got)
		}
		if got := describe(must(cache.Resolve(ctx, "acme", "bob", ""))); got != bobAcme {
			t.Fatalf("acme/bob after a globex change = %s", got)
		}
	})
}

func (s *suite) testDisableUser(t *testing.T) {
	st := s.seeded(t)
	cache := newCache(t, st)
	principals := [][2]string{{"alice", ""}, {"alice", "support-bot"}}
	for _, p := range principals {
		warm(t, cache, "acme", p[0], p[1])
	}
	hits := cache.Stats().Hits

	if err := directory.SetUserDisabled(ctx, st, "acme", "alice", true); err != nil {
		t.Fatal(err)
	}
	for _, p := range principals {
		for name, r := range map[string]directory.Resolver{"direct": directory.Direct(st), "cache": cache} {
			got := must(r.Resolve(ctx, "acme", p[0], p[1]))
			if got.Active || got.Reason != directory.ReasonUserDisabled || len(got.Permissions) != 0 {
				t.Errorf("%s %v after disabling alice: %s", name, p, describe(got))
			}
		}
	}
	if got := cache.Stats().Hits; got != hits {
		t.Errorf("the cache answered %d calls from stale entries", got-hits)
	}
	if got := describe(must(cache.Resolve(ctx, "acme", "bob", "bob-bot"))); got != bobAcme {
		t.Errorf("bob-bot affected by disabling alice: %s", got)
	}

	if err := directory.SetUserDisabled(ctx, st, "acme", "alice", false); err != nil {
		t.Fatal(err)
	}
	if got := describe(must(cache.Resolve(ctx, "acme", "alice", "support-bot"))); got != aliceAcme {
		t.Errorf("support-bot after re-enabling alice: %s", got)
	}

	if err := directory.SetAgentDisabled(ctx, st, "acme", "support-bot", true); err != nil {
		t.Fatal(err)
	}
	if got := must(cache.Resolve(ctx, "acme", "alice", "support-bot")); got.Reason != directory.ReasonAgentDisabled {
		t.Errorf("support-bot after disabling it: %s", describe(got))
	}
	if got := describe(must(cache.Resolve(ctx, "acme", "alice", ""))); got != aliceAcme {
		t.Errorf("alice after disabling her agent: %s", got)
	}

	if err := directory.SetUserDisabled(ctx, st, "acme", "nobody", true); !errors.Is(err, directory.ErrNotFound) {
		t.Errorf("disabling an unknown user: err = %v, want ErrNotFound", err)
	}
	if err := directory.SetUserDisabled(ctx, st, "globex", "bob", true); !errors.Is(err, directory.ErrNotFound) {
		t.Errorf("disabling another tenant's user: err = %v, want ErrNotFound", err)
	}
}

// testRevocation: disabling records when; enabling again does not bring
// back a token issued before it, and no later write — a policy file that
// does not know the instant — moves it back.
func (s *suite) testRevocation(t *testing.T) {
	st := s.seeded(t)
	before := directory.RevocationNow()
	fresh := must(directory.Direct(st).Resolve(ctx, "acme", "alice", "support-bot"))
	if !fresh.RevokedAt.IsZero() || !fresh.Admit(time.Time{}).Active {
		t.Fatalf("never revoked: RevokedAt %v, a token without iat refused", fresh.RevokedAt)
	}
	for _, step := range []struct {
		name string
		fn   func() error
	}{
		{"disable the agent", func() error { return directory.SetAgentDisabled(ctx, st, "acme", "support-bot", true) }},
		{"enable it again", func() error { return directory.SetAgentDisabled(ctx, st, "acme", "support-bot", false) }},
	} {
		if err := step.fn(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
	}
	res := must(directory.Direct(st).Resolve(ctx, "acme", "alice", "support-bot"))
	if !res.Active || res.RevokedAt.Before(before) {
		t.Fatalf("after re-enabling: %s, RevokedAt %v (before %v)", describe(res), res.RevokedAt, before)
	}
	for _, c := range []struct {
		name   string
		iat    time.Time
		active bool
	}{
		{"issued before the revocation", before.Add(-time.Minute), false},
		{"issued in the revocation's second", res.RevokedAt.Truncate(time.Second), false},
		{"without iat", time.Time{}, false},
		{"issued after", res.NotBefore(), true},
	} {
		got := res.Admit(c.iat)
		if got.Active != c.active || (!c.active && (got.Reason != directory.ReasonCredentialRevoked || len(got.Permissions) != 0)) {
			t.Errorf("%s: %s", c.name, describe(got))
		}
	}
	if !res.IssuedBefore(before) || res.IssuedBefore(res.RevokedAt.Add(time.Millisecond)) {
		t.Errorf("IssuedBefore around %v is wrong", res.RevokedAt)
	}
	if alice := must(directory.Direct(st).Resolve(ctx, "acme", "alice", "")); !alice.RevokedAt.IsZero() {
		t.Errorf("alice acting directly inherits her agent's revocation: %v", alice.RevokedAt)
	}

	// Re-applying the seed (which names support-bot enabled and knows no
	// instant) keeps it.
	if _, err := directory.Apply(ctx, st, []byte(Seed)); err != nil {
		t.Fatal(err)
	}
	if again := must(directory.Direct(st).Resolve(ctx, "acme", "alice", "support-bot")); !again.RevokedAt.Equal(res.RevokedAt) {
		t.Errorf("re-applying the policy moved RevokedAt from %v to %v", res.RevokedAt, again.RevokedAt)
	}

	// Disabling the user revokes every agent acting for her too.
	if err := directory.SetUserDisabled(ctx, st, "acme", "alice", true); err != nil {
		t.Fatal(err)
	}
	if err := directory.SetUserDisabled(ctx, st, "acme", "alice", false); err != nil {
		t.Fatal(err)
	}
	user := must(directory.Direct(st).Resolve(ctx, "acme", "alice", "support-bot"))
	if !user.RevokedAt.After(res.RevokedAt) || user.Admit(user.RevokedAt.Truncate(time.Second)).Active || !user.Admit(user.NotBefore()).Active {
		t.Errorf("after disabling alice: RevokedAt %v, a token of before it admitted", user.RevokedAt)
	}
}

// testTrustCeiling: a tenant's ceiling round-trips, defaults to L2 and
// must be a risk level.
func (s *suite) testTrustCeiling(t *testing.T) {
	st := s.seeded(t)
	if got := must(directory.Direct(st).Resolve(ctx, "acme", "alice", "")); got.TrustCeiling != directory.DefaultTrustCeiling || got.TrustCeilingLevel() != 2 {
		t.Errorf("default ceiling %q (%d)", got.TrustCeiling, got.TrustCeilingLevel())
	}
	err := st.Update(ctx, func(tx directory.Tx) error {
		snap, err := tx.Snapshot(ctx, "acme")
		if err != nil {
			return err
		}
		snap.Tenant.TrustCeiling = "L1"
		return tx.PutTenant(ctx, snap.Tenant)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := must(directory.Direct(st).Resolve(ctx, "acme", "alice", "support-bot")); got.TrustCeiling != "L1" || got.TrustCeilingLevel() != 1 {
		t.Errorf("ceiling after setting L1: %q", got.TrustCeiling)
	}
	if snap := snapshot(t, st, "acme"); snap.Tenant.TrustCeiling != "L1" {
		t.Errorf("snapshot ceiling %q", snap.Tenant.TrustCeiling)
	}
	err = st.Update(ctx, func(tx directory.Tx) error {
		return tx.PutTenant(ctx, directory.Tenant{ID: "acme", TrustCeiling: "L9"})
	})
	if !errors.Is(err, directory.ErrInvalid) {
		t.Errorf("ceiling L9: err = %v, want ErrInvalid", err)
	}
}

// withLimits is Seed with acme overriding limits: the body of its limits
// mapping, indented for it.
func withLimits(body string) string {
	return strings.Replace(Seed, "    features: [refunds, expenses]\n", "    features: [refunds, expenses]\n    limits:\n"+body, 1)
}

// testLimitOverrides: a tenant's limit overrides go from the policy file
// through Apply to every Resolution of its active principals, by value;
// applying the same overrides again is no change, and a file without them
// drops them.
func (s *suite) testLimitOverrides(t *testing.T) {
	st := s.seeded(t)
	cache := newCache(t, st)
	resolvers := map[string]directory.Resolver{"direct": directory.Direct(st), "cache": cache}
	// limitsOf resolves through both resolvers (the cache twice: a miss, then a hit).
	limitsOf := func(t *testing.T, tenant, user, agent string) map[string]directory.LimitOverride {
		t.Helper()
		var first map[string]directory.LimitOverride
		for i, name := range []string{"direct", "cache", "cache"} {
			res := must(resolvers[name].Resolve(ctx, tenant, user, agent))
			if i == 0 {
				first = res.Limits
			} else if !reflect.DeepEqual(res.Limits, first) {
				t.Fatalf("%s/%s/%s: %s resolves limits %v, direct %v", tenant, user, agent, name, res.Limits, first)
			}
		}
		return first
	}
	if got := limitsOf(t, "acme", "alice", "support-bot"); got != nil {
		t.Fatalf("limits before any override: %#v", got)
	}
	if got := snapshot(t, st, "acme").Tenant.Limits; got != nil {
		t.Fatalf("snapshot limits before any override: %#v", got)
	}

	file := withLimits(`      ticket.refund/agent-daily-refunds:
        max: 10000
        window: 12h
      ticket.refund/tenant-hourly: {window: 90m15s}
      expense.report.submit/per-user: {max: 9223372036854775807}
`)
	want := map[string]directory.LimitOverride{
		"ticket.refund/agent-daily-refunds": {Max: 10000, Window: 12 * time.Hour},
		"ticket.refund/tenant-hourly":       {Window: 90*time.Minute + 15*time.Second},
		"expense.report.submit/per-user":    {Max: 1<<63 - 1},
	}
	w := watch(t, st)
	sum, err := directory.Apply(ctx, st, []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	if want := (directory.Summary{Tenants: directory.Counts{Updated: 1}}); sum != want {
		t.Fatalf("summary = %v, want %v", sum, want)
	}
	if got := w.tenants(); got != "acme" {
		t.Fatalf("announced %q, want acme", got)
	}
	for _, p := range [][2]string{{"alice", ""}, {"alice", "support-bot"}, {"bob", "bob-bot"}} {
		if got := limitsOf(t, "acme", p[0], p[1]); !reflect.DeepEqual(got, want) {
			t.Errorf("acme %v: limits %v, want %v", p, got, want)
		}
	}
	if got := snapshot(t, st, "acme").Tenant.Limits; !reflect.DeepEqual(got, want) {
		t.Errorf("snapshot limits %v, want %v", got, want)
	}
	for _, p := range [][3]string{{"acme", "carol", ""}, {"acme", "alice", "retired-bot"}, {"acme", "mallory", ""}, {"globex", "alice", "globex-bot"}} {
		if got := limitsOf(t, p[0], p[1], p[2]); got != nil {
			t.Errorf("%v (inactive, or another tenant): limits %v, want none", p, got)
		}
	}
	if r := must(directory.Direct(st).Resolve(ctx, "acme", "alice", "")); r.Admit(r.NotBefore()).Limits == nil {
		t.Error("Admit dropped the limits of an admitted principal")
	}

	t.Run("applying the same overrides again changes nothing", func(t *testing.T) {
		w := watch(t, st)
		same := withLimits(`      expense.report.submit/per-user: {max: 9223372036854775807}
      ticket.refund/tenant-hourly: {window: 5415s}
      ticket.refund/agent-daily-refunds: {window: 720m, max: 10000}
`)
		for _, f := range []string{file, file, same} {
			sum, err := directory.Apply(ctx, st, []byte(f))
			if err != nil {
				t.Fatal(err)
			}
			if sum.Changes() != 0 {
				t.Fatalf("re-applying reported %v", sum)
			}
			pol, err := directory.ParsePolicy("p.yaml", []byte(f))
			if err != nil {
				t.Fatal(err)
			}
			if plan, err := directory.PlanPolicy(ctx, st, pol); err != nil || len(plan.Changes) != 0 {
				t.Fatalf("plan of the same file: %v, %v", plan.Changes, err)
			}
		}
		if got := w.tenants(); got != "" {
			t.Fatalf("re-applying announced changes for %q", got)
		}
	})

	t.Run("results do not share maps", func(t *testing.T) {
		for name, r := range resolvers {
			a := must(r.Resolve(ctx, "acme", "alice", ""))
			a.Limits["ticket.refund/agent-daily-refunds"] = directory.LimitOverride{Max: 1}
			delete(a.Limits, "ticket.refund/tenant-hourly")
			if got := must(r.Resolve(ctx, "acme", "alice", "")).Limits; !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: mutating a result changed the next one: %v", name, got)
			}
		}
		snap := snapshot(t, st, "acme")
		snap.Tenant.Limits["ticket.refund/agent-daily-refunds"] = directory.LimitOverride{Max: 1}
		if got := snapshot(t, st, "acme").Tenant.Limits; !reflect.DeepEqual(got, want) {
			t.Fatalf("mutating a snapshot changed the store: %v", got)
		}
		mine := map[string]directory.LimitOverride{"a.b/c": {Max: 1}}
		err := st.Update(ctx, func(tx directory.Tx) error {
			return tx.PutTenant(ctx, directory.Tenant{ID: "initech", Limits: mine})
		})
		if err != nil {
			t.Fatal(err)
		}
		mine["a.b/c"] = directory.LimitOverride{Max: 2}
		if got := snapshot(t, st, "initech").Tenant.Limits; got["a.b/c"].Max != 1 {
			t.Fatalf("the store kept the caller's map: %v", got)
		}
	})

	t.Run("a changed window reaches the cache at once", func(t *testing.T) {
		changed := strings.Replace(file, "window: 12h", "window: 6h", 1)
		sum, err := directory.Apply(ctx, st, []byte(changed))
		if err != nil {
			t.Fatal(err)
		}
		if want := (directory.Summary{Tenants: directory.Counts{Updated: 1}}); sum != want {
			t.Fatalf("summary = %v, want %v", sum, want)
		}
		if got := must(cache.Resolve(ctx, "acme", "alice", "support-bot")).Limits["ticket.refund/agent-daily-refunds"]; got != (directory.LimitOverride{Max: 10000, Window: 6 * time.Hour}) {
			t.Fatalf("after changing the window: %+v", got)
		}
	})

	t.Run("a file without overrides drops them", func(t *testing.T) {
		sum, err := directory.Apply(ctx, st, []byte(Seed))
		if err != nil {
			t.Fatal(err)
		}
		if want := (directory.Summary{Tenants: directory.Counts{Updated: 1}}); sum != want {
			t.Fatalf("summary = %v, want %v", sum, want)
		}
		if got := limitsOf(t, "acme", "alice", "support-bot"); got != nil {
			t.Fatalf("limits after dropping them: %v", got)
		}
		if got := snapshot(t, st, "acme").Tenant.Limits; got != nil {
			t.Fatalf("snapshot limits after dropping them: %#v", got)
		}
	})

	t.Run("invalid overrides", func(t *testing.T) {
		for name, o := range map[string]map[string]directory.LimitOverride{
			"negative max":        {"ticket.refund/agent-daily-refunds": {Max: -1}},
			"window over 31 days": {"ticket.refund/agent-daily-refunds": {Window: 32 * 24 * time.Hour}},
			"overrides nothing":   {"ticket.refund/agent-daily-refunds": {}},
			"malformed key":       {"ticket.refund": {Max: 1}},
		} {
			err := st.Update(ctx, func(tx directory.Tx) error {
				return tx.PutTenant(ctx, directory.Tenant{ID: "acme", Limits: o})
			})
			if !errors.Is(err, directory.ErrInvalid) {
				t.Errorf("%s: err = %v, want ErrInvalid", name, err)
			}
		}
	})
}

func (s *suite) testPolicyChange(t *testing.T) {
	st := s.seeded(t)
	cache := newCache(t, st)
	warm(t, cache, "acme", "alice", "support-bot")
	warm(t, cache, "acme", "bob", "")

	changed := strings.Replace(Seed, "lead: [ticket.read, ticket.assign]", "lead: [ticket.read, ticket.close]", 1)
	changed = strings.Replace(changed, "features: [refunds, expenses]", "features: [expenses]", 1)
	sum, err := directory.Apply(ctx, st, []byte(changed))
	if err != nil {
		t.Fatal(err)
	}
	if want := (directory.Summary{Tenants: directory.Counts{Updated: 1}, Roles: directory.Counts{Updated: 1}}); sum != want {
		t.Fatalf("summary = %v, want %v", sum, want)
	}
	got := must(cache.Resolve(ctx, "acme", "alice", "support-bot"))
	if got.HasPermission("ticket.assign") || !got.HasPermission("ticket.close") || got.HasFeature("refunds") {
		t.Fatalf("support-bot after the policy change: %s", describe(got))
	}
	if got := must(cache.Resolve(ctx, "acme", "bob", "")); got.HasFeature("refunds") {
		t.Fatalf("bob still has the removed feature: %s", describe(got))
	}
}

func (s *suite) testApplyIdempotent(t *testing.T) {
	st := s.seeded(t)
	before := snapshotAll(t, st)
	w := watch(t, st)
	for i := range 2 {
		sum, err := directory.Apply(ctx, st, []byte(Seed))
		if err != nil {
			t.Fatal(err)
		}
		if sum.Changes() != 0 {
			t.Fatalf("re-apply %d reported %d changes: %v", i, sum.Changes(), sum)
		}
	}
	if after := snapshotAll(t, st); !reflect.DeepEqual(before, after) {
		t.Fatalf("re-applying changed the store:\n%+v\n%+v", before, after)
	}
	if got := w.tenants(); got != "" {
		t.Fatalf("re-applying announced changes for %q", got)
	}
	// The same content written differently (order, flow style, duplicates across lists are
	// not allowed, so only order) is also no change.
	reordered := `
tenants:
  - id: globex
    agents: [{user: alice, id: globex-bot}]
    users: [{roles: [support], org: globex-sales, id: alice}]
    roles: {support: [globex.only]}
    features: [expenses]
  - id: acme
    display_name: Acme Corp
    features: [expenses, refunds]
    roles:
      admin: [directory.manage]
      lead: [ticket.assign, ticket.read]
      support: [expense.report.submit, ticket.read]
    users:
      - {id: dave, org: ops}
      - {id: carol, org: ops, disabled: true}
      - {id: bob, org: finance, roles: [support]}
      - {id: alice, org: support, roles: [lead, support]}
    agents:
      - {id: carol-bot, user: carol}
      - {id: retired-bot, user: alice, disabled: true}
      - {id: bob-bot, user: bob, host: interactive}
      - {id: support-bot, user: alice}
`
	sum, err := directory.Apply(ctx, st, []byte(reordered))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Changes() != 0 {
		t.Fatalf("reordered file reported changes: %v", sum)
	}
}

func (s *suite) testApplyDeclarative(t *testing.T) {
	st := s.seeded(t)
	cache := newCache(t, st)
	warm(t, cache, "acme", "bob", "bob-bot")

	// bob and bob-bot leave the file, the admin role goes, alice loses lead, erin arrives.
	next := `
tenants:
  - id: acme
    display_name: Acme Corp
    features: [refunds, expenses]
    roles:
      support: [ticket.read, expense.report.submit]
      lead: [ticket.read, ticket.assign]
    users:
      - {id: alice, org: support, roles: [support]}
      - {id: carol, org: ops, disabled: true}
      - {id: dave, org: ops}
      - {id: erin, org: support, roles: [lead]}
    agents:
      - {id: support-bot, user: alice}
      - {id: retired-bot, user: alice, disabled: true}
      - {id: carol-bot, user: carol}
`
	sum, err := directory.Apply(ctx, st, []byte(next))
	if err != nil {
		t.Fatal(err)
	}
	want := directory.Summary{
		Roles:  directory.Counts{Removed: 1},
		Users:  directory.Counts{Created: 1, Updated: 1, Removed: 1},
		Agents: directory.Counts{Removed: 1},
	}
	if sum != want {
		t.Fatalf("summary = %v, want %v", sum, want)
	}
	for _, p := range [][2]string{{"bob", ""}, {"bob", "bob-bot"}} {
		if got := must(cache.Resolve(ctx, "acme", p[0], p[1])); got.Active {
			t.Errorf("%v still active after leaving the file: %s", p, describe(got))
		}
	}
	snap := snapshot(t, st, "acme")
	if got := names(snap); got != "roles=lead,support users=alice,bob,carol,dave,erin agents=bob-bot,carol-bot,retired-bot,support-bot" {
		t.Fatalf("snapshot = %s (users and agents are disabled, not deleted; roles are deleted)", got)
	}
	for _, u := range snap.Users {
		if u.ID == "bob" && !u.Disabled {
			t.Error("bob is not disabled")
		}
	}
	if got := names(snapshot(t, st, "globex")); got != "roles=support users=alice agents=globex-bot" {
		t.Fatalf("globex, absent from the file, changed: %s", got)
	}
	if got := describe(must(cache.Resolve(ctx, "acme", "alice", "support-bot"))); got != "active perms=expense.report.submit,ticket.read features=expenses,refunds org=support roles=support" {
		t.Fatalf("alice after losing lead: %s", got)
	}

	// Applying the seed again brings bob back (enabled) and re-creates admin.
	sum, err = directory.Apply(ctx, st, []byte(Seed))
	if err != nil {
		t.Fatal(err)
	}
	want = directory.Summary{
		Roles:  directory.Counts{Created: 1},
		Users:  directory.Counts{Updated: 2, Removed: 1},
		Agents: directory.Counts{Updated: 1},
	}
	if sum != want {
		t.Fatalf("summary = %v, want %v", sum, want)
	}
	if got := describe(must(cache.Resolve(ctx, "acme", "bob", "bob-bot"))); got != bobAcme {
		t.Fatalf("bob-bot after coming back: %s", got)
	}
	if got := must(cache.Resolve(ctx, "acme", "erin", "")); got.Reason != directory.ReasonUserDisabled {
		t.Fatalf("erin after leaving the file: %s", describe(got))
	}
}

// MalformedCase is a policy file that Apply must refuse, naming Line.
type MalformedCase struct {
	Name string
	YAML string
	Line int
	Msg  string // substring of the message
}

// MalformedCases are the refused files the suite applies; exported for parser unit tests.
var MalformedCases = []MalformedCase{
	{"unknown agent host", "tenants:\n  - id: acme\n    users:\n      - {id: alice}\n    agents:\n      - {id: bot, user: alice, host: sometimes}\n", 6, `host must be "headless" or "interactive"`},
	{"syntax error", "tenants:\n  - id: acme\n    display_name: a: b\n", 3, "syntax error: mapping values are not allowed"},
	{"tab indentation", "tenants:\n\t- id: acme\n", 2, "syntax error: found character that cannot start any token"},
	{"unknown field", "tenants:\n  - id: acme\n    rolez:\n      support: [ticket.read]\n", 3, `unknown field "rolez"`},
	{"unknown top-level field", "tenant:\n  - id: acme\n", 1, `unknown field "tenant"`},
	{"unknown user field", "tenants:\n  - id: acme\n    users:\n      - id: alice\n        role: [x]\n", 5, `unknown field "role"`},
	{"unsupported version", "version: 2\ntenants: []\n", 1, "unsupported version"},
	{"no tenants", "version: 1\n", 1, "no tenants"},
	{"empty file", "", 0, "empty policy file"},
	{"two documents", "tenants: []\n---\ntenants: []\n", 2, "more than one YAML document"},
	{"duplicate tenant", "tenants:\n  - id: acme\n  - id: globex\n  - id: acme\n", 4, `duplicate tenant id "acme" (first at line 2)`},
	{"duplicate user", "tenants:\n  - id: acme\n    users:\n      - id: alice\n      - id: bob\n      - id: alice\n", 6, `duplicate user id "alice"`},
	{"duplicate agent", "tenants:\n  - id: acme\n    users: [{id: alice}]\n    agents:\n      - {id: bot, user: alice}\n      - {id: bot, user: alice}\n", 6, `duplicate agent id "bot"`},
	{"duplicate role", "tenants:\n  - id: acme\n    roles:\n      support: [a]\n      support: [b]\n", 5, `duplicate role "support"`},
	{"repeated field", "tenants:\n  - id: acme\n    id: globex\n", 3, `field "id" repeated`},
	{"duplicate permission", "tenants:\n  - id: acme\n    roles:\n      support: [a, b, a]\n", 4, `duplicate permission "a"`},
	{"undefined role", "tenants:\n  - id: acme\n    roles:\n      support: [ticket.read]\n    users:\n      - id: alice\n        roles:\n          - support\n          - auditor\n", 9, `role "auditor" is not defined in tenant "acme"`},
	{"role of another tenant", "tenants:\n  - id: acme\n    roles: {lead: [x]}\n  - id: globex\n    users:\n      - {id: alice, roles: [lead]}\n", 6, `role "lead" is not defined in tenant "globex"`},
	{"role granting nothing", "tenants:\n  - id: acme\n    roles:\n      empty: []\n", 4, `role "empty" grants no permissions`},
	{"agent for unknown user", "tenants:\n  - id: acme\n    users: [{id: alice}]\n    agents:\n      - id: bot\n        user: bob\n", 6, `agent "bot" acts for unknown user "bob"`},
	{"agent for another tenant's user", "tenants:\n  - id: acme\n    users: [{id: bob}]\n  - id: globex\n    users: [{id: alice}]\n    agents: [{id: bot, user: bob}]\n", 6, `acts for unknown user "bob"`},
	{"agent without user", "tenants:\n  - id: acme\n    agents:\n      - id: bot\n", 4, `agent "bot" has no user`},
	{"tenant without id", "tenants:\n  - display_name: Acme\n", 2, "tenant has no id"},
	{"user without id", "tenants:\n  - id: acme\n    users:\n      - org: support\n", 4, "user has no id"},
	{"id with space", "tenants:\n  - id: acme\n    users:\n      - id: alice smith\n", 4, "white space"},
	{"empty id", "tenants:\n  - id: \"\"\n", 2, "tenant id is empty"},
	{"null id", "tenants:\n  - id:\n", 2, "must be a string"},
	{"disabled not a bool", "tenants:\n  - id: acme\n    users:\n      - id: alice\n        disabled: \"yes\"\n", 5, "must be true or false"},
	{"features not a list", "tenants:\n  - id: acme\n    features: refunds\n", 3, "features must be a list"},
	{"roles not a mapping", "tenants:\n  - id: acme\n    roles: [support]\n", 3, "roles must be a mapping"},
	{"tenant not a mapping", "tenants:\n  - acme\n", 2, "a tenant must be a mapping"},
	{"limits not a mapping", "tenants:\n  - id: acme\n    limits: [ticket.refund/agent-daily-refunds]\n", 3, "limits must be a mapping"},
	{"limit key without limit id", "tenants:\n  - id: acme\n    limits:\n      ticket.refund:\n        max: 10\n", 4, `limit key "ticket.refund" must be "<command code>/<limit id>"`},
	{"limit key without command", "tenants:\n  - id: acme\n    limits:\n      /agent-daily-refunds: {max: 10}\n", 4, `limit key "/agent-daily-refunds" must be "<command code>/<limit id>"`},
	{"limit key with an empty limit id", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/: {max: 10}\n", 4, `must be "<command code>/<limit id>"`},
	{"limit key with two slashes", "tenants:\n  - id: acme\n    limits:\n      ticket/refund/daily: {max: 10}\n", 4, `must be "<command code>/<limit id>"`},
	{"limit key with a space", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent daily: {max: 10}\n", 4, "white space"},
	{"duplicate limit", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds: {max: 10}\n      ticket.refund/agent-daily-refunds: {window: 1h}\n", 5, `duplicate limit "ticket.refund/agent-daily-refunds" (first at line 4)`},
	{"unknown limit field", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds:\n        max: 10\n        per: USER\n", 6, `unknown field "per"`},
	{"repeated limit field", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds:\n        max: 10\n        max: 20\n", 6, `field "max" repeated`},
	{"limit overriding nothing", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds: {}\n", 4, `limit "ticket.refund/agent-daily-refunds" overrides nothing`},
	{"limit not a mapping", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds: 10000\n", 4, "must be a mapping"},
	{"limit max zero", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds:\n        max: 0\n", 5, `max of limit "ticket.refund/agent-daily-refunds" must be positive`},
	{"limit max negative", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds:\n        max: -5\n", 5, "must be positive"},
	{"limit max not a whole number", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds:\n        max: 2.5\n", 5, "must be a whole number"},
	{"limit max not a number", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds:\n        max: lots\n", 5, "must be a whole number"},
	{"limit max too large", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds:\n        max: 9223372036854775808\n", 5, "must be a whole number"},
	{"limit window not a duration", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds:\n        window: daily\n", 5, `must be a duration such as 12h or 90m, not "daily"`},
	{"limit window without unit", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds:\n        window: 86400\n", 5, "must be a duration"},
	{"limit window zero", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds:\n        window: 0s\n", 5, "must be positive and at most 744h (31 days), not 0s"},
	{"limit window negative", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds:\n        window: -1h\n", 5, "must be positive and at most 744h"},
	{"limit window over 31 days", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds:\n        window: 745h\n", 5, "must be positive and at most 744h (31 days), not 745h"},
	{"limit window not a string", "tenants:\n  - id: acme\n    limits:\n      ticket.refund/agent-daily-refunds:\n        window: [1h]\n", 5, "must be a string"},
	{"error in the last tenant", Seed + "  - id: initech\n    users: [{id: x, roles: [nope]}]\n", strings.Count(Seed, "\n") + 2, `role "nope" is not defined`},
}

func (s *suite) testApplyMalformed(t *testing.T) {
	st := s.seeded(t)
	before := snapshotAll(t, st)
	w := watch(t, st)
	for _, tc := range MalformedCases {
		t.Run(tc.Name, func(t *testing.T) {
			sum, err := directory.Apply(ctx, st, []byte(tc.YAML), directory.FileName("policy.yaml"))
			var perr *directory.PolicyError
			if !errors.As(err, &perr) {
				t.Fatalf("err = %v, want a *PolicyError", err)
			}
			if perr.File != "policy.yaml" || perr.Line != tc.Line || !strings.Contains(perr.Msg, tc.Msg) {
				t.Fatalf("err = %q, want policy.yaml:%d: ...%s...", err, tc.Line, tc.Msg)
			}
			wantPrefix := fmt.Sprintf("policy.yaml:%d: ", tc.Line)
			if tc.Line == 0 {
				wantPrefix = "policy.yaml: "
			}
			if !strings.HasPrefix(err.Error(), wantPrefix) {
				t.Fatalf("message %q does not start with %q", err, wantPrefix)
			}
			if sum.Changes() != 0 {
				t.Fatalf("summary = %v", sum)
			}
		})
	}
	if after := snapshotAll(t, st); !reflect.DeepEqual(before, after) {
		t.Fatalf("a refused file changed the store:\n%+v\n%+v", before, after)
	}
	if got := w.tenants(); got != "" {
		t.Fatalf("refused files announced changes for %q", got)
	}
	if _, err := directory.Apply(ctx, st, []byte("tenants: [\n"), directory.FileName("seed/acme.yaml")); err == nil || !strings.HasPrefix(err.Error(), "seed/acme.yaml:") {
		t.Fatalf("FileName not used: %v", err)
	}
}

// failingStore fails the Nth write of every transaction, after the earlier writes succeeded.
type failingStore struct {
	directory.Store
	failAt int
}

var errInjected = errors.New("injected failure")

func (f failingStore) Update(ctx context.Context, fn func(directory.Tx) error) error {
	return f.Store.Update(ctx, func(tx directory.Tx) error {
		return fn(&failingTx{Tx: tx, left: f.failAt})
	})
}

type failingTx struct {
	directory.Tx
	left int
}

func (f *failingTx) tick() error {
	f.left--
	if f.left <= 0 {
		return errInjected
	}
	return nil
}

func (f *failingTx) PutTenant(ctx context.Context, t directory.Tenant) error {
	if err := f.tick(); err != nil {
		return err
	}
	return f.Tx.PutTenant(ctx, t)
}

func (f *failingTx) PutRole(ctx context.Context, r directory.Role) error {
	if err := f.tick(); err != nil {
		return err
	}
	return f.Tx.PutRole(ctx, r)
}

func (f *failingTx) DeleteRole(ctx context.Context, tenant, name string) error {
	if err := f.tick(); err != nil {
		return err
	}
	return f.Tx.DeleteRole(ctx, tenant, name)
}

func (f *failingTx) PutUser(ctx context.Context, u directory.User) error {
	if err := f.tick(); err != nil {
		return err
	}
	return f.Tx.PutUser(ctx, u)
}

func (f *failingTx) PutAgent(ctx context.Context, a directory.Agent) error {
	if err := f.tick(); err != nil {
		return err
	}
	return f.Tx.PutAgent(ctx, a)
}

func (s *suite) testApplyAtomic(t *testing.T) {
	t.Run("into an empty store", func(t *testing.T) {
		st := s.newStore(t)
		// The seed makes 16 writes; fail the 15th, deep into the second tenant.
		_, err := directory.Apply(ctx, failingStore{st, 15}, []byte(Seed))
		if !errors.Is(err, errInjected) {
			t.Fatalf("err = %v, want the injected failure", err)
		}
		for _, tenant := range []string{"acme", "globex"} {
			if _, err := snapshotErr(st, tenant); !errors.Is(err, directory.ErrNotFound) {
				t.Fatalf("tenant %s exists after a failed apply (err = %v)", tenant, err)
			}
		}
		if got := must(directory.Resolve(ctx, st, "acme", "alice", "")); got.Active {
			t.Fatal("alice resolves after a failed apply")
		}
	})
	t.Run("over existing data", func(t *testing.T) {
		st := s.seeded(t)
		before := snapshotAll(t, st)
		w := watch(t, st)
		next := strings.Replace(Seed, "      - {id: bob, org: finance, roles: [support]}\n", "", 1)
		next = strings.Replace(next, "      - {id: bob-bot, user: bob, host: interactive}\n", "", 1)
		next = strings.Replace(next, "admin: [directory.manage]", "admin: [directory.manage, directory.audit]", 1)
		_, err := directory.Apply(ctx, failingStore{st, 3}, []byte(next)) // role update, agent disable, then fail
		if !errors.Is(err, errInjected) {
			t.Fatalf("err = %v, want the injected failure", err)
		}
		if after := snapshotAll(t, st); !reflect.DeepEqual(before, after) {
			t.Fatalf("a failed apply left changes:\n%+v\n%+v", before, after)
		}
		if got := w.tenants(); got != "" {
			t.Fatalf("a failed apply announced changes for %q", got)
		}
	})
}

func (s *suite) testTx(t *testing.T) {
	st := s.seeded(t)
	t.Run("unknown tenant snapshot", func(t *testing.T) {
		if _, err := snapshotErr(st, "initech"); !errors.Is(err, directory.ErrNotFound) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("delete unknown role", func(t *testing.T) {
		err := st.Update(ctx, func(tx directory.Tx) error { return tx.DeleteRole(ctx, "acme", "nope") })
		if !errors.Is(err, directory.ErrNotFound) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("invalid values", func(t *testing.T) {
		tests := []struct {
			name string
			fn   func(directory.Tx) error
		}{
			{"empty tenant id", func(tx directory.Tx) error { return tx.PutTenant(ctx, directory.Tenant{}) }},
			{"blank feature", func(tx directory.Tx) error {
				return tx.PutTenant(ctx, directory.Tenant{ID: "x", Features: []string{""}})
			}},
			{"user id with a newline", func(tx directory.Tx) error {
				return tx.PutUser(ctx, directory.User{Tenant: "acme", ID: "a\nb"})
			}},
			{"over-long agent id", func(tx directory.Tx) error {
				return tx.PutAgent(ctx, directory.Agent{Tenant: "acme", ID: strings.Repeat("a", directory.MaxIDLength+1), UserID: "alice"})
			}},
			{"blank permission", func(tx directory.Tx) error {
				return tx.PutRole(ctx, directory.Role{Tenant: "acme", Name: "r", Permissions: []string{" "}})
			}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if err := st.Update(ctx, tt.fn); !errors.Is(err, directory.ErrInvalid) {
					t.Fatalf("err = %v, want ErrInvalid", err)
				}
			})
		}
	})
	t.Run("deleting a role removes it from its holders", func(t *testing.T) {
		st := s.seeded(t)
		if err := st.Update(ctx, func(tx directory.Tx) error { return tx.DeleteRole(ctx, "acme", "support") }); err != nil {
			t.Fatal(err)
		}
		got := must(directory.Resolve(ctx, st, "acme", "alice", ""))
		if strings.Join(got.Roles, ",") != "lead" || got.HasPermission("expense.report.submit") {
			t.Fatalf("alice after deleting support: %s", describe(got))
		}
		if got := must(directory.Resolve(ctx, st, "globex", "alice", "")); describe(got) != aliceGlobx {
			t.Fatalf("globex's support role went too: %s", describe(got))
		}
	})
	t.Run("a failed Update commits nothing", func(t *testing.T) {
		before := snapshotAll(t, st)
		boom := errors.New("boom")
		err := st.Update(ctx, func(tx directory.Tx) error {
			if err := tx.PutUser(ctx, directory.User{Tenant: "acme", ID: "zoe"}); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v", err)
		}
		if after := snapshotAll(t, st); !reflect.DeepEqual(before, after) {
			t.Fatal("a failed Update left changes")
		}
	})
	t.Run("a panic in Update commits nothing and releases the store", func(t *testing.T) {
		before := snapshotAll(t, st)
		func() {
			defer func() { _ = recover() }()
			_ = st.Update(ctx, func(tx directory.Tx) error {
				_ = tx.PutUser(ctx, directory.User{Tenant: "acme", ID: "zoe"})
				panic("kaboom")
			})
		}()
		if after := snapshotAll(t, st); !reflect.DeepEqual(before, after) {
			t.Fatal("a panicking Update left changes")
		}
		if err := directory.SetUserDisabled(ctx, st, "acme", "dave", false); err != nil {
			t.Fatalf("the store is unusable after a panic: %v", err)
		}
	})
	t.Run("reads inside Update see its writes", func(t *testing.T) {
		st := s.seeded(t)
		err := st.Update(ctx, func(tx directory.Tx) error {
			if err := tx.PutTenant(ctx, directory.Tenant{ID: "initech", Features: []string{"b", "a", "b"}}); err != nil {
				return err
			}
			if err := tx.PutRole(ctx, directory.Role{Tenant: "initech", Name: "r", Permissions: []string{"p2", "p1"}}); err != nil {
				return err
			}
			if err := tx.PutUser(ctx, directory.User{Tenant: "initech", ID: "u", Roles: []string{"r"}}); err != nil {
				return err
			}
			// A refused write leaves the transaction usable.
			if err := tx.PutAgent(ctx, directory.Agent{Tenant: "initech", ID: "a", UserID: "ghost"}); !errors.Is(err, directory.ErrReference) {
				return fmt.Errorf("agent for a missing user: got %w, want ErrReference", err)
			}
			if err := tx.PutAgent(ctx, directory.Agent{Tenant: "initech", ID: "a", UserID: "u"}); err != nil {
				return err
			}
			snap, err := tx.Snapshot(ctx, "initech")
			if err != nil {
				return err
			}
			if got := names(snap) + " features=" + strings.Join(snap.Tenant.Features, ","); got != "roles=r users=u agents=a features=a,b" {
				return fmt.Errorf("snapshot inside the transaction = %s", got)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := describe(must(directory.Resolve(ctx, st, "initech", "u", "a"))); got != "active perms=p1,p2 features=a,b org= roles=r" {
			t.Fatalf("initech/u/a = %s", got)
		}
	})
}

func (s *suite) testWatch(t *testing.T) {
	st := s.seeded(t)
	wctx, cancel := context.WithCancel(ctx)
	ch := st.Watch(wctx)
	got := make(chan string, 16)
	var wg sync.WaitGroup
	wg.Go(func() {
		for c := range ch {
			if c.Tenant != "" {
				got <- c.Tenant
			}
			c.Ack()
		}
	})
	err := st.Update(ctx, func(tx directory.Tx) error {
		if err := tx.PutUser(ctx, directory.User{Tenant: "globex", ID: "x"}); err != nil {
			return err
		}
		return tx.PutUser(ctx, directory.User{Tenant: "acme", ID: "x"})
	})
	if err != nil {
		t.Fatal(err)
	}
	// Changes made through the store itself are announced before Update returns.
	var tenants []string
	for len(got) > 0 {
		tenants = append(tenants, <-got)
	}
	if strings.Join(tenants, ",") != "acme,globex" {
		t.Fatalf("announced %v, want one change each for acme and globex", tenants)
	}
	cancel()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch channel was not closed after its context ended")
	}
}

func (s *suite) testConcurrent(t *testing.T) {
	st := s.seeded(t)
	cache := newCache(t, st)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 4 {
		wg.Go(func() {
			for j := range 50 {
				agent := []string{"", "support-bot", "bob-bot"}[(i+j)%3]
				user := map[string]string{"": "alice", "support-bot": "alice", "bob-bot": "bob"}[agent]
				if _, err := cache.Resolve(ctx, "acme", user, agent); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Go(func() {
		for j := range 10 {
			if err := directory.SetUserDisabled(ctx, st, "acme", "bob", j%2 == 0); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Ten toggles leave bob enabled; the cache must agree with the store.
	if got := describe(must(cache.Resolve(ctx, "acme", "bob", "bob-bot"))); got != bobAcme {
		t.Fatalf("after concurrent toggling: %s", got)
	}
}

// watcher records the tenants announced to one Watch subscription.
type watcher struct {
	mu   sync.Mutex
	seen []string
}

// tenants returns the non-empty tenants announced so far. Changes made in this process are
// announced before Update returns, so no waiting is needed.
func (w *watcher) tenants() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.seen, ",")
}

func watch(t *testing.T, st directory.Store) *watcher {
	t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	ch := st.Watch(wctx)
	w := &watcher{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for c := range ch {
			if c.Tenant != "" {
				w.mu.Lock()
				w.seen = append(w.seen, c.Tenant)
				w.mu.Unlock()
			}
			c.Ack()
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return w
}

func newCache(t *testing.T, st directory.Store) *directory.Cache {
	t.Helper()
	c := directory.NewCache(st, directory.CacheOptions{TTL: time.Hour})
	t.Cleanup(c.Close)
	return c
}

// warm resolves a principal twice so that it is cached (the second call is a hit).
func warm(t *testing.T, c *directory.Cache, tenant, user, agent string) {
	t.Helper()
	for range 2 {
		if _, err := c.Resolve(ctx, tenant, user, agent); err != nil {
			t.Fatal(err)
		}
	}
}

func resolve(t *testing.T, st directory.Store, tenant, user, agent string) directory.Resolution {
	t.Helper()
	r, err := directory.Resolve(ctx, st, tenant, user, agent)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func must(r directory.Resolution, err error) directory.Resolution {
	if err != nil {
		panic(err)
	}
	return r
}

func snapshotErr(st directory.Store, tenant string) (directory.Snapshot, error) {
	var snap directory.Snapshot
	err := st.Update(ctx, func(tx directory.Tx) error {
		var err error
		snap, err = tx.Snapshot(ctx, tenant)
		return err
	})
	return snap, err
}

func snapshot(t *testing.T, st directory.Store, tenant string) directory.Snapshot {
	t.Helper()
	snap, err := snapshotErr(st, tenant)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// snapshotAll captures the seed's tenants plus one that tests may create by mistake.
func snapshotAll(t *testing.T, st directory.Store) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, tenant := range []string{"acme", "globex", "initech", "x"} {
		snap, err := snapshotErr(st, tenant)
		switch {
		case errors.Is(err, directory.ErrNotFound):
			out[tenant] = "absent"
		case err != nil:
			t.Fatal(err)
		default:
			out[tenant] = fmt.Sprintf("%+v", snap)
		}
	}
	return out
}

func names(s directory.Snapshot) string {
	var roles, users, agents []string
	for _, r := range s.Roles {
		roles = append(roles, r.Name)
	}
	for _, u := range s.Users {
		users = append(users, u.ID)
	}
	for _, a := range s.Agents {
		agents = append(agents, a.ID)
	}
	return "roles=" + strings.Join(roles, ",") + " users=" + strings.Join(users, ",") + " agents=" + strings.Join(agents, ",")
}
