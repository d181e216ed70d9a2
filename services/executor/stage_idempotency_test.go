package executor

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/mandate-dev/mandate/internal/callattr"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
)

// TestStageIdempotency runs idempotency_check alone.
//   - Without a key the call is handed on holding nothing.
//   - A new key is reserved in the store for this invocation and its
//     digest, and an undo is registered that gives it back; in check mode
//     the key is only read: nothing is reserved, nothing to undo.
//   - A key that holds a finished call's response answers with it
//     (replayed, one outcome row naming the first invocation, nothing
//     held); in check mode it lets the call through.
//   - A key abandoned in flight is settled from the backend's receipt:
//     executed replays its result (the key settled on it), not executed
//     hands the key over to this call, no receipt refuses with
//     idempotency.outcome_unknown; in check mode it lets the call through.
//   - A malformed key, or one the channel could not read, a key used with
//     other arguments, a key whose call is still running and a store that
//     cannot be reached are refused (the last as a fault), in both modes.
func TestStageIdempotency(t *testing.T) {
	alice := testPrincipal("acme", "alice", "")
	create := func(key string) Call {
		return Call{Code: "expense.report.create", Input: []byte(createArgs), Channel: "grpc", IdempotencyKey: key}
	}
	key := IdemKey{Tenant: "acme", User: "alice", Command: "expense.report.create", Key: "key-1"}

	t.Run("no key", func(t *testing.T) {
		for _, checking := range []bool{false, true} {
			h := newStageHarness(t)
			ctx, inv := h.prepared(t, alice, create(""), StageIdempotency, checking)
			h.passes(t, ctx, inv, StageIdempotency)
			if inv.idem != nil || len(inv.undo) != 0 || h.store.heldBy(inv.id) != nil {
				t.Errorf("checking=%v: a call without a key holds %v, %d undo steps", checking, inv.idem, len(inv.undo))
			}
		}
	})

	t.Run("new key reserved, and given back by the undo", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, alice, create("key-1"), StageIdempotency, false)
		h.passes(t, ctx, inv, StageIdempotency)
		r := h.store.key(key)
		if r == nil || r.invocation != inv.id || r.digest != inv.argDigest || r.done {
			t.Fatalf("the store holds %+v for %v, want a reservation of %s", r, key, inv.id)
		}
		if inv.idem == nil || *inv.idem != key || len(inv.undo) != 1 {
			t.Fatalf("the invocation holds %v with %d undo steps, want %v and one", inv.idem, len(inv.undo), key)
		}
		inv.compensate(ctx, h.e)
		if h.store.key(key) != nil || inv.idem != nil || !slices.Contains(h.store.released(), key) {
			t.Errorf("after the undo the store still holds %+v (released %v)", h.store.key(key), h.store.released())
		}
	})

	t.Run("check mode reserves nothing", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, alice, create("key-1"), StageIdempotency, true)
		h.passes(t, ctx, inv, StageIdempotency)
		if h.store.key(key) != nil || inv.idem != nil || len(inv.undo) != 0 {
			t.Errorf("a check reserved %+v, holds %v, %d undo steps", h.store.key(key), inv.idem, len(inv.undo))
		}
	})

	// seed puts a record of invocation first under key, for the arguments
	// of inv.
	seed := func(h *stageHarness, inv *invocation, r fakeKey) {
		if r.digest == "" {
			r.digest = inv.argDigest
		}
		h.store.script(func(s *fakeStore) { s.keys[key] = &r })
	}
	saved := Saved{InvocationID: "inv_first", Output: []byte(`{"report_id":"ER-1"}`), AuditID: "acme/7"}

	t.Run("finished key replays", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, alice, create("key-1"), StageIdempotency, false)
		seed(h, inv, fakeKey{invocation: "inv_first", done: true, saved: saved})
		mark := h.audit.mark()
		res, err := h.run(t, ctx, inv, StageIdempotency)
		h.e.wg.Wait()
		if err != nil || res == nil || !res.Replayed || string(res.Output) != string(saved.Output) || res.InvocationID != "inv_first" || res.AuditID != "acme/7" {
			t.Fatalf("got (%+v, %v), want the replay of inv_first", res, err)
		}
		rows := h.audit.since(mark)
		wantOutcomeRow(t, rows, inv, contract.OutcomeReplayed, StageIdempotency, failure.CodeIdempotencyReplayed)
		if !strings.Contains(rows[0].GetMessage(), "inv_first") {
			t.Errorf("the replay row does not name the first invocation: %q", rows[0].GetMessage())
		}
		if r := h.store.key(key); r.invocation != "inv_first" || inv.idem != nil || len(inv.undo) != 0 {
			t.Errorf("the replay took the key over: %+v, holds %v", r, inv.idem)
		}
	})

	t.Run("check mode lets a replay through", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, alice, create("key-1"), StageIdempotency, true)
		seed(h, inv, fakeKey{invocation: "inv_first", done: true, saved: saved})
		h.passes(t, ctx, inv, StageIdempotency)
	})

	t.Run("abandoned key, the receipt says it ran", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, alice, create("key-1"), StageIdempotency, false)
		seed(h, inv, fakeKey{invocation: "inv_dead", abandoned: true})
		h.disp.script(func(d *fakeDispatcher) {
			d.receipt = func(disp Dispatch) (Receipt, error) {
				return Receipt{Executed: true, Result: dynamicpb.NewMessage(disp.Method.Output())}, nil
			}
		})
		mark := h.audit.mark()
		res, err := h.run(t, ctx, inv, StageIdempotency)
		h.e.wg.Wait()
		if err != nil || res == nil || !res.Replayed || res.InvocationID != "inv_dead" {
			t.Fatalf("got (%+v, %v), want the replay of inv_dead's receipt", res, err)
		}
		if asked := h.disp.receipts(); len(asked) != 1 || asked[0].InvocationID != "inv_dead" {
			t.Errorf("receipts asked %+v, want inv_dead's", asked)
		}
		if r := h.store.key(key); r == nil || !r.done || r.saved.InvocationID != "inv_dead" {
			t.Errorf("the key was not settled on the receipt: %+v", r)
		}
		wantOutcomeRow(t, h.audit.since(mark), inv, contract.OutcomeReplayed, StageIdempotency, failure.CodeIdempotencyReplayed)
		if h.disp.count() != 0 {
			t.Error("a replay dispatched")
		}
	})

	t.Run("abandoned key, the receipt says it never ran", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, alice, create("key-1"), StageIdempotency, false)
		seed(h, inv, fakeKey{invocation: "inv_dead", abandoned: true})
		h.disp.script(func(d *fakeDispatcher) {
			d.receipt = func(Dispatch) (Receipt, error) { return Receipt{}, nil }
		})
		h.passes(t, ctx, inv, StageIdempotency)
		if r := h.store.key(key); r == nil || r.invocation != inv.id || r.abandoned {
			t.Errorf("the key was not handed over: %+v", r)
		}
		if inv.idem == nil || *inv.idem != key || !inv.priorNotRun || len(inv.undo) != 1 {
			t.Errorf("the invocation holds %v (prior not run %v, %d undo steps), want the key, true, one", inv.idem, inv.priorNotRun, len(inv.undo))
		}
	})

	t.Run("abandoned key without a receipt", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, alice, create("key-1"), StageIdempotency, false)
		seed(h, inv, fakeKey{invocation: "inv_dead", abandoned: true})
		mark := h.audit.mark()
		res, err := h.run(t, ctx, inv, StageIdempotency)
		fe := wantRefusal(t, res, err, inv, StageIdempotency, failure.CodeIdempotencyOutcomeUnknown)
		if !fe.Retriable || !strings.Contains(fe.Message, "inv_dead") {
			t.Errorf("refusal %+v, want retriable and naming inv_dead", fe)
		}
		wantOutcomeRow(t, h.audit.since(mark), inv, contract.OutcomeRefused, StageIdempotency, failure.CodeIdempotencyOutcomeUnknown)
		if r := h.store.key(key); r.invocation != "inv_dead" || inv.idem != nil {
			t.Errorf("the key moved: %+v, held %v", r, inv.idem)
		}
	})

	t.Run("check mode lets an abandoned key through", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, alice, create("key-1"), StageIdempotency, true)
		seed(h, inv, fakeKey{invocation: "inv_dead", abandoned: true})
		h.passes(t, ctx, inv, StageIdempotency)
		if len(h.disp.receipts()) != 0 || h.store.key(key).invocation != "inv_dead" {
			t.Error("a check asked a receipt or moved the key")
		}
	})

	keyDropped := func(t *testing.T, _ *stageHarness, inv *invocation, fe *failure.Error) {
		if inv.call.IdempotencyKey != "" || len(fe.Violations) == 0 || fe.Violations[0].Pointer != "/"+callattr.IdempotencyKey {
			t.Errorf("key kept as %q, violations %+v", inv.call.IdempotencyKey, fe.Violations)
		}
	}
	untouched := func(who string) func(*testing.T, *stageHarness, *invocation, *failure.Error) {
		return func(t *testing.T, h *stageHarness, inv *invocation, _ *failure.Error) {
			if r := h.store.key(key); r == nil || r.invocation != who || inv.idem != nil || len(inv.undo) != 0 {
				t.Errorf("the key is %+v, held %v: want it %s's still", r, inv.idem, who)
			}
		}
	}
	stageRefuses(t, StageIdempotency, []stageRefusal{
		{name: "malformed key", p: alice, call: create("bad\x00key"),
			stage: StageIdempotency, code: failure.CodeIdempotencyInvalidKey, check: keyDropped},
		{name: "key too long", p: alice, call: create(strings.Repeat("k", callattr.MaxIdempotencyKey+1)),
			stage: StageIdempotency, code: failure.CodeIdempotencyInvalidKey, check: keyDropped},
		{name: "key the channel could not read", p: alice,
			call: func() Call {
				c := create("")
				c.Invalid = []callattr.Invalid{*callattr.TypeError(callattr.IdempotencyKey, "42")}
				return c
			}(),
			stage: StageIdempotency, code: failure.CodeIdempotencyInvalidKey, check: keyDropped},
		{name: "key used with other arguments", p: alice, call: create("key-1"),
			edit: func(h *stageHarness, inv *invocation) {
				seed(h, inv, fakeKey{digest: "other", invocation: "inv_first", done: true})
			},
			stage: StageIdempotency, code: failure.CodeIdempotencyKeyReused, check: untouched("inv_first")},
		{name: "key in flight", p: alice, call: create("key-1"),
			edit:  func(h *stageHarness, inv *invocation) { seed(h, inv, fakeKey{invocation: "inv_running"}) },
			stage: StageIdempotency, code: failure.CodeIdempotencyInFlight,
			check: func(t *testing.T, h *stageHarness, inv *invocation, fe *failure.Error) {
				untouched("inv_running")(t, h, inv, fe)
				if !fe.Retriable {
					t.Error("in_flight is not retriable")
				}
			}},
		{name: "store unreachable", p: alice, call: create("key-1"),
			arrange: func(h *stageHarness) {
				h.store.script(func(s *fakeStore) { s.down = fmt.Errorf("%w: connection refused", ErrUnavailable) })
			},
			stage: StageIdempotency, code: failure.CodeIdempotencyUnavailable, failed: true},
	})
}
