package executor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/limit"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// compiledLimit is one declared limit with its window and field paths
// resolved once, when the executor is built over its manifest.
type compiledLimit struct {
	manifest.Limit
	window     time.Duration
	sum, group limit.Path
	// quiet: the summed field is declared sensitive, so refusals never
	// say how much is used or left.
	quiet bool
}

// compileLimits resolves every command's declared limits. A limit the
// build accepted resolves here too; one that does not (a manifest not
// built by protoc-gen-mandate) stops the executor from starting rather
// than run the command without its ceiling.
func compileLimits(set *manifest.Set) (map[string][]compiledLimit, error) {
	out := map[string][]compiledLimit{}
	for _, c := range set.Commands() {
		if len(c.Limits) == 0 {
			continue
		}
		md, ok := set.Method(c.Code)
		if !ok {
			return nil, fmt.Errorf("executor: limits of %s: the command has no method", c.Code)
		}
		for _, l := range c.Limits {
			cl, err := compileLimit(md.Input(), c, l)
			if err != nil {
				return nil, err
			}
			out[c.Code] = append(out[c.Code], cl)
		}
	}
	return out, nil
}

// compileLimit resolves one limit of command c over its request input.
func compileLimit(input protoreflect.MessageDescriptor, c *manifest.Command, l manifest.Limit) (compiledLimit, error) {
	cl := compiledLimit{Limit: l}
	var err error
	if cl.window, err = limit.Window(l.Window); err != nil {
		return cl, fmt.Errorf("executor: limit %s of %s: %w", l.ID, c.Code, err)
	}
	if l.Max <= 0 {
		return cl, fmt.Errorf("executor: limit %s of %s: max %d is not positive", l.ID, c.Code, l.Max)
	}
	switch l.Per {
	case manifest.LimitPerAgent, manifest.LimitPerUser, manifest.LimitPerTenant:
	default:
		return cl, fmt.Errorf("executor: limit %s of %s: unknown scope %q", l.ID, c.Code, l.Per)
	}
	switch l.WhenExhausted {
	case manifest.LimitExhaustRefuse, manifest.LimitExhaustEscalate:
	default:
		return cl, fmt.Errorf("executor: limit %s of %s: unknown exhaustion policy %q", l.ID, c.Code, l.WhenExhausted)
	}
	if l.SumField != "" {
		if cl.sum, err = limit.Resolve(input, l.SumField, true); err != nil {
			return cl, fmt.Errorf("executor: limit %s of %s: %w", l.ID, c.Code, err)
		}
		pointer := "/" + strings.ReplaceAll(l.SumField, ".", "/")
		for _, s := range c.SensitiveFields {
			if pointer == s || strings.HasPrefix(pointer, s+"/") {
				cl.quiet = true
			}
		}
	}
	if l.GroupField != "" {
		if cl.group, err = limit.Resolve(input, l.GroupField, false); err != nil {
			return cl, fmt.Errorf("executor: limit %s of %s: %w", l.ID, c.Code, err)
		}
	}
	return cl, nil
}

// spendOf is what the call spends of its command's limits: one item per
// limit that counts it (a per-agent limit does not count a call no agent
// makes), and the limits in the same order.
func spendOf(inv *invocation, limits []compiledLimit) ([]SpendItem, []*compiledLimit) {
	items := make([]SpendItem, 0, len(limits))
	used := make([]*compiledLimit, 0, len(limits))
	for i := range limits {
		l := &limits[i]
		group := ""
		if l.group != nil {
			group = l.group.Group(inv.req.ProtoReflect())
		}
		bucket, counts := bucketOf(inv.cmd.Code, l, inv.p, group)
		if !counts {
			continue
		}
		ceiling, window := effective(inv.res.Limits, inv.cmd.Code, l)
		amount := int64(1)
		if l.sum != nil {
			amount = l.sum.Amount(inv.req.ProtoReflect(), ceiling)
		}
		items = append(items, SpendItem{Bucket: bucket, Amount: amount, Max: ceiling, Window: window})
		used = append(used, l)
	}
	return items, used
}

// bucketOf is the bucket of command's limit l that p's calls (with group,
// the value of the limit's group field) count in, and false when l does
// not count p's calls (a per-agent limit, a call no agent makes).
func bucketOf(command string, l *compiledLimit, p identity.Principal, group string) (string, bool) {
	var whose string
	switch l.Per {
	case manifest.LimitPerAgent:
		if p.AgentID == "" {
			return "", false
		}
		whose = "agent:" + p.AgentID
	case manifest.LimitPerUser:
		whose = "user:" + p.UserID
	default:
		whose = "tenant"
	}
	bucket := command + "/" + l.ID + "/" + whose
	if l.group != nil {
		sum := sha256.Sum256([]byte(group))
		bucket += "/" + hex.EncodeToString(sum[:12])
	}
	return bucket, true
}

