package api_test

import (
	"context"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/confirm"
)

// setCeiling sets acme's trust ceiling ("" for the default, L2).
func setCeiling(t *testing.T, dir directory.Store, ceiling string) {
	t.Helper()
	err := dir.Update(context.Background(), func(tx directory.Tx) error {
		snap, err := tx.Snapshot(context.Background(), "acme")
		if err != nil {
			return err
		}
		snap.Tenant.TrustCeiling = ceiling
		return tx.PutTenant(context.Background(), snap.Tenant)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestTrustCeiling: an answer given in an interactive client's own window
// counts only up to the tenant's trust ceiling (default L2). Above it the
// challenge is not offered for elicitation, an elicited answer is refused
// and the challenge stays pending for the approval page.
func TestTrustCeiling(t *testing.T) {
	for name, b := range backends {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dir := newDirectory(t)
			setCeiling(t, dir, "") // the default: L2
			svc, err := confirm.New(confirm.Config{Store: b(t), Directory: directory.Direct(dir), Commands: elicitCommands(), ApprovalBaseURL: "https://confirm.example"})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				command string
				counts  bool
			}{
				{"expense.report.submit", true}, // L2 = the ceiling
				{"ticket.refund", false},        // L3 > L2
			} {
				ch := openFor(t, svc, elicitBot, c.command)
				seen, err := svc.Get(ctx, elicitBot, ch.ID)
				if err != nil || seen.Elicitable != c.counts {
					t.Fatalf("%s: Elicitable = %v (%v), want %v", c.command, seen.Elicitable, err, c.counts)
				}
				got, err := svc.DecideElicited(ctx, elicitBot, ch.ID, true)
				if c.counts {
					if err != nil || got.State != confirm.StateApproved {
						t.Fatalf("%s under the ceiling: %+v %v", c.command, got, err)
					}
					continue
				}
				wantConfirmCode(t, c.command+" above the ceiling", err, failure.CodeConfirmationApproverNotAllowed)
				if still, _ := svc.Get(ctx, elicitAlice, ch.ID); still.State != confirm.StatePending {
					t.Fatalf("%s: the refused answer changed the challenge to %s", c.command, still.State)
				}
			}

			// The tenant raises its ceiling: the same answer now counts.
			setCeiling(t, dir, "L3")
			ch := openFor(t, svc, elicitBot, "ticket.refund")
			if got, err := svc.DecideElicited(ctx, elicitBot, ch.ID, true); err != nil || got.State != confirm.StateApproved {
				t.Fatalf("ticket.refund under ceiling L3: %+v %v", got, err)
			}
		})
	}
}

// TestRevocationVoidsOpenGrants: a grant for a call asked for before the
// agent was disabled is refused after it is enabled again
// (confirmation.revoked), and a token issued before the revocation no
// longer counts at all; a call asked for afterwards is approved as usual.
func TestRevocationVoidsOpenGrants(t *testing.T) {
	for name, b := range backends {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dir := newDirectory(t)
			svc, err := confirm.New(confirm.Config{Store: b(t), Directory: directory.Direct(dir), Commands: elicitCommands(), ApprovalBaseURL: "https://confirm.example"})
			if err != nil {
				t.Fatal(err)
			}
			oldToken := elicitBot
			oldToken.IssuedAt = time.Now().Add(-time.Minute)
			ch := openFor(t, svc, oldToken, "ticket.refund")
			if _, err := svc.Decide(ctx, elicitAlice, ch.ID, true, confirm.ChannelApprovalPage); err != nil {
				t.Fatal(err)
			}
			if err := directory.SetAgentDisabled(ctx, dir, "acme", "support-bot", true); err != nil {
				t.Fatal(err)
			}
			if err := directory.SetAgentDisabled(ctx, dir, "acme", "support-bot", false); err != nil {
				t.Fatal(err)
			}
			relay := func(p identity.Principal) identity.Principal { p.Via = "executor"; return p }

			_, err = svc.Redeem(ctx, relay(oldToken), ch.ID, ch.InvocationDigest, "")
			wantConfirmCode(t, "a token of before the revocation", err, failure.CodeAuthorizationPrincipalInactive)

			res, err := directory.Direct(dir).Resolve(ctx, "acme", "alice", "support-bot")
			if err != nil {
				t.Fatal(err)
			}
			newToken := elicitBot
			newToken.IssuedAt = res.NotBefore()
			_, err = svc.Redeem(ctx, relay(newToken), ch.ID, ch.InvocationDigest, "")
			wantConfirmCode(t, "a grant asked for before the revocation", err, failure.CodeConfirmationRevoked)

			fresh := openFor(t, svc, newToken, "ticket.refund")
			if _, err := svc.Decide(ctx, elicitAlice, fresh.ID, true, confirm.ChannelApprovalPage); err != nil {
				t.Fatal(err)
			}
			if g, err := svc.Redeem(ctx, relay(newToken), fresh.ID, fresh.InvocationDigest, ""); err != nil || g.Approver != "alice" {
				t.Fatalf("a grant asked for after re-enabling: %+v %v", g, err)
			}
		})
	}
}
