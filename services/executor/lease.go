package executor

import (
	"context"
	"sync"
	"time"
)

// A call's idempotency claim is a short lease that this executor renews
// while the call runs (docs/architecture/pipeline.md, "Idempotency as
// leases"). A live executor keeps its calls' keys however long they run;
// a dead one stops renewing, and within one lease a retry finds the holder
// dead and asks the backend's receipt instead of waiting out a deadline.

// heldLease is a claim this executor renews: the key and the invocation
// that holds it, and when it was last renewed (or reserved).
type heldLease struct {
	key     IdemKey
	inv     string
	renewed time.Time
}

// leases are the claims of this executor's running calls.
type leases struct {
	mu   sync.Mutex
	held map[*invocation]*heldLease
}

// hold starts renewing inv's claim on its key.
func (e *Executor) hold(inv *invocation) {
	if inv.idem == nil {
		return
	}
	e.leases.mu.Lock()
	e.leases.held[inv] = &heldLease{key: *inv.idem, inv: inv.id, renewed: e.cfg.Now()}
	e.leases.mu.Unlock()
}

// letGo stops renewing inv's claim: the call finished, gave the key back,
// or ended.
func (e *Executor) letGo(inv *invocation) {
	e.leases.mu.Lock()
	delete(e.leases.held, inv)
	e.leases.mu.Unlock()
}

// RenewLeases renews the claims due for it — held longer than a third of
// the lease since their last renewal — and returns how many it renewed. A
// claim the store no longer gives to its invocation (finished, released,
// or taken over by a retry that found it lapsed) is dropped.
func (e *Executor) RenewLeases(ctx context.Context) (int, error) {
	now := e.cfg.Now()
	due := e.cfg.Lease / 3
	e.leases.mu.Lock()
	var todo []*heldLease
	for _, h := range e.leases.held {
		if now.Sub(h.renewed) >= due {
			todo = append(todo, h)
		}
	}
	e.leases.mu.Unlock()
	renewed := 0
	var firstErr error
	for _, h := range todo {
		rctx, cancel := context.WithTimeout(ctx, due)
		ok, err := e.cfg.Store.Renew(rctx, h.key, h.inv, e.cfg.Lease)
		cancel()
		switch {
		case err != nil:
			if firstErr == nil {
				firstErr = err
			}
		case ok:
			renewed++
			e.leases.mu.Lock()
			h.renewed = now
			e.leases.mu.Unlock()
		default:
			e.log.Warn("an idempotency claim was lost while its call ran (its lease lapsed and a retry took the key over)",
				"invocation_id", h.inv, "command", h.key.Command)
			e.leases.mu.Lock()
			for inv, held := range e.leases.held {
				if held == h {
					delete(e.leases.held, inv)
				}
			}
			e.leases.mu.Unlock()
		}
	}
	return renewed, firstErr
}