// planLimits are command's limits as p stands under them before any call
// (Plan): a rate as a call that needs one, a budget as what is spent. A
// limit counted per value of a field is described, not measured: which
// value a call spends under is the call's.
func (e *Executor) planLimits(ctx context.Context, command string, p identity.Principal, overrides map[string]directory.LimitOverride) ([]*mandatev1.LimitState, error) {
	limits := e.limits[command]
	var items []SpendItem
	var which []*compiledLimit
	for i := range limits {
		l := &limits[i]
		if l.group != nil {
			continue
		}
		bucket, counts := bucketOf(command, l, p, "")
		if !counts {
			continue
		}
		needs := int64(1)
		if l.sum != nil {
			needs = 0
		}
		ceiling, window := effective(overrides, command, l)
		items = append(items, SpendItem{Bucket: bucket, Amount: needs, Max: ceiling, Window: window})
		which = append(which, l)
	}
	if len(items) == 0 {
		return nil, nil
	}
	bal, err := e.cfg.Store.Spend(ctx, Spending{Tenant: p.Tenant, Items: items, DryRun: true})
	if err != nil {
		return nil, err
	}
	out := make([]*mandatev1.LimitState, len(which))
	for i, b := range limitBalances(which, items, bal) {
		out[i] = &mandatev1.LimitState{Id: b.ID, Description: b.Description, Max: b.Max, Used: b.Used, Needs: b.Needs,
			Fits: b.Fits, Escalates: b.Escalates}
		if !b.Fits && b.RetryAfter > 0 {
			out[i].RetryAfter = durationpb.New(b.RetryAfter)
		}
	}
	return out, nil
}

// effective is limit l's ceiling and window in the caller's tenant: the
// declared ones, or the tenant's own where its policy overrides them
// (directory.Resolution.Limits).
func effective(overrides map[string]directory.LimitOverride, command string, l *compiledLimit) (int64, time.Duration) {
	ceiling, window := l.Max, l.window
	if ov, ok := overrides[directory.LimitKey(command, l.ID)]; ok {
		if ov.Max > 0 {
			ceiling = ov.Max
		}
		if ov.Window > 0 {
			window = ov.Window
		}
	}
	return ceiling, window
}

// budgetCheck counts the call against its command's declared limits
// (rates and budgets, sliding windows shared by every executor of the
// store), after the conditions and before a human is asked. A call that
// fits spends, noting the spend on its idempotency key's record where it
// has one (Store.Reclaim gives it back if a retry takes the key over from
// an attempt that never ran), and keeps its receipt: the chain gives the
// spend back if a later stage before dispatch ends the call; dispatch gives it back when
// the call provably did not run or its backend refused it. A call that
// would go past a limit declared to refuse is refused (rate.limited for a
// rate, budget.exhausted for a budget), retriable after retry_after; past
// a limit declared to escalate it needs a human instead — without a grant
// nothing is spent and confirmation_check opens a challenge naming the
// limit; with one, the spend is recorded past the ceiling (the human
// approved it) and confirmation_check redeems the grant.
func (e *Executor) budgetCheck(ctx context.Context, inv *invocation) (*Result, error) {
	return e.budget(ctx, inv, false)
}

// budgetVerdict is budget_check in check mode: the limits are read and
// nothing is spent (Store.Spend with DryRun). A limit declared to refuse
// that the call would go past is the refusal; one declared to escalate
// makes confirmation_check's verdict approval required. The balances
// found are the verdict's Limits.
func (e *Executor) budgetVerdict(ctx context.Context, inv *invocation) (*Result, error) {
	return e.budget(ctx, inv, true)
}

func (e *Executor) budget(ctx context.Context, inv *invocation, dry bool) (*Result, error) {
	limits := e.limits[inv.cmd.Code]
	if len(limits) == 0 {
		return nil, nil
	}
	var (
		items []SpendItem
		which []*compiledLimit
		sp    Spending
		bal   []Balance
	)
	if pre := inv.prespent; pre != nil && !dry {
		// Decided with the key's reservation (idempotency_check): what
		// fitted is recorded already, with its undo.
		sp, bal, which, items = pre.spending, pre.balances, pre.which, pre.spending.Items
	} else {
		items, which = spendOf(inv, limits)
		if len(items) == 0 {
			return nil, nil
		}
		sp = Spending{Tenant: inv.p.Tenant, Key: inv.idem, Items: items, DryRun: dry}
		var err error
		if bal, err = e.spend(ctx, sp); err != nil {
			return nil, e.fault(ctx, inv, StageBudget, failure.CodeBudgetUnavailable, err)
		}
	}
	inv.balances = limitBalances(which, items, bal)
	var refusing, escalating []int
	for i, b := range bal {
		if b.Fits {
			continue
		}
		if which[i].WhenExhausted == manifest.LimitExhaustEscalate {
			escalating = append(escalating, i)
		} else {
			refusing = append(refusing, i)
		}
	}
	switch {
	case len(refusing) > 0:
		return nil, e.refuseWith(ctx, inv, exhausted(which, items, bal, refusing))
	case len(escalating) > 0:
		for _, i := range escalating {
			inv.escalatedBy = append(inv.escalatedBy, which[i])
		}
		if dry || inv.call.GrantID == "" {
			// Nothing is spent: confirmation_check asks a human.
			return nil, nil
		}
		// The call comes back approved: it runs past the ceiling, and
		// counts.
		sp.Force = true
		var err error
		if bal, err = e.spend(ctx, sp); err != nil {
			return nil, e.fault(ctx, inv, StageBudget, failure.CodeBudgetUnavailable, err)
		}
	case dry, inv.spent != nil:
		// A check spends nothing; a spend recorded with the key's
		// reservation has its undo already.
		return nil, nil
	}
	inv.spent = &spent{tenant: sp.Tenant, receipt: ReceiptOf(sp, bal)}
	inv.onUndo(func(ctx context.Context, e *Executor) { e.refundSpend(ctx, inv) })
	return nil, nil
}

