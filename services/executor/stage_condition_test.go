package executor

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/condition"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// refundOf is the refund arguments with amount (minor units) and reason.
func refundOf(amount, reason string) []byte {
	return []byte(`{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"` + amount + `"},"reason":"` + reason + `","cardholder_reference":"CH4242424242"}`)
}

// withConditions replaces the compiled conditions of code with conds,
// compiled as the executor compiles a manifest's.
func withConditions(t *testing.T, h *stageHarness, code string, conds ...manifest.Condition) {
	t.Helper()
	md, ok := h.set.Method(code)
	if !ok {
		t.Fatalf("no method for %s", code)
	}
	env, err := condition.NewEnv(h.set.Files(), md.Input())
	if err != nil {
		t.Fatal(err)
	}
	var out []compiledCondition
	for _, c := range conds {
		prg, err := env.Compile(c.Expression)
		if err != nil {
			t.Fatalf("%s: %v", c.ID, err)
		}
		out = append(out, compiledCondition{Condition: c, prg: prg})
	}
	h.e.conditions[code] = out
}

// TestStageCondition runs condition_check alone, on the sample's refund
// (which declares a human from 1.00 on, and no agent refund above
// 10,000.00) and on conditions set for the test. A command without
// conditions is handed on untouched; a condition that asks a human is
// handed on with the condition recorded, and confirmation_check then asks
// one, naming the condition to the confirm service and in the refusal; a
// call no condition holds for is handed on and nobody is asked (the small
// refund runs); a DENY refuses with condition.denied naming the condition;
// a condition that cannot be evaluated refuses with
// condition.evaluation_failed (fail closed). Each refusal in check mode is
// the same, with no row and no effect; a check of a call a condition sends
// to a human says why.
func TestStageCondition(t *testing.T) {
	carol := testPrincipal("acme", "carol", "")
	bot := testPrincipal("acme", "carol", "finance-bot")
	refund := func(amount, reason string) Call {
		return Call{Code: "ticket.refund", Input: refundOf(amount, reason), Channel: "grpc"}
	}

	t.Run("no conditions", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, testPrincipal("acme", "alice", ""), Call{Code: "ticket.search", Input: []byte(searchArgs), Channel: "grpc"}, StageCondition, false)
		h.passes(t, ctx, inv, StageCondition)
		if inv.askedBy != nil {
			t.Errorf("a command without conditions asked %v", inv.askedBy)
		}
	})

	t.Run("a large refund asks a human, saying why", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, carol, refund("2500", "Customer was charged twice"), StageCondition, false)
		h.passes(t, ctx, inv, StageCondition)
		if len(inv.askedBy) != 1 || inv.askedBy[0].ID != "refund-needs-a-human" {
			t.Fatalf("asked by %v, want refund-needs-a-human", inv.askedBy)
		}
		mark := h.audit.mark()
		res, err := h.run(t, ctx, inv, StageConfirmation)
		fe := wantRefusal(t, res, err, inv, StageConfirmation, failure.CodeConfirmationRequired)
		if !strings.Contains(fe.Message, "a human is asked for a refund of 1.00 or more") || !strings.Contains(fe.Message, "refund-needs-a-human") {
			t.Errorf("the refusal does not say why: %q", fe.Message)
		}
		h.confirm.script(func(c *fakeConfirm) {
			if len(c.opened) != 1 || !slices.Equal(c.opened[0].GetConditions(), []string{"refund-needs-a-human"}) {
				t.Errorf("opened %v, want one challenge naming refund-needs-a-human", c.opened)
			}
		})
		rows := h.audit.since(mark)
		wantOutcomeRow(t, rows, inv, contract.OutcomeRefused, StageConfirmation, failure.CodeConfirmationRequired)
		if !strings.Contains(rows[0].GetMessage(), "refund-needs-a-human") {
			t.Errorf("the audit row does not record the condition: %q", rows[0].GetMessage())
		}
	})

	t.Run("a small refund runs without a human", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, carol, refund("50", "Goodwill"), StageCondition, false)
		h.passes(t, ctx, inv, StageCondition)
		if inv.askedBy != nil {
			t.Fatalf("a 0.50 refund asked %v", inv.askedBy)
		}
		h.passes(t, ctx, inv, StageConfirmation)
		if n := h.confirm.calls().open; n != 0 {
			t.Errorf("%d challenges opened for a refund no condition asks for", n)
		}
	})

	t.Run("the check of a large refund says why a human is asked", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, carol, refund("2500", "Customer was charged twice"), StageConfirmation, true)
		if res, err := h.run(t, ctx, inv, StageConfirmation); res != nil || err != nil {
			t.Fatalf("confirmation check = (%v, %v)", res, err)
		}
		if inv.needsApproval == nil || !strings.Contains(inv.needsApproval.Message, "refund-needs-a-human") {
			t.Fatalf("the check's verdict %+v does not name the condition", inv.needsApproval)
		}
		if n := h.confirm.calls().open; n != 0 {
			t.Errorf("the check opened %d challenges", n)
		}
	})

	t.Run("conditions never waive a declared confirmation", func(t *testing.T) {
		h := newStageHarness(t)
		// expense.report.approve always asks; a condition that does not
		// hold changes nothing.
		withConditions(t, h, "expense.report.approve", manifest.Condition{ID: "never", Expression: "false", Effect: condition.EffectRequireConfirmation, Description: "d"})
		ctx, inv := h.prepared(t, testPrincipal("acme", "bob", ""), Call{Code: "expense.report.approve", Input: []byte(approveArgs), Channel: "grpc"}, StageCondition, false)
		h.passes(t, ctx, inv, StageCondition)
		if !h.e.needsConfirmation(inv) {
			t.Fatal("a declaration that asks a human no longer does")
		}
	})

	stageRefuses(t, StageCondition, []stageRefusal{
		{name: "an agent refunds more than 10,000.00", p: bot, call: refund("2000000", "Customer was charged twice"),
			stage: StageCondition, code: failure.CodeConditionDenied,
			check: func(t *testing.T, h *stageHarness, inv *invocation, fe *failure.Error) {
				if !strings.Contains(fe.Message, "agents-refund-at-most-10000") || !strings.Contains(fe.Message, "an agent may not refund more than 10,000.00") {
					t.Errorf("the refusal does not name the condition: %q", fe.Message)
				}
				if inv.askedBy != nil && h.confirm.calls().open != 0 {
					t.Error("a denied call asked a human")
				}
			}},
		{name: "deny for agents with a short reason", p: bot, call: refund("2500", "dup"),
			arrange: func(h *stageHarness) {
				withConditions(t, h, "ticket.refund", manifest.Condition{ID: "agents.reason-too-short",
					Expression: "principal.kind == 'agent' && request.reason.size() < 10", Effect: condition.EffectDeny,
					Description: "an agent must give a reason of 10 characters or more"})
			},
			stage: StageCondition, code: failure.CodeConditionDenied,
			check: func(t *testing.T, _ *stageHarness, _ *invocation, fe *failure.Error) {
				if !strings.Contains(fe.Message, "agents.reason-too-short") {
					t.Errorf("the refusal does not name the condition: %q", fe.Message)
				}
			}},
		{name: "a condition that cannot be evaluated fails closed", p: carol, call: refund("2500", "Customer was charged twice"),
			arrange: func(h *stageHarness) {
				withConditions(t, h, "ticket.refund", manifest.Condition{ID: "broken",
					Expression: "[1, 2][request.amount.amount_minor] == 1", Effect: condition.EffectRequireConfirmation, Description: "d"})
			},
			stage: StageCondition, code: failure.CodeConditionEvaluationFailed,
			check: func(t *testing.T, _ *stageHarness, _ *invocation, fe *failure.Error) {
				if !strings.Contains(fe.Message, "broken") {
					t.Errorf("the refusal does not name the condition: %q", fe.Message)
				}
			}},
		{name: "the principal's channel and roles are read", p: carol, call: refund("2500", "Customer was charged twice"),
			arrange: func(h *stageHarness) {
				withConditions(t, h, "ticket.refund", manifest.Condition{ID: "finance-over-grpc",
					Expression: "principal.channel == 'grpc' && 'finance' in principal.roles && principal.tenant == 'acme' && principal.user == 'carol'",
					Effect:     condition.EffectDeny, Description: "d"})
			},
			stage: StageCondition, code: failure.CodeConditionDenied},
	})

	t.Run("a user may make the refund an agent may not", func(t *testing.T) {
		h := newStageHarness(t)
		ctx, inv := h.prepared(t, carol, refund("2000000", "Customer was charged twice"), StageCondition, false)
		h.passes(t, ctx, inv, StageCondition)
	})
}

