package confirm_test

import (
	"context"
	"errors"
	"testing"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
)

// TestAnApprovalHoldsForItsDeclaration (issue 27 §2): a challenge records
// the digest of the command's declaration it was opened under. A grant is
// redeemed only under the same declaration: redeemed by an executor whose
// declaration of the command differs (a redeploy changed its risk), it is
// refused confirmation.declaration_changed and stays approved, unused —
// the executor that still runs the old declaration redeems it. Without a
// digest from the executor, the confirm service's own declaration counts:
// a confirm service redeployed with the changed command refuses it too.
// Prose (the description) is not part of the declaration.
func TestAnApprovalHoldsForItsDeclaration(t *testing.T) {
	f := setup(t, false)
	ctx := context.Background()
	cmds := confirmtest.Commands()
	refund := cmds["ticket.refund"]
	c := f.open(t, aliceViaExecutor, "ticket.refund")
	if want := manifest.DeclarationDigestOf(refund); c.Prompt.DeclarationDigest != want || want == "" {
		t.Fatalf("the challenge's declaration digest %q, want %q", c.Prompt.DeclarationDigest, want)
	}
	if _, err := f.svc.Decide(ctx, alice, c.ID, true, confirm.ChannelAPI); err != nil {
		t.Fatal(err)
	}

	changed := *refund
	changed.Risk = "L2"
	if _, err := f.svc.Redeem(ctx, aliceViaExecutor, c.ID, c.InvocationDigest, manifest.DeclarationDigestOf(&changed)); !errors.Is(err, confirm.ErrDeclarationChanged) {
		t.Fatalf("redeemed under a changed declaration: %v", err)
	}
	if s := f.state(t, c.ID); s != confirm.StateApproved {
		t.Fatalf("after the refusal the challenge is %s, want still approved (unused)", s)
	}

	reworded := *refund
	reworded.Description = "Refunds a customer (reworded)."
	if manifest.DeclarationDigestOf(&reworded) != manifest.DeclarationDigestOf(refund) {
		t.Fatal("a reworded description changed the declaration digest")
	}

	// A confirm service redeployed with the changed command, asked without
	// a digest, refuses as well.
	redeployed := confirmtest.Commands()
	redeployed["ticket.refund"] = &changed
	svc2, err := confirm.New(confirm.Config{Store: f.store, Directory: directory.Direct(f.dir), Commands: redeployed, ApprovalBaseURL: "https://confirm.example/"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc2.Redeem(ctx, aliceViaExecutor, c.ID, c.InvocationDigest, ""); !errors.Is(err, confirm.ErrDeclarationChanged) {
		t.Fatalf("the redeployed confirm service redeemed it: %v", err)
	}

	g, err := f.svc.Redeem(ctx, aliceViaExecutor, c.ID, c.InvocationDigest, manifest.DeclarationDigestOf(refund))
	if err != nil || g.Approver != "alice" {
		t.Fatalf("redeemed under its own declaration: %+v, %v", g, err)
	}
}
