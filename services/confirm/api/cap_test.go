package api_test

import (
	"context"
	"testing"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/services/confirm"
)

// TestOpenChallengesAreBounded: one requester holds at most
// MaxOpenPerRequester pending challenges; the next Open is refused with
// confirmation.too_many_open and creates nothing; another requester is not
// affected; deciding one makes room again.
func TestOpenChallengesAreBounded(t *testing.T) {
	for name, b := range backends {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			store := b(t)
			svc, err := confirm.New(confirm.Config{Store: store, Directory: directory.Direct(newDirectory(t)), Commands: elicitCommands(),
				ApprovalBaseURL: "https://confirm.example", MaxOpenPerRequester: 3})
			if err != nil {
				t.Fatal(err)
			}
			var first confirm.Challenge
			for i := range 3 {
				c := openFor(t, svc, elicitBot, "ticket.refund")
				if i == 0 {
					first = c
				}
			}
			p := elicitBot
			p.Via = "executor"
			_, err = svc.Open(ctx, p, confirm.OpenRequest{Command: "ticket.refund", InvocationDigest: first.InvocationDigest[:63] + "0", InvocationID: "inv-over-the-cap"})
			wantConfirmCode(t, "a fourth open challenge", err, failure.CodeConfirmationTooManyOpen)
			if n, _ := store.CountPending(ctx, "acme", "alice", "support-bot"); n != 3 {
				t.Fatalf("%d pending after the refusal, want 3", n)
			}
			openFor(t, svc, elicitAlice, "ticket.refund") // alice acting directly is another requester
			if _, err := svc.Decide(ctx, elicitAlice, first.ID, false, confirm.ChannelApprovalPage); err != nil {
				t.Fatal(err)
			}
			openFor(t, svc, elicitBot, "ticket.refund")
		})
	}
}
