package mcpbridge_test

import (
	"context"
	"strings"
	"testing"
	"time"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmmem "github.com/mandate-dev/mandate/services/confirm/memory"
	"github.com/mandate-dev/mandate/services/executor"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// TestFormMessageRendersByDeclaration: the confirmation form lists the
// arguments one per line as the confirm service renders them by their
// declaration — the hostile reason of issue 11 §5 cannot pass itself off
// as the amount.
func TestFormMessageRendersByDeclaration(t *testing.T) {
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	store := confirmmem.New(confirmmem.Options{})
	t.Cleanup(store.Close)
	dir := directoryOf(t, policy)
	svc, err := confirm.New(confirm.Config{Store: store, Directory: dir, Commands: set, ApprovalBaseURL: "http://approve.test"})
	if err != nil {
		t.Fatal(err)
	}
	args := `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"999999"},` +
		"\"reason\":\"ok\\n- Amount: 25.00 EUR \u202eRUE 00.52\u202c\",\"cardholder_reference\":\"CH4242424242\"}"
	viaExecutor := carolFinanceBot
	viaExecutor.Via = executor.ServiceName
	c, err := svc.Open(context.Background(), viaExecutor, confirm.OpenRequest{
		Command: "ticket.refund", InvocationDigest: strings.Repeat("ab", 32), InvocationID: "inv-form", ArgumentsJSON: args,
	})
	if err != nil {
		t.Fatal(err)
	}
	msg := mcpbridge.FormMessage(wirePrompt(t, svc, carolFinanceBot, c.ID))
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
	if msg := mcpbridge.FormMessage(&mandatev1.Prompt{Title: "No args (x.y)", ArgumentsJson: "{}"}); !strings.Contains(msg, "Arguments: none\n") {
		t.Fatalf("no arguments:\n%s", msg)
	}
	if strings.Contains(msg, "What it will do") {
		t.Fatalf("a prompt without a preview lists effects:\n%s", msg)
	}
}

// TestFormMessageShowsThePreview: the effect lines of the backend's preview come before the
// arguments, neutralised by the confirm service: a bidi control in a line is a marker.
func TestFormMessageShowsThePreview(t *testing.T) {
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	store := confirmmem.New(confirmmem.Options{})
	t.Cleanup(store.Close)
	svc, err := confirm.New(confirm.Config{Store: store, Directory: directoryOf(t, policy), Commands: set, ApprovalBaseURL: "http://approve.test"})
	if err != nil {
		t.Fatal(err)
	}
	viaExecutor := carolFinanceBot
	viaExecutor.Via = executor.ServiceName
	c, err := svc.Open(context.Background(), viaExecutor, confirm.OpenRequest{
		Command: "ticket.refund", InvocationDigest: strings.Repeat("ab", 32), InvocationID: "inv-preview", ArgumentsJSON: refundInput,
		Effects: []string{"refund 25.00 EUR of 49.90 EUR paid; 0.00 EUR refunded so far", "note \u202eRUE"}, PreviewDigest: strings.Repeat("cd", 32),
	})
	if err != nil {
		t.Fatal(err)
	}
	msg := mcpbridge.FormMessage(wirePrompt(t, svc, carolFinanceBot, c.ID))
	want := "\nWhat it will do (checked by the system that runs it):\n- refund 25.00 EUR of 49.90 EUR paid; 0.00 EUR refunded so far\n- note ⟦U+202E⟧RUE\nArguments:\n"
	if !strings.Contains(msg, want) || strings.Contains(msg, "\u202e") {
		t.Fatalf("the form lacks %q:\n%s", want, msg)
	}
}

// directoryOf is an in-memory directory holding policy.
func directoryOf(t *testing.T, policy string) *directory.Cache {
	t.Helper()
	store := dirmem.New()
	if _, err := directory.Apply(context.Background(), store, []byte(policy)); err != nil {
		t.Fatal(err)
	}
	cache := directory.NewCache(store, directory.CacheOptions{TTL: time.Hour})
	t.Cleanup(cache.Close)
	return cache
}
