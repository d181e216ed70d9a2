package simulate_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	genmanifest "github.com/mandate-dev/mandate/gen/manifest"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/executor/simulate"

	policy "github.com/mandate-dev/mandate/examples/policy"
)

// trail is what a trail of tenant acme recorded under the demo policy and
// the sample manifest: rows as the executor writes them.
func trail() []simulate.Row {
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Minute) }
	refund := func(minor string) json.RawMessage {
		return json.RawMessage(`{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"` + minor + `"},"reason":"charged twice","cardholder_reference":"[withheld]"}`)
	}
	return []simulate.Row{
		// carol refunds 0.50 herself: below the human threshold, it ran.
		{InvocationID: "inv-small", Phase: "intent", Time: at(1), Tenant: "acme", Channel: "rest", Command: "ticket.refund",
			UserID: "carol", ActorKind: "user", Outcome: "pending", Arguments: refund("50")},
		{InvocationID: "inv-small", Phase: "outcome", Time: at(1), Tenant: "acme", Channel: "rest", Command: "ticket.refund",
			UserID: "carol", ActorKind: "user", Outcome: "executed", Arguments: refund("50")},
		// finance-bot refunds 25.00 for carol, approved.
		{InvocationID: "inv-approved", Phase: "outcome", Time: at(2), Tenant: "acme", Channel: "mcp", Command: "ticket.refund",
			UserID: "carol", ActorKind: "agent", AgentID: "finance-bot", Approved: true, Outcome: "executed", Arguments: refund("2500")},
		// alice may not refund.
		{InvocationID: "inv-alice", Phase: "outcome", Time: at(3), Tenant: "acme", Channel: "mcp", Command: "ticket.refund",
			UserID: "alice", ActorKind: "agent", AgentID: "support-bot", Outcome: "refused", Stage: "permission_check", Code: "authorization.permission_denied", Arguments: refund("2500")},
		// alice searches.
		{InvocationID: "inv-search", Phase: "outcome", Time: at(4), Tenant: "acme", Channel: "mcp", Command: "ticket.search",
			UserID: "alice", ActorKind: "agent", AgentID: "support-bot", Outcome: "executed", Arguments: json.RawMessage(`{"query":"printer"}`)},
		// A key in flight says nothing of the policy.
		{InvocationID: "inv-inflight", Phase: "outcome", Time: at(5), Tenant: "acme", Channel: "rest", Command: "ticket.refund",
			UserID: "carol", ActorKind: "user", Outcome: "refused", Stage: "idempotency_check", Code: "idempotency.in_flight", Arguments: refund("2500")},
		// Nobody was authenticated.
		{InvocationID: "inv-anon", Phase: "outcome", Time: at(6), Tenant: "acme", Channel: "rest", Command: "ticket.refund",
			Outcome: "refused", Stage: "authenticate", Code: "authentication.invalid_token"},
		// carol declined finance-bot's refund: it needed a human, as it
		// still does.
		{InvocationID: "inv-declined", Phase: "outcome", Time: at(6), Tenant: "acme", Channel: "mcp", Command: "ticket.refund",
			UserID: "carol", ActorKind: "agent", AgentID: "finance-bot", Outcome: "refused", Stage: "confirmation_check", Code: "confirmation.refused", Arguments: refund("2500")},
		// A check row is not an attempt.
		{InvocationID: "inv-check", Phase: "check", Time: at(7), Tenant: "acme", Channel: "mcp", Command: "ticket.refund",
			UserID: "alice", ActorKind: "agent", AgentID: "support-bot", Outcome: "refused"},
	}
}

