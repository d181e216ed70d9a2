package catalog_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/tooldesc"
	"github.com/mandate-dev/mandate/services/catalog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// policy is the demo directory plus erin, who holds the expense
// permissions in a tenant without the expenses feature.
const policy = `
tenants:
  - id: acme
    features: [refunds, expenses]
    roles:
      support: [ticket.read, expense.report.submit]
      manager: [ticket.read, expense.report.approve]
      finance: [ticket.read, payment.refund]
      ops: [ops.read, audit.read]
    users:
      - {id: alice, org: support, roles: [support]}
      - {id: bob, org: support, roles: [manager]}
      - {id: carol, org: finance, roles: [finance]}
      - {id: olive, org: ops, roles: [ops]}
      - {id: mallory, roles: [support], disabled: true}
    agents:
      - {id: support-bot, user: alice}
      - {id: finance-bot, user: carol}
  - id: globex
    features: [refunds]
    roles:
      support: [ticket.read, payment.refund]
      clerk: [ticket.read, expense.report.submit]
    users:
      - {id: dave, org: support, roles: [support]}
      - {id: erin, roles: [clerk]}
`

var (
	aliceTools = []string{"expense.report.create", "expense.report.recall", "expense.report.submit", "ticket.get", "ticket.search"}
	carolTools = []string{"ticket.get", "ticket.refund", "ticket.search"}
)

type fixture struct {
	cat *catalog.Catalog
	dir *memory.Store
	set *manifest.Set
}

func newFixture(t *testing.T, cfg catalog.Config) *fixture {
	t.Helper()
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	dir := memory.New()
	if _, err := directory.Apply(context.Background(), dir, []byte(policy)); err != nil {
		t.Fatal(err)
	}
	cfg.Manifest, cfg.Directory = set, dir
	cat, err := catalog.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cat.Close)
	return &fixture{cat: cat, dir: dir, set: set}
}

func user(tenant, id string) identity.Principal {
	return identity.Principal{Kind: identity.KindUser, Tenant: tenant, UserID: id}
}

func agent(tenant, userID, id string) identity.Principal {
	return identity.Principal{Kind: identity.KindAgent, Tenant: tenant, UserID: userID, AgentID: id}
}

func relayed(p identity.Principal, via string) identity.Principal { p.Via = via; return p }

func code(err error) string {
	var fe *failure.Error
	if errors.As(err, &fe) {
		return fe.Code
	}
	return ""
}

func TestNewValidates(t *testing.T) {
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.New(catalog.Config{Directory: memory.New()}); err == nil {
		t.Error("New without a manifest succeeded")
	}
	if _, err := catalog.New(catalog.Config{Manifest: set}); err == nil {
		t.Error("New without a directory succeeded")
	}
}

