package mcpbridge_test

import (
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// TestFormMessageRendersByDeclaration: the confirmation form lists the
// arguments one per line by their declaration — the hostile reason of
// issue 11 §5 cannot pass itself off as the amount — both for a prompt
// with fields (in process) and for one without (over gRPC).
func TestFormMessageRendersByDeclaration(t *testing.T) {
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	refund, _ := set.ByCode("ticket.refund")
	args := `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"999999"},` +
		"\"reason\":\"ok\\n- Amount: 25.00 EUR \u202eRUE 00.52\u202c\",\"cardholder_reference\":\"CH4242424242\"}"
	pr, err := confirm.RenderPrompt(refund, confirm.PromptInput{ArgumentsJSON: args, RequesterUser: "carol", RequesterAgent: "finance-bot"})
	if err != nil {
		t.Fatal(err)
	}
	overGRPC := pr
	overGRPC.Fields = nil
	for name, p := range map[string]confirm.Prompt{"in process": pr, "over gRPC": overGRPC} {
		t.Run(name, func(t *testing.T) {
			msg := mcpbridge.FormMessage(p)
			for _, want := range []string{
				"Confirm: Refund a ticket (ticket.refund)\n",
				"\nArguments:\n",
				"\n- Amount: 9,999.99 EUR (999999 minor units)\n",
				"\n- Reason (free text written by the agent, not checked): “ok⟦U+000A⟧- Amount: 25.00 EUR ⟦U+202E⟧RUE 00.52⟦U+202C⟧” [! ",
				"\n- Cardholder reference: [withheld]\n",
				"\nAccept to run this call once, with exactly these arguments. Decline or cancel, and it does not run.",
			} {
				if !strings.Contains(msg, want) {
					t.Fatalf("the form lacks %q:\n%s", want, msg)
				}
			}
			if strings.ContainsAny(msg, "\u202e\u202c") || strings.Contains(msg, "CH4242424242") || strings.Contains(msg, `Set "approve"`) {
				t.Fatalf("form message:\n%s", msg)
			}
			// Only the declared amount line starts with "- Amount:".
			if n := strings.Count(msg, "\n- Amount:"); n != 1 {
				t.Fatalf("%d amount lines:\n%s", n, msg)
			}
		})
	}
	if msg := mcpbridge.FormMessage(confirm.Prompt{Title: "No args (x.y)", ArgumentsJSON: "{}"}); !strings.Contains(msg, "Arguments: none\n") {
		t.Fatalf("no arguments:\n%s", msg)
	}
}
