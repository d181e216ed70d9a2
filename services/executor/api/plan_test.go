package api_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// TestPlan (issue 29 §3, "what may I do now?"): the plan lists exactly
// the commands the caller may call — alice's support role gives her the
// five the catalog lists as her tools — each with whether a call waits for
// a human (lena's and bob's approval of an expense report does), and what
// its arguments decide in words (the refund's conditions). An agent the directory does not know gets no plan; asking leaves no audit row
// and no challenge. For every entry, Check of the command's declared
// example agrees: approval required where the plan says every call waits.
func TestPlan(t *testing.T) { eachStore(t, testPlan) }

func testPlan(t *testing.T, st stores) {
	e := start(t, st)
	client := mandatev1.NewExecutorServiceClient(e.conn)
	plan := func(tenant, user, agent string) (*mandatev1.PlanResponse, error) {
		return client.Plan(as(token(t, tenant, user, agent)), &mandatev1.PlanRequest{})
	}
	codes := func(r *mandatev1.PlanResponse) []string {
		var out []string
		for _, c := range r.GetCommands() {
			out = append(out, c.GetCommand())
		}
		slices.Sort(out)
		return out
	}
	alice, err := plan("acme", "alice", "support-bot")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := codes(alice), []string{"expense.report.create", "expense.report.recall", "expense.report.submit", "ticket.get", "ticket.search"}; !slices.Equal(got, want) {
		t.Fatalf("alice's plan %v, want %v", got, want)
	}
	carol, err := plan("acme", "carol", "finance-bot")
	if err != nil {
		t.Fatal(err)
	}
	byCode := map[string]*mandatev1.PlanEntry{}
	for _, c := range carol.GetCommands() {
		byCode[c.GetCommand()] = c
		t.Logf("carol: %s %s %s approver %q depends %q", c.GetCommand(), c.GetRisk(), c.GetVerdict(), c.GetApproverPermission(), c.GetDependsOn())
	}
	refund := byCode["ticket.refund"]
	if refund == nil || !slices.ContainsFunc(refund.GetDependsOn(), func(s string) bool { return strings.Contains(s, "refund-needs-a-human") }) {
		t.Fatalf("carol's refund in the plan: %v", refund)
	}
	if search := byCode["ticket.search"]; search == nil || search.GetVerdict() != mandatev1.Verdict_VERDICT_ALLOWED || len(search.GetDependsOn()) != 0 {
		t.Fatalf("carol's search in the plan: %v", search)
	}
	// The plan agrees with Check on each command's declared examples:
	// every call of a command the plan says waits for a human is not
	// allowed at once, and no call of one it says runs at once, with
	// nothing depending on its arguments, waits for a human.
	set := embedded(t)
	checked, waits := 0, 0
	for _, who := range [][3]string{{"acme", "alice", "support-bot"}, {"acme", "carol", "finance-bot"}, {"acme", "lena", ""}, {"acme", "bob", ""}} {
		p, err := plan(who[0], who[1], who[2])
		if err != nil {
			t.Fatal(err)
		}
		for _, entry := range p.GetCommands() {
			t.Logf("%s: %s %s %s approver %q", who, entry.GetCommand(), entry.GetRisk(), entry.GetVerdict(), entry.GetApproverPermission())
			cmd, _ := set.ByCode(entry.GetCommand())
			for _, ex := range cmd.Examples {
				v, err := client.Check(as(token(t, who[0], who[1], who[2])), &mandatev1.ExecuteRequest{Code: cmd.Code, InputJson: ex.Input, IdempotencyKey: "plan-" + cmd.Code})
				if err != nil {
					t.Fatal(err)
				}
				checked++
				if entry.GetVerdict() == mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED {
					waits++
				}
				switch {
				case entry.GetVerdict() == mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED && v.GetVerdict() == mandatev1.Verdict_VERDICT_ALLOWED:
					t.Errorf("%s: the plan says every call waits for a human; Check allows %s at once", who, cmd.Code)
				case entry.GetVerdict() == mandatev1.Verdict_VERDICT_ALLOWED && len(entry.GetDependsOn()) == 0 && v.GetVerdict() == mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED:
					t.Errorf("%s: the plan says %s runs at once; Check says it needs approval", who, cmd.Code)
				}
				if v.GetVerdict() == mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED && v.GetReason().GetApproverPermission() != entry.GetApproverPermission() {
					t.Errorf("%s %s: the plan names approver permission %q, Check %q", who, cmd.Code, entry.GetApproverPermission(), v.GetReason().GetApproverPermission())
				}
			}
		}
	}
	if checked < 5 || waits == 0 {
		t.Fatalf("%d examples checked, %d of a command that waits for a human", checked, waits)
	}
	if _, err := plan("acme", "alice", "ghost-bot"); refusal(err).GetCode() != "authorization.principal_inactive" {
		t.Fatalf("an agent unknown to the directory: its plan: %v", err)
	}
	// Check rows are written after the answer: wait for them.
	n := e.rowCount(t, "acme")
	for deadline := time.Now().Add(5 * time.Second); n < checked && time.Now().Before(deadline); n = e.rowCount(t, "acme") {
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d examples checked against the plans", checked)
	if n != checked {
		t.Fatalf("%d checks and the plans left %d audit rows, want one per check and none for a plan", checked, n)
	}
}
