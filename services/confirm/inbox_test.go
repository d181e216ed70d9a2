package confirm_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
	"github.com/mandate-dev/mandate/services/confirm/memory"
)

func ids(cs []confirm.Challenge) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.ID)
	}
	return out
}

// TestInbox: a human's inbox holds exactly the pending challenges the
// approver policy lets that human decide — the requester's own requests
// only where the requester decides, four-eyes requests only for another
// holder of the permission — never decided or expired ones, and agents
// have none.
func TestInbox(t *testing.T) {
	f := setup(t, false)
	ctx := context.Background()
	refund := f.open(t, botForAlice, "ticket.refund")
	payout := f.open(t, botForAlice, "payment.payout")
	decided := f.open(t, botForAlice, "ticket.refund")
	if _, err := f.svc.Decide(ctx, alice, decided.ID, false, confirm.ChannelApprovalPage); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		p    identity.Principal
		want []string
	}{
		{"alice, requester of both", alice, []string{refund.ID}},
		{"carol, holder of payment.approve", carol, []string{payout.ID}},
		{"mallory, who may decide neither", mallory, nil},
	} {
		got, err := f.svc.Inbox(ctx, tc.p, 50)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(ids(got), tc.want) && (len(got) != 0 || len(tc.want) != 0) {
			t.Errorf("%s: inbox %v, want %v", tc.name, ids(got), tc.want)
		}
		// Every challenge of the inbox is one Decide would accept from p.
		for i := range got {
			if err := f.svc.CanDecide(ctx, tc.p, got[i]); err != nil {
				t.Errorf("%s: %s in the inbox, but CanDecide says %v", tc.name, got[i].ID, err)
			}
		}
	}
	_, err := f.svc.Inbox(ctx, financeBot, 50)
	wantCode(t, "finance-bot's inbox", err, failure.CodeConfirmationApproverNotAllowed)
	_, err = f.svc.Inbox(ctx, bob, 50)
	wantCode(t, "bob's inbox (disabled)", err, failure.CodeAuthorizationPrincipalInactive)
	if got, _ := f.svc.Inbox(ctx, alice, 0); len(got) != 0 {
		t.Fatalf("limit 0: %v", ids(got))
	}
	f.clock.Advance(confirm.DefaultTTL)
	if got, _ := f.svc.Inbox(ctx, alice, 50); len(got) != 0 {
		t.Fatalf("after expiry: %v", ids(got))
	}
}

// TestAmounts: the inbox's amounts are the money arguments as the
// declaration reads them; a withheld value never is one.
func TestAmounts(t *testing.T) {
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	cmds := confirmtest.Commands()
	cmds["ticket.refund"], _ = set.ByCode("ticket.refund")
	dir := dirmem.New()
	if _, err := directory.Apply(context.Background(), dir, []byte(confirmtest.Policy)); err != nil {
		t.Fatal(err)
	}
	store := memory.New(memory.Options{})
	t.Cleanup(store.Close)
	svc, err := confirm.New(confirm.Config{Store: store, Directory: directory.Direct(dir), Commands: cmds})
	if err != nil {
		t.Fatal(err)
	}
	c, err := svc.Open(context.Background(), botForAlice, confirm.OpenRequest{
		Command: "ticket.refund", InvocationDigest: confirmtest.Digest("inv-amount"), InvocationID: "inv-amount",
		ArgumentsJSON: `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"250000"},"reason":"x","cardholder_reference":"CH4242"}`,
		TTL:           time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := svc.Amounts(&c); !slices.Equal(got, []string{"2,500.00 EUR"}) {
		t.Fatalf("Amounts = %q", got)
	}
	// Without fields stored (a prompt relayed over gRPC), read by the
	// declaration all the same.
	c.Prompt.Fields = nil
	if got := svc.Amounts(&c); !slices.Equal(got, []string{"2,500.00 EUR"}) {
		t.Fatalf("Amounts without stored fields = %q", got)
	}
	for _, a := range svc.Amounts(&c) {
		if a == confirm.WithheldValue {
			t.Fatal("a withheld value is an amount")
		}
	}
}
