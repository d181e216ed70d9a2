package helpdesk

import (
	"context"
	"fmt"
	"strings"

	"github.com/mandate-dev/mandate/pkg/backend"
)

// cmdErase is the code of the erasure command; idempotency keys are scoped by it.
const cmdErase = "customer.erase"

// erasureFloor: the first erasure of a tenant is CE-4001.
const erasureFloor = 4000

// eraseInput is an erasure request. Its JSON encoding is the request digest of the
// idempotency key, so that the same key with another customer is refused instead of
// replaying an erasure of someone else. The stored digest is a SHA-256 over the email and the
// free-text reason together, which is not a lookup key for the email alone.
type eraseInput struct {
	CustomerEmail string `json:"customer_email"`
	Reason        string `json:"reason"`
}

// eraseCustomer replaces the customer's email on every ticket of the caller's tenant with the
// erasure's tombstone and records the erasure under the invocation id, in tx.
//
// Erasing a customer of whom nothing is left, because they were erased before or never had a
// ticket, succeeds with a receipt that counts zero tickets: the caller asked for the data to
// be gone and it is, and a refusal would tell whoever asks whether an address was ever a
// customer. With an idempotency key, repeating the same request returns the first receipt.
func (d *desk) eraseCustomer(ctx context.Context, tx Tx, p backend.Caller, in eraseInput) (Erasure, error) {
	in.CustomerEmail = strings.TrimSpace(in.CustomerEmail)
	if in.CustomerEmail == "" || !strings.Contains(in.CustomerEmail, "@") {
		return Erasure{}, invalidInput("/customer_email", "customer_email must be an email address")
	}
	in.CustomerEmail = strings.ToLower(in.CustomerEmail) // the same customer, the same digest
	key := IdempotencyKey{Tenant: p.Tenant, UserID: p.UserID, Command: cmdErase, Key: p.IdempotencyKey}
	if key.Key != "" {
		prior, found, err := replay(ctx, tx, key, digestOf(in))
		if err != nil {
			return Erasure{}, err
		}
		if found {
			return tx.Erasure(ctx, p.Tenant, prior)
		}
	}
	n, err := tx.NextID(ctx, p.Tenant, SeqErasure, erasureFloor)
	if err != nil {
		return Erasure{}, err
	}
	e := Erasure{
		Tenant: p.Tenant, ID: fmt.Sprintf("CE-%d", n), Reason: in.Reason,
		RequestedBy: p.UserID, AgentID: p.AgentID, InvocationID: p.InvocationID, ErasedAt: d.clock(),
	}
	if e.TicketsErased, err = tx.EraseCustomer(ctx, p.Tenant, in.CustomerEmail, e.Tombstone()); err != nil {
		return Erasure{}, err
	}
	if err := tx.InsertErasure(ctx, e); err != nil {
		return Erasure{}, err
	}
	if key.Key != "" {
		if err := tx.CompleteKey(ctx, key, e.ID); err != nil {
			return Erasure{}, err
		}
	}
	return e, nil
}