func TestToolsPerPrincipal(t *testing.T) {
	f := newFixture(t, catalog.Config{})
	cases := []struct {
		name   string
		p      identity.Principal
		want   []string
		reason string
	}{
		{"alice: tickets and her expense workflow", user("acme", "alice"), aliceTools, ""},
		{"support-bot sees exactly alice's set", agent("acme", "alice", "support-bot"), aliceTools, ""},
		{"bob: approves, never submits", user("acme", "bob"), []string{"expense.report.approve", "ticket.get", "ticket.search"}, ""},
		{"carol: tickets including refunds", user("acme", "carol"), carolTools, ""},
		{"olive: the review only", user("acme", "olive"), []string{"ops.review"}, ""},
		{"dave: refunds in globex", user("globex", "dave"), carolTools, ""},
		{"erin holds expense permissions but globex lacks the feature", user("globex", "erin"), []string{"ticket.get", "ticket.search"}, ""},
		{"disabled user", user("acme", "mallory"), nil, directory.ReasonUserDisabled},
		{"carol's agent claiming to act for alice", agent("acme", "alice", "finance-bot"), nil, directory.ReasonAgentWrongUser},
		{"unregistered agent", agent("acme", "alice", "rogue-bot"), nil, directory.ReasonAgentNotRegistered},
		{"alice of another tenant", user("globex", "alice"), nil, directory.ReasonUserUnknown},
		{"unknown tenant", user("initech", "alice"), nil, directory.ReasonTenantUnknown},
		{"a service with no user", identity.Principal{Kind: identity.KindService, ServiceName: "executor"}, nil, directory.ReasonTenantUnknown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts, err := f.cat.Tools(context.Background(), tc.p)
			if err != nil {
				t.Fatal(err)
			}
			if got := ts.Names(); !slices.Equal(got, tc.want) && (len(got) != 0 || len(tc.want) != 0) {
				t.Fatalf("tools %v, want %v", got, tc.want)
			}
			if ts.Active != (tc.reason == "") || ts.Reason != tc.reason {
				t.Fatalf("active %v reason %q, want reason %q", ts.Active, ts.Reason, tc.reason)
			}
			if ts.ManifestDigest != f.set.Digest() {
				t.Fatalf("digest %q", ts.ManifestDigest)
			}
			for _, tool := range ts.Tools {
				want, err := manifest.Canonical(tooldesc.FromCommand(tool.Command, tooldesc.Options{}), false)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(tool.JSON, want) || tool.Descriptor.Name != tool.Name() {
					t.Fatalf("%s: descriptor JSON is not tooldesc's", tool.Name())
				}
			}
		})
	}
}

