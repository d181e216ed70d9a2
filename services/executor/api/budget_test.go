package api_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// smallRefund is finance-bot's refund of amount minor units on T-1001:
// below 1.00 no condition asks a human.
func smallRefund(amount int) string {
	return fmt.Sprintf(`{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"%d"},"reason":"Goodwill gesture","cardholder_reference":"CH4242424242"}`, amount)
}

// TestBudgetOverEveryPath (issue 29 §2) runs the sample's refund budget —
// an agent refunds at most 50.00 per currency a day, and past it a human
// is asked — on both stores. finance-bot's 50 small refunds of 0.99 run
// without a human and spend 49.50; each key retried replays and spends
// nothing. Check then reports the budget without spending it: a refund of
// 0.50 still fits (allowed, used 4950), one of 0.99 does not (approval
// required, naming the limit, the limit's standing in the answer). The call
// of 0.99 opens an approval instead of being refused; once carol approves,
// the approved call runs past the ceiling; the user's own refunds are not
// counted by the agents' budget. The plan says the limit in words.
func TestBudgetOverEveryPath(t *testing.T) { eachStore(t, testBudgetOverEveryPath) }

func testBudgetOverEveryPath(t *testing.T, st stores) {
	e := start(t, st)
	ctx := context.Background()
	// T-1001 was paid 49.90: make it 1,000.00, so that the ticket's own
	// refundable amount never decides, the budget does.
	if err := e.helpdesk.InTx(ctx, func(tx helpdesk.Tx) error {
		tk, err := tx.TicketForUpdate(ctx, "acme", "T-1001")
		if err != nil {
			return err
		}
		tk.Paid.Minor = 100000
		return tx.UpdateTicket(ctx, tk)
	}); err != nil {
		t.Fatal(err)
	}
	bot := as(token(t, "acme", "carol", "finance-bot"))
	client := mandatev1.NewExecutorServiceClient(e.conn)
	for i := range 50 {
		if _, err := e.execute(t, bot, "ticket.refund", smallRefund(99), withKey(fmt.Sprint("small-", i))); err != nil {
			t.Fatalf("refund %d: %v (%v)", i, err, refusal(err))
		}
	}
	for i := range 3 {
		if _, err := e.execute(t, bot, "ticket.refund", smallRefund(99), withKey(fmt.Sprint("small-", i))); err != nil {
			t.Fatalf("retry %d: %v", i, err)
		}
	}
	if n := e.gateway.Refunds(); n != 50 {
		t.Fatalf("the gateway counted %d refunds, want 50", n)
	}

	// Check: what still fits is allowed; what does not needs a human.
	fits := e.check(t, bot, "ticket.refund", smallRefund(50))
	if fits.GetVerdict() != mandatev1.Verdict_VERDICT_ALLOWED || len(fits.GetLimits()) != 1 {
		t.Fatalf("a refund of 0.50 checked %v with limits %v, want allowed", fits.GetVerdict(), fits.GetLimits())
	}
	if l := fits.GetLimits()[0]; l.GetId() != "agent-daily-refunds" || !l.GetFits() || l.GetUsed() != 4950 || l.GetNeeds() != 50 || l.GetMax() != 5000 {
		t.Fatalf("the limit as checked: %v, want 4950 of 5000 used, fits 50", l)
	}
	for range 2 { // a check spends nothing: twice the same answer
		over := e.check(t, bot, "ticket.refund", smallRefund(99))
		if over.GetVerdict() != mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED || over.GetReason().GetCode() != "confirmation.required" ||
			!strings.Contains(over.GetReason().GetMessage(), "agent-daily-refunds") {
			t.Fatalf("a refund past the budget checked %v %v", over.GetVerdict(), over.GetReason())
		}
		if l := over.GetLimits(); len(l) != 1 || l[0].GetFits() || !l[0].GetEscalates() || l[0].GetUsed() != 4950 {
			t.Fatalf("the limit as checked: %v", l)
		}
	}

	// The call itself: an approval, not a refusal.
	_, err := e.execute(t, bot, "ticket.refund", smallRefund(99), withKey("over-1"))
	ce := refusal(err)
	if ce.GetCode() != "confirmation.required" || ce.GetChallengeId() == "" || !strings.Contains(ce.GetMessage(), "agent-daily-refunds") {
		t.Fatalf("the refund past the budget: %v (%v)", err, ce)
	}
	if _, err := e.confirm.Decide(ctx, carol, ce.GetChallengeId(), true, "api"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.execute(t, bot, "ticket.refund", smallRefund(99), withKey("over-1"), func(r *mandatev1.ExecuteRequest) { r.ApprovalGrantId = ce.GetChallengeId() }); err != nil {
		t.Fatalf("the approved refund past the budget: %v (%v)", err, refusal(err))
	}
	after := e.check(t, bot, "ticket.refund", smallRefund(1))
	if l := after.GetLimits(); len(l) != 1 || l[0].GetUsed() != 5049 {
		t.Fatalf("after the approved refund the limit stands at %v, want 5049 used", l)
	}
	// carol's own refund is not an agent's: no limit counts it.
	if own := e.check(t, as(token(t, "acme", "carol", "")), "ticket.refund", smallRefund(99)); own.GetVerdict() != mandatev1.Verdict_VERDICT_ALLOWED || len(own.GetLimits()) != 0 {
		t.Fatalf("carol's own refund checked %v with limits %v", own.GetVerdict(), own.GetLimits())
	}
	plan, err := client.Plan(bot, &mandatev1.PlanRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range plan.GetCommands() {
		if c.GetCommand() == "ticket.refund" && !strings.Contains(strings.Join(c.GetDependsOn(), "|"), "agent-daily-refunds") {
			t.Errorf("the plan's refund does not say its limit: %v", c.GetDependsOn())
		}
	}
}
