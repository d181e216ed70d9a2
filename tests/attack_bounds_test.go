package tests

import (
	"net/http"
	"strconv"
	"testing"
)

// TestAttackAgentCannotFloodApprovers: a headless agent asking for refund
// after refund opens at most 20 challenges for its user's approvers; every
// call past the cap is refused with confirmation.too_many_open (429,
// retriable) and audited, and opens nothing.
func TestAttackAgentCannotFloodApprovers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dev := startDev(t)
	bot := dev.tokens["payout-bot@carol"]
	const calls = 25
	opened, capped := 0, 0
	for i := range calls {
		input := `{"input":{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"` + strconv.Itoa(100+i) + `"},"reason":"Customer was charged twice","cardholder_reference":"CH4242424242"}}`
		code, body := do(t, http.MethodPost, dev.base+"/v1/commands/ticket.refund:execute", bot, input)
		switch {
		case code == http.StatusUnprocessableEntity && body["code"] == "confirmation.required":
			opened++
		case code == http.StatusTooManyRequests && body["code"] == "confirmation.too_many_open" && body["retriable"] == true:
			capped++
		default:
			t.Fatalf("call %d: %d %v", i, code, body)
		}
	}
	if opened != 20 || capped != calls-20 {
		t.Fatalf("%d challenges opened and %d calls capped, want 20 and %d", opened, capped, calls-20)
	}
	code, body := do(t, http.MethodGet, dev.base+"/v1/audit/records?command=ticket.refund&page_size=100", dev.tokens["olive"], "")
	recs, _ := body["records"].([]any)
	refusedAtCap := 0
	for _, r := range recs {
		if m, _ := r.(map[string]any); m["code"] == "confirmation.too_many_open" && m["stage"] == "confirmation_check" {
			refusedAtCap++
		}
	}
	if code != http.StatusOK || len(recs) != calls || refusedAtCap != calls-20 {
		t.Fatalf("audit: %d, %d rows (want %d), %d refused at the cap", code, len(recs), calls, refusedAtCap)
	}
}