func TestVisible(t *testing.T) {
	active := directory.Resolution{Active: true, Features: []string{"refunds"}, Permissions: []string{"payment.refund", "ticket.read"}}
	cmd := func(lifecycle, feature string, perms ...string) *manifest.Command {
		return &manifest.Command{Code: "x.y", Lifecycle: lifecycle, RequiredFeature: feature, Permissions: perms}
	}
	cases := []struct {
		name string
		cmd  *manifest.Command
		res  directory.Resolution
		want bool
	}{
		{"published, entitled, permitted", cmd("PUBLISHED", "refunds", "payment.refund", "ticket.read"), active, true},
		{"deprecated is still listed", cmd("DEPRECATED", "", "ticket.read"), active, true},
		{"draft is never listed", cmd("DRAFT", "", "ticket.read"), active, false},
		{"no permissions: every active principal", cmd("PUBLISHED", ""), active, true},
		{"missing feature", cmd("PUBLISHED", "expenses", "ticket.read"), active, false},
		{"one of two permissions missing", cmd("PUBLISHED", "", "ticket.read", "ticket.write"), active, false},
		{"inactive principal sees nothing", cmd("PUBLISHED", ""), directory.Resolution{Reason: directory.ReasonUserDisabled}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := catalog.Visible(tc.cmd, tc.res); got != tc.want {
				t.Fatalf("Visible = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestToolRefusesInvisibleCommands(t *testing.T) {
	f := newFixture(t, catalog.Config{})
	ctx := context.Background()
	tool, err := f.cat.Tool(ctx, user("acme", "carol"), "ticket.refund")
	if err != nil || tool.Name() != "ticket.refund" {
		t.Fatalf("carol's refund tool: %v %v", tool, err)
	}
	for _, tc := range []struct {
		p    identity.Principal
		code string
	}{
		{user("acme", "alice"), "ticket.refund"},
		{agent("acme", "alice", "support-bot"), "ticket.refund"},
		{user("acme", "alice"), "no.such_command"},
		{user("globex", "erin"), "expense.report.create"},
		{user("acme", "mallory"), "ticket.search"},
	} {
		if _, err := f.cat.Tool(ctx, tc.p, tc.code); code(err) != failure.CodeCommandNotFound {
			t.Errorf("%s/%s: %v, want %s", tc.p.Subject(), tc.code, err, failure.CodeCommandNotFound)
		}
	}
}

func TestManifestAndSlices(t *testing.T) {
	f := newFixture(t, catalog.Config{})
	ctx := context.Background()
	raw, err := f.cat.Manifest(ctx, user("acme", "olive"))
	if err != nil || !bytes.Equal(raw, f.set.Bytes()) {
		t.Fatalf("olive's manifest: equal=%v err=%v", bytes.Equal(raw, f.set.Bytes()), err)
	}
	if _, err := f.cat.Manifest(ctx, user("acme", "alice")); code(err) != failure.CodeAuthorizationPermissionDenied {
		t.Fatalf("alice reading the manifest: %v", err)
	}
	if _, err := f.cat.Manifest(ctx, user("acme", "mallory")); code(err) != failure.CodeAuthorizationPrincipalInactive {
		t.Fatalf("disabled user reading the manifest: %v", err)
	}

	for _, c := range f.set.Commands() {
		slice, err := f.cat.CommandSlice(ctx, user("acme", "olive"), c.Code)
		if err != nil {
			t.Fatalf("olive's slice of %s: %v", c.Code, err)
		}
		if bytes.Count(f.set.Bytes(), slice) != 1 || slice[0] != '{' || slice[len(slice)-1] != '}' {
			t.Fatalf("slice of %s is not a verbatim object of the manifest", c.Code)
		}
		var decoded manifest.Command
		if err := json.Unmarshal(slice, &decoded); err != nil {
			t.Fatal(err)
		}
		got, _ := manifest.Canonical(&decoded, false)
		want, _ := manifest.Canonical(c, false)
		if !bytes.Equal(got, want) {
			t.Fatalf("slice of %s decodes to another command", c.Code)
		}
	}
	if _, err := f.cat.CommandSlice(ctx, user("acme", "alice"), "ticket.get"); err != nil {
		t.Fatalf("alice's slice of her own tool: %v", err)
	}
	for _, c := range []string{"ticket.refund", "ops.review", "nope.nope"} {
		if _, err := f.cat.CommandSlice(ctx, user("acme", "alice"), c); code(err) != failure.CodeCommandNotFound {
			t.Errorf("alice's slice of %s: %v", c, err)
		}
	}
}

func TestReviewIsForRelayedOpsReaders(t *testing.T) {
	f := newFixture(t, catalog.Config{TrustedServices: []string{"executor"}})
	ctx := context.Background()
	olive := user("acme", "olive")
	if _, err := f.cat.Review(ctx, olive, false); code(err) != failure.CodeScopeNotViaExecutor {
		t.Fatalf("direct review: %v", err)
	}
	if _, err := f.cat.Review(ctx, relayed(olive, "mcpbridge"), false); code(err) != failure.CodeScopeNotViaExecutor {
		t.Fatalf("review relayed by an untrusted service: %v", err)
	}
	if _, err := f.cat.Review(ctx, relayed(user("acme", "alice"), "executor"), false); code(err) != failure.CodeAuthorizationPermissionDenied {
		t.Fatalf("alice's review: %v", err)
	}
	if _, err := f.cat.Review(ctx, relayed(user("acme", "mallory"), "executor"), false); code(err) != failure.CodeAuthorizationPrincipalInactive {
		t.Fatalf("disabled user's review: %v", err)
	}
	r, err := f.cat.Review(ctx, relayed(olive, "executor"), false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(hits(r.Findings), hits(catalog.Review(f.set.Manifest(), tooldesc.Options{}))) || r.ManifestDigest != f.set.Digest() || r.Prompt != "" {
		t.Fatalf("report %+v", r)
	}
	r, err = f.cat.Review(ctx, relayed(olive, "executor"), true)
	if err != nil || r.Prompt != catalog.ToPrompt(f.set.Manifest(), tooldesc.Options{}) {
		t.Fatalf("narrated report: %v", err)
	}
}

// TestConfirmSideEffects checks that the tools the catalog lists state the
// deployment's --confirm-side-effects as the executor enforces it:
// expense.report.submit (side effects, DEFAULT confirmation, L2) is listed
// with confirmation required only when the setting is on, and the narrated
// review says the same.
func TestConfirmSideEffects(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name                 string
		on                   bool
		submit, create, read bool // confirmation_required of submit, create, search
	}{
		{"off", false, false, false, false},
		{"on", true, true, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, catalog.Config{ConfirmSideEffects: tc.on, TrustedServices: []string{"executor"}})
			submit, ok := f.set.ByCode("expense.report.submit")
			if !ok || len(submit.SideEffects) == 0 || submit.Confirmation != "DEFAULT" || manifest.RiskLevel(submit.Risk) >= 3 || submit.ConfirmationRequired {
				t.Fatalf("expense.report.submit is no longer a low-risk DEFAULT command with side effects: %+v", submit)
			}
			ts, err := f.cat.Tools(ctx, user("acme", "alice"))
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]bool{"expense.report.submit": tc.submit, "expense.report.create": tc.create, "ticket.search": tc.read}
			for _, tool := range ts.Tools {
				w, ok := want[tool.Name()]
				if !ok {
					continue
				}
				delete(want, tool.Name())
				var desc struct {
					Meta map[string]any `json:"_meta"`
				}
				if err := json.Unmarshal(tool.JSON, &desc); err != nil {
					t.Fatal(err)
				}
				if got := desc.Meta["mandate.dev/confirmation_required"]; got != w || tool.Descriptor.Meta[tooldesc.MetaConfirmationRequired] != w {
					t.Errorf("%s: confirmation_required %v, want %v", tool.Name(), got, w)
				}
			}
			if len(want) > 0 {
				t.Fatalf("alice does not see %v", want)
			}
			r, err := f.cat.Review(ctx, relayed(user("acme", "olive"), "executor"), true)
			if err != nil {
				t.Fatal(err)
			}
			line := "- expense.report.submit: published, risk L2, side effects email, permissions expense.report.submit, feature expenses, reversible by expense.report.recall, confirmation not required,"
			if tc.on {
				line = strings.Replace(line, "not required", "required", 1)
			}
			if !strings.Contains(r.Prompt, line) || strings.Contains(r.Prompt, "--confirm-side-effects is on") != tc.on {
				t.Fatalf("narrated review does not state the deployment's confirmation:\n%s", r.Prompt)
			}
		})
	}
}

// watch runs Watch for p in the background and hands over its events.
func watch(t *testing.T, cat *catalog.Catalog, p identity.Principal) <-chan catalog.Event {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan catalog.Event, 16)
	done := make(chan error, 1)
	go func() {
		done <- cat.Watch(ctx, p, func(e catalog.Event) error { events <- e; return nil })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
	return events
}

func next(t *testing.T, events <-chan catalog.Event) catalog.Event {
	t.Helper()
	select {
	case e := <-events:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
		return catalog.Event{}
	}
}

func TestWatchFollowsTheDirectory(t *testing.T) {
	f := newFixture(t, catalog.Config{})
	ctx := context.Background()
	alice, bot := watch(t, f.cat, user("acme", "alice")), watch(t, f.cat, agent("acme", "alice", "support-bot"))
	for _, events := range []<-chan catalog.Event{alice, bot} {
		if e := next(t, events); e.Kind != catalog.EventSnapshot || !slices.Equal(e.Set.Names(), aliceTools) || len(e.Added)+len(e.Removed) != 0 {
			t.Fatalf("snapshot %+v", e)
		}
	}

	// Changes that leave alice's set alone send nothing: the next event
	// either stream sees is the one about alice.
	if err := directory.SetUserDisabled(ctx, f.dir, "acme", "carol", true); err != nil {
		t.Fatal(err)
	}
	if err := directory.SetUserDisabled(ctx, f.dir, "globex", "dave", true); err != nil {
		t.Fatal(err)
	}
	if err := directory.SetUserDisabled(ctx, f.dir, "acme", "alice", true); err != nil {
		t.Fatal(err)
	}
	for _, events := range []<-chan catalog.Event{alice, bot} {
		e := next(t, events)
		if e.Kind != catalog.EventChanged || len(e.Set.Tools) != 0 || e.Set.Active || e.Set.Reason != directory.ReasonUserDisabled ||
			!slices.Equal(e.Removed, aliceTools) || len(e.Added) != 0 {
			t.Fatalf("after disabling alice: %+v", e)
		}
	}

	if err := directory.SetUserDisabled(ctx, f.dir, "acme", "alice", false); err != nil {
		t.Fatal(err)
	}
	// Enabling alice again does not revive a stream opened with a token
	// issued before she was disabled; a token issued since sees her tools.
	select {
	case e := <-alice:
		if e.Set.Active || len(e.Added) != 0 {
			t.Fatalf("a stream of a token from before the revocation came back: %+v", e)
		}
	case <-time.After(300 * time.Millisecond):
	}
	res, err := directory.Direct(f.dir).Resolve(ctx, "acme", "alice", "")
	if err != nil {
		t.Fatal(err)
	}
	fresh := user("acme", "alice")
	fresh.IssuedAt = res.NotBefore()
	alice = watch(t, f.cat, fresh)
	if e := next(t, alice); e.Kind != catalog.EventSnapshot || !slices.Equal(e.Set.Names(), aliceTools) {
		t.Fatalf("a token issued after enabling alice: %+v", e)
	}
	// A role gaining a permission adds exactly the tools it unlocks.
	if err := f.dir.Update(ctx, func(tx directory.Tx) error {
		return tx.PutRole(ctx, directory.Role{Tenant: "acme", Name: "support", Permissions: []string{"ticket.read", "expense.report.submit", "payment.refund"}})
	}); err != nil {
		t.Fatal(err)
	}
	if e := next(t, alice); e.Kind != catalog.EventChanged || !slices.Equal(e.Added, []string{"ticket.refund"}) || len(e.Removed) != 0 {
		t.Fatalf("after granting payment.refund: %+v", e)
	}
	// The tenant losing its feature removes the tools it gated.
	if err := f.dir.Update(ctx, func(tx directory.Tx) error {
		return tx.PutTenant(ctx, directory.Tenant{ID: "acme", Features: []string{"expenses"}})
	}); err != nil {
		t.Fatal(err)
	}
	if e := next(t, alice); e.Kind != catalog.EventChanged || !slices.Equal(e.Removed, []string{"ticket.refund"}) {
		t.Fatalf("after dropping the refunds feature: %+v", e)
	}
}

func TestToolsSeeADisabledUserAtOnce(t *testing.T) {
	f := newFixture(t, catalog.Config{})
	ctx := context.Background()
	for range 2 { // the second call is served from the cache
		if ts, err := f.cat.Tools(ctx, agent("acme", "alice", "support-bot")); err != nil || len(ts.Tools) != len(aliceTools) {
			t.Fatalf("before: %v %v", ts.Names(), err)
		}
	}
	if err := directory.SetUserDisabled(ctx, f.dir, "acme", "alice", true); err != nil {
		t.Fatal(err)
	}
	if ts, err := f.cat.Tools(ctx, agent("acme", "alice", "support-bot")); err != nil || len(ts.Tools) != 0 || ts.Active {
		t.Fatalf("after disabling alice: %v %v", ts.Names(), err)
	}
}

func TestWatchEndsWhenSendFails(t *testing.T) {
	f := newFixture(t, catalog.Config{})
	boom := errors.New("client gone")
	err := f.cat.Watch(context.Background(), user("acme", "alice"), func(catalog.Event) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Watch = %v, want the send error", err)
	}
}

// BenchmarkTools measures ListTools' domain work for a cached principal:
// one directory cache hit and one memo hit.
func BenchmarkTools(b *testing.B) {
	set, err := manifest.Embedded()
	if err != nil {
		b.Fatal(err)
	}
	dir := memory.New()
	if _, err := directory.Apply(context.Background(), dir, []byte(policy)); err != nil {
		b.Fatal(err)
	}
	cat, err := catalog.New(catalog.Config{Manifest: set, Directory: dir})
	if err != nil {
		b.Fatal(err)
	}
	defer cat.Close()
	p := agent("acme", "alice", "support-bot")
	b.ReportAllocs()
	for b.Loop() {
		if ts, err := cat.Tools(context.Background(), p); err != nil || len(ts.Tools) != len(aliceTools) {
			b.Fatal(ts.Names(), err)
		}
	}
}
