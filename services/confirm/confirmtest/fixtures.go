package confirmtest

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/confirm"
)

// CommandSet is a confirm.Commands over a fixed list of declarations.
type CommandSet map[string]*manifest.Command

// ByCode implements confirm.Commands.
func (s CommandSet) ByCode(code string) (*manifest.Command, bool) {
	c, ok := s[code]
	return c, ok
}

// DeclarationDigest implements confirm.Commands.
func (s CommandSet) DeclarationDigest(code string) string {
	c, ok := s[code]
	if !ok {
		return ""
	}
	return manifest.DeclarationDigestOf(c)
}

// Commands returns declarations covering every approver rule:
//
//   - ticket.refund: L3, the requesting user approves (as in the helpdesk
//     sample), sensitive /cardholder_reference;
//   - expense.report.submit: L2, reversible through expense.report.recall;
//   - payment.payout: L4, four eyes — another user holding payment.approve;
//   - vendor.purge: L4 without a declared approver (nobody may approve);
//   - ticket.merge: a draft (not callable).
func Commands() CommandSet {
	set := CommandSet{}
	for _, c := range []*manifest.Command{
		{
			Code: "ticket.refund", DisplayName: "Refund a ticket", Risk: "L3", Lifecycle: "PUBLISHED",
			SideEffects: []string{"ledger", "payment-gateway"}, Permissions: []string{"payment.refund"},
			Approver: manifest.Approver{Kind: "REQUESTING_USER"}, ConfirmationRequired: true,
			SensitiveFields: []string{"/cardholder_reference"},
		},
		{
			Code: "expense.report.submit", DisplayName: "Submit an expense report", Risk: "L2", Lifecycle: "PUBLISHED",
			SideEffects: []string{"email"}, Permissions: []string{"expense.report.submit"},
			Reversible: true, Recall: "expense.report.recall", Approver: manifest.Approver{Kind: "REQUESTING_USER"},
		},
		{
			Code: "payment.payout", DisplayName: "Pay out to a vendor", Risk: "L4", Lifecycle: "PUBLISHED",
			SideEffects: []string{"ledger", "payment-gateway", "email"}, Permissions: []string{"payment.payout"},
			Approver:        manifest.Approver{Kind: "PERMISSION_HOLDER", Permission: "payment.approve", Declared: true},
			SensitiveFields: []string{"/iban", "/beneficiaries/*/iban"}, ConfirmationRequired: true,
		},
		{
			Code: "vendor.purge", DisplayName: "Purge a vendor", Risk: "L4", Lifecycle: "PUBLISHED",
			SideEffects: []string{"ledger"}, Permissions: []string{"vendor.manage"},
			Approver: manifest.Approver{Kind: "REQUESTING_USER"}, ConfirmationRequired: true,
		},
		{
			Code: "ticket.merge", DisplayName: "Merge tickets", Risk: "L3", Lifecycle: "DRAFT",
			Permissions: []string{"ticket.read"}, Approver: manifest.Approver{Kind: "REQUESTING_USER"},
		},
	} {
		set[c.Code] = c
	}
	return set
}

// Policy is the directory the confirm tests run against. In acme, alice
// (support) refunds and requests payouts through support-bot, which runs
// in a client alice operates (host: interactive), and through cron-bot,
// which runs headless; carol
// (finance) approves payouts; bob holds payment.approve but is disabled;
// mallory is an active user with nothing relevant. globex is another
// tenant whose gina holds everything.
const Policy = `
tenants:
  - id: acme
    trust_ceiling: L3
    roles:
      support: [ticket.read, payment.refund, payment.payout, expense.report.submit, vendor.manage]
      finance: [payment.approve, ticket.read]
      staff: [ticket.read]
    users:
      - {id: alice, roles: [support]}
      - {id: carol, roles: [finance]}
      - {id: bob, roles: [finance], disabled: true}
      - {id: mallory, roles: [staff]}
    agents:
      - {id: support-bot, user: alice, host: interactive}
      - {id: finance-bot, user: carol}
      - {id: cron-bot, user: alice}
  - id: globex
    roles:
      all: [ticket.read, payment.refund, payment.payout, payment.approve]
    users:
      - {id: gina, roles: [all]}
`

// Digest returns a well-formed invocation digest derived from s.
func Digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// Challenge returns a valid challenge of tenant for invocation inv, opened
// by alice through support-bot for ticket.refund; tests adjust what they
// need.
func Challenge(tenant, inv string) confirm.Challenge {
	return confirm.Challenge{
		ID: confirm.NewID(), Tenant: tenant, Command: "ticket.refund", Risk: "L3",
		InvocationDigest: Digest(inv), InvocationID: inv,
		RequesterUser: "alice", RequesterAgent: "support-bot",
		Approver: confirm.ApproverPolicy{Kind: confirm.ApproverRequestingUser},
		Prompt: confirm.Prompt{
			Title: "Refund a ticket (ticket.refund)", Summary: "support-bot acting for alice asks to refund a ticket.",
			Risk: "L3", SideEffects: []string{"ledger", "payment-gateway"}, Permissions: []string{"payment.refund"},
			ArgumentsJSON:  `{"amount_cents":1250,"cardholder_reference":"[withheld]","ticket_id":"T-1"}`,
			WithheldFields: []string{"/cardholder_reference"}, RequestedBy: "support-bot acting for alice",
		},
	}
}
