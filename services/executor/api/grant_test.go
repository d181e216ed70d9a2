package api_test

import (
	"context"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/services/executor"
)

// TestGrantOfACallThatNeverRanIsNotSpent: an executor redeemed carol's
// approval for a keyed refund and died before dispatching it (its
// reservation is left with a lapsed lease, its backend has no receipt).
// The retry with the same key and grant finds the holder dead, the
// backend fences it as not executed, and the approval — not spent on any
// effect — is released and redeemed for the retry: the refund runs once.
func TestGrantOfACallThatNeverRanIsNotSpent(t *testing.T) {
	eachStore(t, testGrantOfACallThatNeverRanIsNotSpent)
}

func testGrantOfACallThatNeverRanIsNotSpent(t *testing.T, st stores) {
	e := start(t, st)
	ctx := context.Background()
	bot := as(token(t, "acme", "carol", "finance-bot"))
	const key = "refund-never-ran"
	_, err := e.execute(t, bot, "ticket.refund", refundInput, withKey(key))
	ce := refusal(err)
	if ce.GetCode() != "confirmation.required" {
		t.Fatalf("first call: %v", err)
	}
	challenge := ce.GetChallengeId()
	argDigest := e.rows(t, "acme", ce.GetInvocationId(), 1)[0].ArgumentsDigest
	if _, err := e.confirm.Decide(ctx, carol, challenge, true, "api"); err != nil {
		t.Fatal(err)
	}

	// The dead executor's part: the grant redeemed, the key reserved, and
	// nothing dispatched.
	ch, err := e.confirm.Get(ctx, carol, challenge)
	if err != nil {
		t.Fatal(err)
	}
	relay := carolsBot
	relay.Via = "executor"
	if _, err := e.confirm.Redeem(ctx, relay, challenge, ch.InvocationDigest, ""); err != nil {
		t.Fatal(err)
	}
	k := executor.IdemKey{Tenant: "acme", User: "carol", Command: "ticket.refund", Key: key}
	if _, err := e.execStore.Reserve(ctx, k, executor.Reservation{Digest: argDigest, InvocationID: "inv_dead0000000000000000000000000000", TTL: time.Hour, Lease: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the lease lapses: the holder is dead

	res, err := e.execute(t, bot, "ticket.refund", refundInput, withKey(key), withGrant(challenge))
	if err != nil {
		t.Fatalf("the retry of a call that never ran: %v (%v)", err, refusal(err))
	}
	if n := e.gateway.Refunds(); n != 1 {
		t.Fatalf("the payment gateway counted %d refunds, want 1", n)
	}
	rows := e.rows(t, "acme", res.GetInvocationId(), 2)
	if last := rows[len(rows)-1]; last.Approval == nil || last.Approval.Approver != "carol" || last.Approval.ChallengeID != challenge {
		t.Fatalf("the executed row's approval: %+v", last.Approval)
	}
	// Spent now, on the one effect.
	if _, err := e.execute(t, bot, "ticket.refund", refundInput, withGrant(challenge)); refusal(err).GetCode() != "confirmation.already_redeemed" &&
		refusal(err).GetCode() != "confirmation.grant_mismatch" {
		t.Fatalf("the grant after its effect: %v", err)
	}
}
