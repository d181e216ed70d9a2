package executor

import (
	"context"
	"errors"

	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
)

// idempotencyCheck reserves the call's idempotency key (a lease), or
// answers with the response the key already holds. A malformed key is
// refused before anyone is asked to approve a call that could never run.
// The reservation is undone by the chain if a later stage before dispatch
// refuses.
func (e *Executor) idempotencyCheck(ctx context.Context, inv *invocation) (*Result, error) {
	if fe := checkIdempotencyKey(inv); fe != nil {
		return nil, e.refuseWith(ctx, inv, fe)
	}
	key := inv.call.IdempotencyKey
	if key == "" {
		return nil, nil
	}
	k := IdemKey{Tenant: inv.p.Tenant, User: inv.p.UserID, Command: inv.cmd.Code, Key: key}
	claim := Reservation{Digest: inv.argDigest, InvocationID: inv.id, TTL: e.cfg.IdempotencyTTL, Lease: e.cfg.Lease}
	saved, err := e.reserve(ctx, inv, k, claim)
	var abandoned *AbandonedError
	previous := ""
	switch {
	case errors.As(err, &abandoned):
		previous = abandoned.InvocationID
	case err == nil && saved != nil && unknownEffect(saved):
		previous = saved.InvocationID
	}
	if previous != "" {
		// The call that holds this key never said how it ended: its
		// backend's receipt decides between its result and a new run.
		res, claimed, rerr := e.recoverKey(ctx, inv, k, claim, previous)
		if rerr != nil || res != nil {
			return res, rerr
		}
		saved, err = nil, nil
		if !claimed {
			err = ErrInFlight
		}
	}
	switch {
	case errors.Is(err, ErrInFlight):
		return nil, e.refuseWith(ctx, inv, keyInFlight())
	case errors.Is(err, ErrKeyReused):
		return nil, e.refuseWith(ctx, inv, keyReused())
	case err != nil:
		return nil, e.fault(ctx, inv, StageIdempotency, failure.CodeIdempotencyUnavailable, err)
	case saved != nil:
		// An attempt like any other: it leaves a row, naming the
		// invocation whose response it returns.
		e.outcomeAsync(ctx, inv, contract.OutcomeReplayed, StageIdempotency, failure.CodeIdempotencyReplayed,
			"returned the response of "+saved.InvocationID+"; nothing was dispatched", nil)
		return replay(saved)
	}
	inv.idem = &k
	e.hold(inv)
	inv.onUndo(func(ctx context.Context, e *Executor) { e.releaseKey(ctx, inv) })
	return nil, nil
}

// reserve claims the key. For a command that declares limits, on a store
// that can (ReserveSpender), the call's spending is decided in the same
// transaction — one commit for both — and budget_check reads the balances
// instead of spending again; what was recorded is given back by the chain
// if a stage before dispatch ends the call.
func (e *Executor) reserve(ctx context.Context, inv *invocation, k IdemKey, claim Reservation) (*Saved, error) {
	rs, ok := e.cfg.Store.(ReserveSpender)
	limits := e.limits[inv.cmd.Code]
	if !ok || len(limits) == 0 {
		return e.cfg.Store.Reserve(ctx, k, claim)
	}
	items, which := spendOf(inv, limits)
	if len(items) == 0 {
		return e.cfg.Store.Reserve(ctx, k, claim)
	}
	sp := Spending{Tenant: inv.p.Tenant, Key: &k, Items: items}
	saved, bal, err := rs.ReserveSpending(ctx, k, claim, sp)
	if err != nil || bal == nil {
		return saved, err
	}
	inv.prespent = &prespent{spending: sp, balances: bal, which: which}
	if fitsAll(bal) {
		inv.spent = &spent{tenant: sp.Tenant, receipt: ReceiptOf(sp, bal)}
		inv.onUndo(func(ctx context.Context, e *Executor) { e.refundSpend(ctx, inv) })
	}
	return saved, nil
}

// releaseKey gives the call's idempotency reservation back, so that a
// retry with the same key may run: the call did not run.
func (e *Executor) releaseKey(ctx context.Context, inv *invocation) {
	if inv.idem == nil {
		return
	}
	e.letGo(inv)
	if err := e.cfg.Store.Release(ctx, *inv.idem); err != nil {
		e.logger(ctx, inv).Error("releasing idempotency key", "error", err)
	}
	inv.idem = nil
}

// idempotencyKeyCheck is idempotency_check in check mode: the key's form
// is checked and the key is read, never reserved (Store.Peek). A key in
// use with other arguments, or by a call still running, is the refusal
// the call would get; a free key, one holding a response to replay, and
// one whose holder died (the call would ask its backend's receipt) let
// the call through.
func (e *Executor) idempotencyKeyCheck(ctx context.Context, inv *invocation) (*Result, error) {
	if fe := checkIdempotencyKey(inv); fe != nil {
		return nil, e.refuseWith(ctx, inv, fe)
	}
	key := inv.call.IdempotencyKey
	if key == "" {
		return nil, nil
	}
	k := IdemKey{Tenant: inv.p.Tenant, User: inv.p.UserID, Command: inv.cmd.Code, Key: key}
	_, err := e.cfg.Store.Peek(ctx, k, inv.argDigest)
	var abandoned *AbandonedError
	switch {
	case err == nil, errors.As(err, &abandoned):
		return nil, nil
	case errors.Is(err, ErrInFlight):
		return nil, e.refuseWith(ctx, inv, keyInFlight())
	case errors.Is(err, ErrKeyReused):
		return nil, e.refuseWith(ctx, inv, keyReused())
	}
	return nil, e.fault(ctx, inv, StageIdempotency, failure.CodeIdempotencyUnavailable, err)
}

// keyInFlight is the refusal of a call whose key a running call holds.
func keyInFlight() *failure.Error {
	fe := failure.New(StageIdempotency, failure.CodeIdempotencyInFlight, "a call with this idempotency key is still running")
	fe.Retriable, fe.Remedy = true, "wait, then retry with the same key to read its result"
	return fe
}

// keyReused is the refusal of a key used before with other arguments.
func keyReused() *failure.Error {
	fe := failure.New(StageIdempotency, failure.CodeIdempotencyKeyReused, "this idempotency key was used with different arguments")
	fe.Remedy = "use a new key for a new call"
	return fe
}
