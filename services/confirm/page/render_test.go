package page_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
)

// hostileReason reads "25.00 EUR" once the bidi overrides are obeyed.
const hostileReason = "Customer agreed: \u202eRUE 00.52\u202c \u2066\u200f\u2069"

// sampleCommands are the confirm fixtures with the helpdesk sample's real
// ticket.refund declaration (its JSON Schema has the Money message).
func sampleCommands(t *testing.T) confirmtest.CommandSet {
	t.Helper()
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	cmds := confirmtest.Commands()
	refund, _ := set.ByCode("ticket.refund")
	cmds["ticket.refund"] = refund
	return cmds
}

// TestPageRendersArgumentsByDeclaration: the page lists the arguments by
// the declaration — money formatted with its currency, the agent's free
// text marked as such, bidi controls shown as markers and never sent raw —
// whether the stored prompt carries its fields or not.
func TestPageRendersArgumentsByDeclaration(t *testing.T) {
	f := newFixtureWith(t, nil, sampleCommands(t))
	args := `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"999999"},"reason":"` + hostileReason + `","cardholder_reference":"CH4242424242"}`
	opened, err := f.confirm.Open(context.Background(), botForAlice, confirm.OpenRequest{
		Command: "ticket.refund", InvocationDigest: confirmtest.Digest("inv-hostile"), InvocationID: "inv-hostile",
		ArgumentsJSON: args, WithheldFields: nil,
	})
	if err != nil {
		t.Fatal(err)
	}
	// The same challenge as a prompt that came over gRPC (no fields) or was
	// stored before fields existed: the page renders them from the
	// declaration.
	bare := opened
	bare.ID, bare.InvocationID, bare.InvocationDigest = confirm.NewID(), "inv-bare", confirmtest.Digest("inv-bare")
	bare.Prompt.Fields = nil
	if _, _, err := f.store.Create(context.Background(), bare, time.Minute); err != nil {
		t.Fatal(err)
	}
	alice, _ := f.signIn(t, "alice", "acme")
	for _, id := range []string{opened.ID, bare.ID} {
		r := do(t, alice, http.MethodGet, f.srv.URL+"/approve/"+id, nil, nil)
		if r.status != http.StatusOK {
			t.Fatalf("%d %s", r.status, r.body)
		}
		for _, want := range []string{
			`data-pointer="/amount"`, `<bdi>9,999.99 EUR</bdi> <span class="f-raw">(999999 minor units)</span>`,
			`<div class="f-label" dir="ltr">Reason <span class="tag">written by the agent support-bot</span></div>`,
			`<blockquote class="f-agent" dir="auto">Customer agreed: ⟦U&#43;202E⟧RUE 00.52⟦U&#43;202C⟧ ⟦U&#43;2066⟧⟦U&#43;200F⟧⟦U&#43;2069⟧</blockquote>`,
			`data-kind="withheld" data-pointer="/cardholder_reference"`,
			`<code>/cardholder_reference</code> <em>withheld</em>`,
			`\u202eRUE 00.52\u202c`, // the exact JSON, escaped
		} {
			if !strings.Contains(r.body, want) {
				t.Fatalf("the page lacks %s:\n%s", want, r.body)
			}
		}
		for _, bad := range []string{"\u202e", "\u202c", "\u2066", "\u2069", "\u200f", "CH4242424242"} {
			if strings.Contains(r.body, bad) {
				t.Fatalf("the page holds %q raw", bad)
			}
		}
	}
}
