package executor

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// withLimits replaces the limits of code with limits, resolved as the
// executor resolves a manifest's.
func withLimits(t *testing.T, h *stageHarness, code string, limits ...manifest.Limit) {
	t.Helper()
	md, ok := h.set.Method(code)
	if !ok {
		t.Fatalf("no method for %s", code)
	}
	cmd, _ := h.set.ByCode(code)
	var out []compiledLimit
	for _, l := range limits {
		cl, err := compileLimit(md.Input(), cmd, l)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, cl)
	}
	h.e.limits[code] = out
}

// agentRefunds is the bucket of the sample's agent-daily-refunds for
// finance-bot's EUR refunds.
func agentRefunds(t *testing.T, h *stageHarness) string {
	t.Helper()
	l := &h.e.limits["ticket.refund"][0]
	b, ok := bucketOf("ticket.refund", l, testPrincipal("acme", "carol", "finance-bot"), "EUR")
	if !ok || l.ID != "agent-daily-refunds" {
		t.Fatalf("the sample's refund limit is %s (counts the bot: %v)", l.ID, ok)
	}
	return b
}

// spendBefore spends amount of bucket under another holder, as earlier
// calls did.
func spendBefore(t *testing.T, h *stageHarness, bucket string, amount, max int64) {
	t.Helper()
	if _, err := h.store.Spend(t.Context(), Spending{Tenant: "acme", Force: true,
		Items: []SpendItem{{Bucket: bucket, Amount: amount, Max: max, Window: time.Hour}}}); err != nil {
		t.Fatal(err)
	}
}

