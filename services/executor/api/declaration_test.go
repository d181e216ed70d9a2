package api_test

import (
	"context"
	"encoding/json"
	"testing"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	genmanifest "github.com/mandate-dev/mandate/gen/manifest"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/confirm"
)

// redeployedManifest is the embedded manifest with ticket.refund's
// declaration changed (its deadline), encoded with its digest, over the
// same descriptors: what a redeploy of a changed service would load.
func redeployedManifest(t *testing.T) *manifest.Set {
	t.Helper()
	var m manifest.Manifest
	if err := json.Unmarshal(genmanifest.Manifest, &m); err != nil {
		t.Fatal(err)
	}
	for _, c := range m.Commands {
		if c.Code == "ticket.refund" {
			c.Deadline = "7s"
		}
	}
	b, err := manifest.Encode(&m)
	if err != nil {
		t.Fatal(err)
	}
	set, err := manifest.Load(b, genmanifest.DescriptorSet)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func embedded(t *testing.T) *manifest.Set {
	t.Helper()
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestARedeployThatChangesTheCommandVoidsItsApproval (issue 27 §2): carol
// approves finance-bot's refund; then the services are redeployed with a
// changed declaration of ticket.refund. The approved call, sent again with
// its grant, is refused confirmation.declaration_changed at
// confirmation_check — audited, no refund — and the grant is left unused:
// check mode says the same; a new call opens a new challenge, which runs
// once approved. The executor still on the old declaration would have run
// the first grant: only the declaration voided it.
func TestARedeployThatChangesTheCommandVoidsItsApproval(t *testing.T) {
	eachStore(t, func(t *testing.T, st stores) {
		old := start(t, st)
		ctx := context.Background()
		bot := as(token(t, "acme", "carol", "finance-bot"))
		_, err := old.execute(t, bot, "ticket.refund", refundInput, withKey("redeploy-1"))
		ch := refusal(err).GetChallengeId()
		if ch == "" {
			t.Fatalf("the refund: %v", err)
		}
		if _, err := old.confirm.Decide(ctx, carol, ch, true, "api"); err != nil {
			t.Fatal(err)
		}

		set, was := redeployedManifest(t), embedded(t)
		if set.DeclarationDigest("ticket.refund") == was.DeclarationDigest("ticket.refund") {
			t.Fatal("the changed deadline did not change the declaration digest")
		}
		if set.DeclarationDigest("ticket.search") != was.DeclarationDigest("ticket.search") {
			t.Fatal("an unchanged command's declaration digest changed")
		}
		e := startOn(t, old.backing, set)
		client := mandatev1.NewExecutorServiceClient(e.conn)
		verdict, err := client.Check(bot, &mandatev1.ExecuteRequest{Code: "ticket.refund", InputJson: []byte(refundInput), IdempotencyKey: "redeploy-1", ApprovalGrantId: ch})
		if err != nil || verdict.GetReason().GetCode() != "confirmation.declaration_changed" {
			t.Fatalf("check after the redeploy: %v, %v", verdict, err)
		}
		_, err = e.execute(t, bot, "ticket.refund", refundInput, withKey("redeploy-1"), withGrant(ch))
		ce := refusal(err)
		if ce.GetCode() != "confirmation.declaration_changed" || ce.GetStage() != "confirmation_check" {
			t.Fatalf("the approved call after the redeploy: %v", err)
		}
		if n := e.gateway.Refunds(); n != 0 {
			t.Fatalf("the gateway counted %d refunds", n)
		}
		rows := e.rows(t, "acme", ce.GetInvocationId(), 1)
		if len(rows) != 1 || rows[0].Outcome != audit.OutcomeRefused || rows[0].Code != "confirmation.declaration_changed" {
			t.Fatalf("rows %+v", rows)
		}
		got, err := e.confirm.Get(ctx, carol, ch)
		if err != nil || got.State != confirm.StateApproved {
			t.Fatalf("the grant after the refusal: %+v, %v; want approved, unused", got, err)
		}

		// Asked again under the new declaration: a new challenge, which runs.
		_, err = e.execute(t, bot, "ticket.refund", refundInput, withKey("redeploy-2"))
		ch2 := refusal(err).GetChallengeId()
		if ch2 == "" || ch2 == ch {
			t.Fatalf("asked again: %v", err)
		}
		if _, err := e.confirm.Decide(ctx, carol, ch2, true, "api"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.execute(t, bot, "ticket.refund", refundInput, withKey("redeploy-2"), withGrant(ch2)); err != nil {
			t.Fatalf("the new approval: %v", err)
		}
		if n := e.gateway.Refunds(); n != 1 {
			t.Fatalf("the gateway counted %d refunds, want 1", n)
		}
	})
}
