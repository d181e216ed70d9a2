package helpdesk

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
)

// GatewayRefund is what the backend asks a payment gateway to send back to a customer.
type GatewayRefund struct {
	// Reference identifies the refund at the backend, "<tenant>/<refund id>".
	Reference string
	// Amount is what to move.
	Amount Money
	// CardholderReference names the card at the gateway. Sensitive: never log it.
	CardholderReference string
}

// PaymentGateway moves money back to customers. Refunds are booked only after the gateway
// accepted them.
type PaymentGateway interface {
	// Refund moves r.Amount and returns the gateway's id of the refund. An error means nothing
	// moved.
	Refund(ctx context.Context, r GatewayRefund) (string, error)
}

// Gateway is a fake PaymentGateway that moves nothing but counts what it was asked to move, so
// a test can prove that a refused refund moved no money. It is safe for concurrent use; the
// zero value is not usable, call NewGateway.
type Gateway struct {
	mu      sync.Mutex
	refunds int
	moved   map[string]int64
	fail    error
}

var _ PaymentGateway = (*Gateway)(nil)

// NewGateway returns a Gateway that has moved nothing.
func NewGateway() *Gateway { return &Gateway{moved: map[string]int64{}} }

// Refund implements PaymentGateway: it counts the refund unless a failure was set with Fail.
func (g *Gateway) Refund(ctx context.Context, r GatewayRefund) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if r.Amount.Minor <= 0 || r.Amount.Currency == "" {
		return "", errors.New("gateway: refund amount must be positive and have a currency")
	}
	if r.CardholderReference == "" {
		return "", errors.New("gateway: no cardholder reference")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fail != nil {
		return "", g.fail
	}
	g.refunds++
	g.moved[r.Amount.Currency] += r.Amount.Minor
	return fmt.Sprintf("gw_%06d", g.refunds), nil
}

// Fail makes every later Refund fail with err (nil restores normal operation); for tests of
// gateway outages.
func (g *Gateway) Fail(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.fail = err
}

// Refunds returns how many refunds the gateway accepted.
func (g *Gateway) Refunds() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refunds
}

// Moved returns how much the gateway accepted to move, in minor units per currency. The map is
// a copy.
func (g *Gateway) Moved() map[string]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.moved)
}