// benchExecutor is an executor of the embedded manifest over store and
// fakes, for a stage's benchmark.
func benchExecutor(b *testing.B, store Store) (*Executor, *manifest.Set) {
	b.Helper()
	set, err := manifest.Embedded()
	if err != nil {
		b.Fatal(err)
	}
	e, err := New(Config{Manifest: set, Directory: &flakyDirectory{}, Audit: &fakeAudit{}, Confirm: &fakeConfirm{},
		Dispatcher: &fakeDispatcher{}, Store: store, SpoolInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.Close)
	return e, set
}

// BenchmarkConditionStage is condition_check's cost per call: the sample
// refund's two conditions evaluated on a decoded request (one holds, and
// asks a human), and a command that declares none. Compare with a whole
// governed call in process (BenchmarkInProcess in ./api).
//
//	go test ./services/executor -run '^$' -bench ConditionStage
func BenchmarkConditionStage(b *testing.B) {
	e, set := benchExecutor(b, newFakeStore())
	for _, tc := range []struct{ name, code, args string }{
		{"refund-two-conditions", "ticket.refund", string(refundOf("2500", "Customer was charged twice"))},
		{"no-conditions", "ticket.search", searchArgs},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cmd, _ := set.ByCode(tc.code)
			md, _ := set.Method(tc.code)
			req, err := e.decoder.Decode(md.Input(), []byte(tc.args))
			if err != nil {
				b.Fatal(err)
			}
			inv := &invocation{call: Call{Code: tc.code, Channel: "grpc"}, p: testPrincipal("acme", "carol", "finance-bot"),
				cmd: cmd, method: md, req: req}
			inv.res.Roles = []string{"finance"}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				inv.askedBy = inv.askedBy[:0]
				if _, err := e.conditionCheck(ctx, inv); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