// spent is what a call recorded of its limits: its receipt, which
// refundSpend gives back.
type spent struct {
	tenant  string
	receipt []Spent
}

// prespent is a spending decided with the key's reservation
// (ReserveSpender), for budget_check to read.
type prespent struct {
	spending Spending
	balances []Balance
	which    []*compiledLimit
}

// fitsAll reports whether every balance fits.
func fitsAll(bal []Balance) bool {
	for _, b := range bal {
		if !b.Fits {
			return false
		}
	}
	return true
}

// spend is Store.Spend inside the stage's span.
func (e *Executor) spend(ctx context.Context, sp Spending) ([]Balance, error) {
	var bal []Balance
	err := e.stage(ctx, StageBudget, func(ctx context.Context) error {
		var err error
		bal, err = e.cfg.Store.Spend(ctx, sp)
		return err
	})
	return bal, err
}

// refundSpend gives back what the call spent of its limits: it did not
// run (a later stage refused it, it was never sent, its backend fenced or
// refused it).
func (e *Executor) refundSpend(ctx context.Context, inv *invocation) {
	if inv.spent == nil {
		return
	}
	if err := e.cfg.Store.Refund(context.WithoutCancel(ctx), inv.spent.tenant, inv.spent.receipt); err != nil {
		e.logger(ctx, inv).Error("refunding the call's limits", "error", err)
	}
	inv.spent = nil
}

// exhausted is the refusal of a call past the limits at idx (declared to
// refuse): budget.exhausted when one of them sums a field, rate.limited
// otherwise; retriable after the longest wait among them, not retriable
// when a call alone is over a ceiling.
func exhausted(which []*compiledLimit, items []SpendItem, bal []Balance, idx []int) *failure.Error {
	code := failure.CodeRateLimited
	var wait time.Duration
	never := false
	parts := make([]string, 0, len(idx))
	for _, i := range idx {
		l := which[i]
		if l.sum != nil {
			code = failure.CodeBudgetExhausted
		}
		if bal[i].RetryAfter <= 0 {
			never = true
		}
		wait = max(wait, bal[i].RetryAfter)
		p := "limit " + l.ID + " (" + l.Description + ")"
		if !l.quiet {
			left := max(0, items[i].Max-bal[i].Used)
			p += fmt.Sprintf(": %d of %d left in the window of %s, the call needs %d", left, items[i].Max, items[i].Window, items[i].Amount)
		}
		parts = append(parts, p)
	}
	fe := failure.New(StageBudget, code, "the call would go past "+strings.Join(parts, "; "))
	if never {
		fe.Remedy = "none as called: the call alone is over the ceiling; make a smaller call or ask a human to make it"
		return fe
	}
	fe.Retriable, fe.RetryAfter = true, wait
	fe.Remedy = fmt.Sprintf("wait %s for the window to free enough, then call again", wait.Round(time.Second))
	return fe
}

// LimitBalance is one declared limit as a call (or a check) found it.
type LimitBalance struct {
	// ID and Description are the limit's; Max its ceiling; Used what
	// other calls spent in the window; Needs what this call spends.
	ID, Description  string
	Max, Used, Needs int64
	// Fits reports whether the call fits under it.
	Fits bool
	// RetryAfter, when it does not fit, is how long until it would.
	RetryAfter time.Duration
	// Escalates: past it a human is asked instead of a refusal.
	Escalates bool
	// Quiet: the summed field is sensitive; Max, Used and Needs are 0.
	Quiet bool
}

func limitBalances(which []*compiledLimit, items []SpendItem, bal []Balance) []LimitBalance {
	out := make([]LimitBalance, len(which))
	for i, l := range which {
		out[i] = LimitBalance{ID: l.ID, Description: l.Description, Fits: bal[i].Fits, RetryAfter: bal[i].RetryAfter,
			Escalates: l.WhenExhausted == manifest.LimitExhaustEscalate, Quiet: l.quiet}
		if !l.quiet {
			out[i].Max, out[i].Used, out[i].Needs = items[i].Max, bal[i].Used, items[i].Amount
		}
	}
	return out
}

// escalatedReason is why a human is asked when limits escalate the call.
func escalatedReason(inv *invocation) string {
	parts := make([]string, len(inv.escalatedBy))
	for i, l := range inv.escalatedBy {
		parts[i] = "the call would go past " + l.Description + " (limit " + l.ID + ")"
	}
	return strings.Join(parts, "; ")
}