// TestStageBudget runs budget_check alone, on the sample's refund (which
// declares a budget: an agent refunds at most 50.00 per currency a day,
// escalating past it) and on limits set for the test. A command without
// limits, and a call a limit does not count (a user's own refund under a
// per-agent limit), are handed on with nothing spent. A call that fits
// spends, under its idempotency key when it has one (a retry replaces its
// spend), and the chain gives the spend back when a later stage refuses.
// Past an escalating limit the call is handed on with the limit recorded,
// nothing spent, and confirmation_check asks a human naming the limit;
// the approved call (with its grant) spends past the ceiling. Past a
// refusing limit the call is refused rate.limited (a rate) or
// budget.exhausted (a budget), retriable after retry_after, or not
// retriable when the call alone is over the ceiling; a store that cannot
// be reached fails the call budget.unavailable. Check mode refuses the
// same with nothing spent and reports the balances. At dispatch a call
// that ran, or failed in its backend, keeps its spend; one never sent, or
// refused by its backend, gives it back.
func TestStageBudget(t *testing.T) {
	carol := testPrincipal("acme", "carol", "")
	bot := testPrincipal("acme", "carol", "finance-bot")
	refund := func(amount string) Call {
		return Call{Code: "ticket.refund", Input: refundOf(amount, "Goodwill gesture"), Channel: "grpc"}
	}
	rate := manifest.Limit{ID: "three-an-hour", Per: manifest.LimitPerUser, Window: "3600s", Max: 3,
		WhenExhausted: manifest.LimitExhaustRefuse, Description: "a user refunds at most three times an hour"}
	budget := manifest.Limit{ID: "user-budget", Per: manifest.LimitPerUser, Window: "3600s", Max: 100,
		SumField: "amount.amount_minor", WhenExhausted: manifest.LimitExhaustRefuse, Description: "a user refunds at most 1.00 an hour"}

	t.Run("a command without limits spends nothing", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, testPrincipal("acme", "alice", ""), Call{Code: "ticket.search", Input: []byte(searchArgs), Channel: "grpc"}, StageBudget, false)
		h.passes(t, ctx, inv, StageBudget)
		if inv.spent != nil || inv.escalatedBy != nil {
			t.Errorf("spent %v, escalated by %v", inv.spent, inv.escalatedBy)
		}
	})

	t.Run("a per-agent limit does not count a user's own call", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, carol, refund("50"), StageBudget, false)
		h.passes(t, ctx, inv, StageBudget)
		if inv.spent != nil {
			t.Errorf("carol's own refund spent %+v of the agents' budget", *inv.spent)
		}
	})

	t.Run("a call that fits spends, and a later refusal gives it back", func(t *testing.T) {
		h := newStageHarness(t)
		bucket := agentRefunds(t, h)
		ctx, inv := h.prepared(t, bot, refund("50"), StageBudget, false)
		h.passes(t, ctx, inv, StageBudget)
		if got := h.store.spent("acme", bucket); got != 50 {
			t.Fatalf("the bucket holds %d, want 50", got)
		}
		if len(inv.balances) != 1 || !inv.balances[0].Fits || inv.balances[0].Needs != 50 || inv.balances[0].Max != 5000 {
			t.Errorf("balances %+v", inv.balances)
		}
		inv.compensate(ctx, h.e)
		if got := h.store.spent("acme", bucket); got != 0 {
			t.Errorf("after the chain undid the call the bucket holds %d, want 0", got)
		}
	})

	t.Run("a keyed call spends under its key", func(t *testing.T) {
		// So that the store notes the spend on the key's record, and
		// Reclaim gives it back when a retry takes over a key whose call
		// never ran (executortest SpendKeyed): a retry spends once.
		h := newStageHarness(t)
		bucket := agentRefunds(t, h)
		call := refund("70")
		call.IdempotencyKey = "refund-once-0001"
		ctx, inv := h.prepared(t, bot, call, StageIdempotency, false)
		h.through(t, ctx, inv, StageBudget)
		h.passes(t, ctx, inv, StageBudget)
		if got := h.store.spent("acme", bucket); got != 70 {
			t.Errorf("the bucket holds %d, want 70", got)
		}
		h.store.mu.Lock()
		defer h.store.mu.Unlock()
		if len(h.store.spentUnder) != 1 || h.store.spentUnder[0].Key != "refund-once-0001" || h.store.spentUnder[0].User != bot.UserID {
			t.Errorf("spent under keys %+v, want the call's key", h.store.spentUnder)
		}
		if inv.spent == nil || len(inv.spent.receipt) != 1 || inv.spent.receipt[0].Amount != 70 {
			t.Errorf("the call's receipt %+v, want its 70", inv.spent)
		}
	})

	t.Run("past an escalating limit a human is asked, naming the limit", func(t *testing.T) {
		h := newStageHarness(t)
		bucket := agentRefunds(t, h)
		spendBefore(t, h, bucket, 4990, 5000)
		ctx, inv := h.prepared(t, bot, refund("50"), StageBudget, false)
		h.passes(t, ctx, inv, StageBudget)
		if len(inv.escalatedBy) != 1 || inv.escalatedBy[0].ID != "agent-daily-refunds" || inv.spent != nil {
			t.Fatalf("escalated by %v, spent %v", inv.escalatedBy, inv.spent)
		}
		if got := h.store.spent("acme", bucket); got != 4990 {
			t.Errorf("an escalated call spent: the bucket holds %d", got)
		}
		mark := h.audit.mark()
		res, err := h.run(t, ctx, inv, StageConfirmation)
		fe := wantRefusal(t, res, err, inv, StageConfirmation, failure.CodeConfirmationRequired)
		if !strings.Contains(fe.Message, "agent-daily-refunds") || !strings.Contains(fe.Message, "50.00 per currency a day") {
			t.Errorf("the refusal does not say which limit asks: %q", fe.Message)
		}
		h.confirm.script(func(c *fakeConfirm) {
			if len(c.opened) != 1 || !slices.Contains(c.opened[0].GetConditions(), "agent-daily-refunds") {
				t.Errorf("opened %v, want one challenge naming the limit", c.opened)
			}
		})
		wantOutcomeRow(t, h.audit.since(mark), inv, contract.OutcomeRefused, StageConfirmation, failure.CodeConfirmationRequired)
	})

	t.Run("the approved call runs past the ceiling and counts", func(t *testing.T) {
		h := newStageHarness(t)
		bucket := agentRefunds(t, h)
		spendBefore(t, h, bucket, 4990, 5000)
		call := refund("50")
		call.GrantID = "ch-approved"
		ctx, inv := h.prepared(t, bot, call, StageBudget, false)
		h.passes(t, ctx, inv, StageBudget)
		if inv.spent == nil || len(inv.spent.receipt) != 1 {
			t.Fatalf("the approved call did not spend past the ceiling: %+v", inv.spent)
		}
		if got := h.store.spent("acme", bucket); got != 5040 {
			t.Errorf("the bucket holds %d, want 5040", got)
		}
	})

	t.Run("a tenant's policy overrides the ceiling and the window", func(t *testing.T) {
		h := newStageHarness(t)
		bucket := agentRefunds(t, h)
		ctx, inv := h.prepared(t, bot, refund("150"), StageBudget, false)
		// acme's policy, as the directory resolves it: agents refund at
		// most 1.00 an hour.
		inv.res.Limits = map[string]directory.LimitOverride{
			directory.LimitKey("ticket.refund", "agent-daily-refunds"): {Max: 100, Window: time.Hour},
		}
		h.passes(t, ctx, inv, StageBudget)
		if len(inv.escalatedBy) != 1 || inv.spent != nil {
			t.Fatalf("a refund of 1.50 under acme's 1.00 ceiling: escalated by %v, spent %v", inv.escalatedBy, inv.spent)
		}
		if b := inv.balances; len(b) != 1 || b[0].Max != 100 || b[0].Fits {
			t.Errorf("balances %+v, want acme's ceiling of 100", b)
		}
		if got := h.store.spent("acme", bucket); got != 0 {
			t.Errorf("the bucket holds %d", got)
		}
	})

	t.Run("a check reads the limits and spends nothing", func(t *testing.T) {
		h := newStageHarness(t)
		bucket := agentRefunds(t, h)
		spendBefore(t, h, bucket, 4990, 5000)
		ctx, inv := h.prepared(t, bot, refund("50"), StageBudget, true)
		h.passes(t, ctx, inv, StageBudget)
		if len(inv.escalatedBy) != 1 || inv.spent != nil {
			t.Fatalf("escalated by %v, spent %v", inv.escalatedBy, inv.spent)
		}
		if b := inv.balances; len(b) != 1 || b[0].Fits || b[0].Used != 4990 || !b[0].Escalates {
			t.Errorf("balances %+v", b)
		}
		if got := h.store.spent("acme", bucket); got != 4990 {
			t.Errorf("the check spent: the bucket holds %d", got)
		}
	})

	// Which outcomes give the spend back: those where the call provably
	// did nothing.
	for _, tc := range []struct {
		name   string
		answer func(d *fakeDispatcher)
		kept   bool
	}{
		{"executed: kept", func(d *fakeDispatcher) { d.reply = Reply{JSON: []byte(`{"status":"REFUND_STATUS_ACCEPTED"}`)} }, true},
		{"never sent: given back", func(d *fakeDispatcher) {
			d.err = failure.Wrap(StageDispatch, failure.CodeHandlerUnavailable, "no backend is configured", ErrNotSent)
		}, false},
		{"refused by the backend: given back", func(d *fakeDispatcher) {
			fe := failure.New(failure.StageState, "state.not_found", "no such ticket")
			fe.Status = codes.NotFound
			d.err = fe.GRPCStatus().Err()
		}, false},
		{"failed in the backend: kept", func(d *fakeDispatcher) { d.err = status.Error(codes.Internal, "boom") }, true},
	} {
		t.Run("dispatch "+tc.name, func(t *testing.T) {
			h := newStageHarness(t)
			bucket := agentRefunds(t, h)
			h.disp.script(tc.answer)
			call := refund("50")
			call.IdempotencyKey = "settle-0001"
			ctx, inv := h.prepared(t, bot, call, StageDispatch, false)
			_, _ = h.run(t, ctx, inv, StageDispatch)
			h.e.wg.Wait()
			want := int64(0)
			if tc.kept {
				want = 50
			}
			if got := h.store.spent("acme", bucket); got != want {
				t.Errorf("after dispatch the bucket holds %d, want %d", got, want)
			}
		})
	}

	stageRefuses(t, StageBudget, []stageRefusal{
		{name: "a rate is spent", p: carol, call: refund("50"),
			arrange: func(h *stageHarness) {
				withLimits(t, h, "ticket.refund", rate)
				l := &h.e.limits["ticket.refund"][0]
				b, _ := bucketOf("ticket.refund", l, carol, "")
				for range 3 {
					if _, err := h.store.Spend(t.Context(), Spending{Tenant: "acme",
						Items: []SpendItem{{Bucket: b, Amount: 1, Max: 3, Window: time.Hour}}}); err != nil {
						t.Fatal(err)
					}
				}
			},
			stage: StageBudget, code: failure.CodeRateLimited,
			check: func(t *testing.T, h *stageHarness, inv *invocation, fe *failure.Error) {
				if !fe.Retriable || fe.RetryAfter <= 0 || fe.RetryAfter > time.Hour+SpendGrain(time.Hour) {
					t.Errorf("retriable %v after %s, want retriable within the window", fe.Retriable, fe.RetryAfter)
				}
				if !strings.Contains(fe.Message, "three-an-hour") || !strings.Contains(fe.Message, "0 of 3 left") {
					t.Errorf("the refusal does not name the limit and what is left: %q", fe.Message)
				}
				if inv.spent != nil {
					t.Error("a refused call spent")
				}
			}},
		{name: "a budget is spent", p: carol, call: refund("60"),
			arrange: func(h *stageHarness) {
				withLimits(t, h, "ticket.refund", budget)
				l := &h.e.limits["ticket.refund"][0]
				b, _ := bucketOf("ticket.refund", l, carol, "")
				spendBefore(t, h, b, 50, 100)
			},
			stage: StageBudget, code: failure.CodeBudgetExhausted,
			check: func(t *testing.T, _ *stageHarness, _ *invocation, fe *failure.Error) {
				if !fe.Retriable || fe.RetryAfter <= 0 {
					t.Errorf("retriable %v after %s", fe.Retriable, fe.RetryAfter)
				}
				if !strings.Contains(fe.Message, "user-budget") || !strings.Contains(fe.Message, "50 of 100 left") || !strings.Contains(fe.Message, "needs 60") {
					t.Errorf("the refusal does not say what is left: %q", fe.Message)
				}
			}},
		{name: "a call alone over the ceiling is not worth a retry", p: carol, call: refund("150"),
			arrange: func(h *stageHarness) { withLimits(t, h, "ticket.refund", budget) },
			stage:   StageBudget, code: failure.CodeBudgetExhausted,
			check: func(t *testing.T, _ *stageHarness, _ *invocation, fe *failure.Error) {
				if fe.Retriable || fe.RetryAfter != 0 {
					t.Errorf("retriable %v after %s, want neither", fe.Retriable, fe.RetryAfter)
				}
			}},
		{name: "the store is unreachable", p: bot, call: refund("50"),
			edit: func(h *stageHarness, _ *invocation) {
				h.store.script(func(s *fakeStore) { s.down = errors.New("connection refused") })
			},
			stage: StageBudget, code: failure.CodeBudgetUnavailable, failed: true},
	})
}

// BenchmarkStageBudget is budget_check's cost per call on the executor's
// side (the Go half of what BenchmarkLimitCost in ./api measures with
// Postgres): the sample refund's per-agent budget, its bucket and amount
// worked out from the decoded request and spent in a store that costs
// next to nothing (the test's map), and a command that declares no limit.
//
//	go test ./services/executor -run '^$' -bench StageBudget
func BenchmarkStageBudget(b *testing.B) {
	store := newFakeStore()
	e, set := benchExecutor(b, store)
	for _, tc := range []struct{ name, code, args string }{
		{"refund-agent-budget", "ticket.refund", string(refundOf("1", "Goodwill gesture"))},
		{"no-limits", "ticket.search", searchArgs},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cmd, _ := set.ByCode(tc.code)
			md, _ := set.Method(tc.code)
			req, err := e.decoder.Decode(md.Input(), []byte(tc.args))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				store.mu.Lock()
				clear(store.spends)
				store.mu.Unlock()
				inv := &invocation{call: Call{Code: tc.code, Channel: "grpc"}, p: testPrincipal("acme", "carol", "finance-bot"),
					cmd: cmd, method: md, req: req}
				if _, err := e.budgetCheck(ctx, inv); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