func demo(t *testing.T, edit func(string) string) directory.Policy {
	t.Helper()
	src := string(policy.Demo)
	if edit != nil {
		src = edit(src)
	}
	p, err := directory.ParsePolicy("candidate.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func sample(t *testing.T, edit func(*manifest.Manifest)) *manifest.Set {
	t.Helper()
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	if edit == nil {
		return set
	}
	var m manifest.Manifest
	if err := json.Unmarshal(set.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	edit(&m)
	raw, err := manifest.Encode(&m)
	if err != nil {
		t.Fatal(err)
	}
	out, err := manifest.Load(raw, genmanifest.DescriptorSet)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func run(t *testing.T, c simulate.Candidate) *simulate.Report {
	t.Helper()
	rep, err := simulate.Run(context.Background(), trail(), c)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Attempts != 7 || rep.Skipped[simulate.SkipNotPolicy] != 1 || rep.Skipped[simulate.SkipUnauthenticated] != 1 || rep.Skipped[simulate.SkipWithheld] != 0 {
		t.Fatalf("attempts %d, skipped %v (want 7 attempts; the key in flight and the unauthenticated call skipped)", rep.Attempts, rep.Skipped)
	}
	return rep
}

func changes(rep *simulate.Report) map[string]string {
	out := map[string]string{}
	for _, a := range rep.Changed {
		out[a.InvocationID] = string(a.Change) + ": " + a.Was.String() + " -> " + a.Now.String()
	}
	return out
}

// TestTheSamePolicyChangesNothing: the trail replayed through the policy
// and manifest that recorded it finds every verdict as it was — the
// withheld cardholder reference replaced by the declared example's.
func TestTheSamePolicyChangesNothing(t *testing.T) {
	rep := run(t, simulate.Candidate{Manifest: sample(t, nil), Policy: demo(t, nil)})
	if len(rep.Changed) != 0 || rep.Replayed != 5 || rep.Unchanged != 5 {
		t.Fatalf("replayed %d, unchanged %d, changed %v", rep.Replayed, rep.Unchanged, changes(rep))
	}
}

// TestAPolicyChangeIsReplayed: finance loses payment.refund and support
// gains it — carol's refunds (run, approved, declined) are newly refused at permission, alice's
// refused refund newly needs approval; the search stays as it was.
func TestAPolicyChangeIsReplayed(t *testing.T) {
	rep := run(t, simulate.Candidate{Manifest: sample(t, nil), Policy: demo(t, func(s string) string {
		s = strings.Replace(s, "finance: [ticket.read, payment.refund, customer.erase]", "finance: [ticket.read, customer.erase]", 1)
		return strings.Replace(s, "support: [ticket.read, expense.report.submit]", "support: [ticket.read, expense.report.submit, payment.refund]", 1)
	})})
	want := map[string]string{
		"inv-small":    "newly_refused: allowed -> refused at permission_check (authorization.permission_denied)",
		"inv-approved": "newly_refused: approval_required at confirmation_check (confirmation.required) -> refused at permission_check (authorization.permission_denied)",
		"inv-declined": "newly_refused: approval_required at confirmation_check (confirmation.required) -> refused at permission_check (authorization.permission_denied)",
		"inv-alice":    "newly_needs_approval: refused at permission_check (authorization.permission_denied) -> approval_required at confirmation_check (confirmation.required)",
	}
	got := changes(rep)
	if len(got) != len(want) || rep.Unchanged != 1 {
		t.Fatalf("changes %v, unchanged %d; want %v", got, rep.Unchanged, want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: %q, want %q", id, got[id], w)
		}
	}
	if rep.Count(simulate.NewlyRefused) != 3 || rep.Count(simulate.NewlyNeedsApproval) != 1 || rep.Count(simulate.NewlyPasses) != 0 {
		t.Fatalf("counts: %v", got)
	}
	for _, a := range rep.Changed {
		if !a.Approximate {
			t.Errorf("%s: a refund's cardholder reference was withheld, yet the replay is not marked approximate", a.InvocationID)
		}
	}
}

// TestAManifestChangeIsReplayed: the refund asks a human only from 100.00
// on: the approved and the declined 25.00 refunds newly pass.
func TestAManifestChangeIsReplayed(t *testing.T) {
	set := sample(t, func(m *manifest.Manifest) {
		for _, c := range m.Commands {
			for i := range c.Conditions {
				if c.Conditions[i].ID == "refund-needs-a-human" {
					c.Conditions[i].Expression = "request.amount.amount_minor >= 10000"
				}
			}
		}
	})
	rep := run(t, simulate.Candidate{Manifest: set, Policy: demo(t, nil)})
	got := changes(rep)
	pass := "newly_passes: approval_required at confirmation_check (confirmation.required) -> allowed"
	if len(got) != 2 || got["inv-approved"] != pass || got["inv-declined"] != pass {
		t.Fatalf("changes %v", got)
	}
}
