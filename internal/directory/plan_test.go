package directory_test

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/directory/memory"
)

const planBase = `
tenants:
  - id: acme
    features: [refunds]
    roles: {support: [ticket.read], finance: [payment.refund]}
    users: [{id: alice, roles: [support]}, {id: carol, roles: [finance]}, {id: dora, disabled: true}]
    agents: [{id: bot, user: alice}, {id: old-bot, user: carol, disabled: true}]
`

// TestPlanMatchesApply: PlanPolicy names exactly what ApplyPolicy then
// counts, writes nothing itself, and plans nothing once applied.
func TestPlanMatchesApply(t *testing.T) {
	cases := []struct {
		name  string
		start string // applied first ("" for an empty store)
		next  string
		want  []string
	}{
		{"empty store", "", planBase, []string{
			"add tenant acme", "add role acme/finance", "add role acme/support",
			"add user acme/alice", "add user acme/carol", "add user acme/dora", "add agent acme/bot", "add agent acme/old-bot"}},
		{"same file", planBase, planBase, nil},
		{"changes and removals", planBase, `
tenants:
  - id: acme
    features: [refunds, expenses]
    roles: {support: [ticket.read, ticket.assign]}
    users: [{id: alice, roles: [support]}, {id: erin, roles: [support]}]
  - id: globex
    roles: {support: [ticket.read]}
`, []string{
			"change tenant acme", "change role acme/support", "remove role acme/finance",
			"add user acme/erin", "remove user acme/carol", "remove agent acme/bot",
			"add tenant globex", "add role globex/support"}},
		{"a limit override added", planBase, strings.Replace(planBase, "    features: [refunds]\n",
			"    features: [refunds]\n    limits: {ticket.refund/agent-daily-refunds: {max: 10000}}\n", 1),
			[]string{"change tenant acme"}},
		{"a limit override's window changed", strings.Replace(planBase, "    features: [refunds]\n",
			"    features: [refunds]\n    limits: {ticket.refund/agent-daily-refunds: {max: 10000}}\n", 1),
			strings.Replace(planBase, "    features: [refunds]\n",
				"    features: [refunds]\n    limits: {ticket.refund/agent-daily-refunds: {max: 10000, window: 12h}}\n", 1),
			[]string{"change tenant acme"}},
		{"the same limit override, spelled differently", strings.Replace(planBase, "    features: [refunds]\n",
			"    features: [refunds]\n    limits: {ticket.refund/agent-daily-refunds: {window: 12h}}\n", 1),
			strings.Replace(planBase, "    features: [refunds]\n",
				"    features: [refunds]\n    limits:\n      ticket.refund/agent-daily-refunds:\n        window: 720m\n", 1),
			nil},
		{"a limit override removed", strings.Replace(planBase, "    features: [refunds]\n",
			"    features: [refunds]\n    limits: {ticket.refund/agent-daily-refunds: {max: 10000}}\n", 1),
			planBase, []string{"change tenant acme"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := memory.New()
			if tc.start != "" {
				if _, err := directory.Apply(ctx, s, []byte(tc.start)); err != nil {
					t.Fatal(err)
				}
			}
			pol, err := directory.ParsePolicy("p.yaml", []byte(tc.next))
			if err != nil {
				t.Fatal(err)
			}
			before := snapshots(t, s, pol)
			plan, err := directory.PlanPolicy(ctx, s, pol)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range plan.Changes {
				got = append(got, c.String())
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			if after := snapshots(t, s, pol); !reflect.DeepEqual(before, after) {
				t.Errorf("PlanPolicy wrote to the store:\nbefore %+v\nafter  %+v", before, after)
			}
			sum, err := directory.ApplyPolicy(ctx, s, pol)
			if err != nil {
				t.Fatal(err)
			}
			if sum != plan.Summary() {
				t.Errorf("ApplyPolicy changed %s, the plan said %s", sum, plan.Summary())
			}
			again, err := directory.PlanPolicy(ctx, s, pol)
			if err != nil {
				t.Fatal(err)
			}
			if len(again.Changes) != 0 {
				t.Errorf("after applying, the plan still has %v", again.Changes)
			}
		})
	}
}

// snapshots reads every tenant the policy names; a missing one reads as
// the zero Snapshot.
func snapshots(t *testing.T, s directory.Store, pol directory.Policy) []directory.Snapshot {
	t.Helper()
	var out []directory.Snapshot
	err := s.Update(context.Background(), func(tx directory.Tx) error {
		out = nil
		for _, want := range pol.Tenants {
			snap, _ := tx.Snapshot(context.Background(), want.Tenant.ID)
			out = append(out, snap)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
