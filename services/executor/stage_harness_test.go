package executor

import (
	"cmp"
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// The stage tests (stage_<name>_test.go) run one stage of the pipeline
// alone, on an invocation in the state the stages before it leave, over an
// Executor whose parts are in memory: the embedded manifest, a memory
// directory, and fakes of the audit trail, the confirm service, the
// dispatcher and the executor's store that record what the stage asked of
// them. The store is a fake rather than services/executor/memory, which
// imports this package: an internal test cannot import it.

// stageTests names the test of each stage of the pipeline and the file it
// is in. TestEveryStageHasATest holds it to the pipeline: a stage added
// without a test of its own fails there.
var stageTests = map[string]struct{ file, test string }{
	StageAuthenticate: {"stage_authenticate_test.go", "TestStageAuthenticate"},
	StageRequest:      {"stage_request_test.go", "TestStageRequest"},
	StageLoad:         {"stage_load_test.go", "TestStageLoad"},
	StageEntitlement:  {"stage_entitlement_test.go", "TestStageEntitlement"},
	StagePermission:   {"stage_permission_test.go", "TestStagePermission"},
	StageSchema:       {"stage_schema_test.go", "TestStageSchema"},
	StageScope:        {"stage_scope_test.go", "TestStageScope"},
	StageIdempotency:  {"stage_idempotency_test.go", "TestStageIdempotency"},
	StageSoD:          {"stage_sod_test.go", "TestStageSoD"},
	StageCondition:    {"stage_condition_test.go", "TestStageCondition"},
	StageBudget:       {"stage_budget_test.go", "TestStageBudget"},
	StageConfirmation: {"stage_confirmation_test.go", "TestStageConfirmation"},
	StageAudit:        {"stage_audit_test.go", "TestStageAudit"},
	StageDispatch:     {"stage_dispatch_test.go", "TestStageDispatch"},
}

// TestEveryStageHasATest fails when a stage of the pipeline has no test of
// its own: no entry in stageTests, no such file, or no such function in it.
// An entry for a stage the pipeline no longer runs fails too, so the table
// cannot drift from the chain.
func TestEveryStageHasATest(t *testing.T) {
	names := map[string]bool{}
	for _, s := range pipeline {
		names[s.name] = true
		want, ok := stageTests[s.name]
		if !ok {
			t.Errorf("stage %s has no test: add one (stage_<name>_test.go) and list it in stageTests", s.name)
			continue
		}
		if !declaresTest(t, want.file, want.test) {
			t.Errorf("stage %s: %s does not declare func %s(t *testing.T)", s.name, want.file, want.test)
		}
	}
	for name := range stageTests {
		if !names[name] {
			t.Errorf("stageTests lists %s, which the pipeline does not run", name)
		}
	}
}

// declaresTest reports whether the Go file declares a top-level test
// function of that name.
func declaresTest(t *testing.T, file, name string) bool {
	t.Helper()
	if _, err := os.Stat(file); err != nil {
		t.Errorf("%s: %v", file, err)
		return false
	}
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Errorf("%s: %v", file, err)
		return false
	}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if ok && fn.Recv == nil && fn.Name.Name == name && fn.Type.Params.NumFields() == 1 {
			return true
		}
	}
	return false
}

// stagePolicy is the demo directory of the API tests, plus a disabled user
// and a disabled agent for authenticate.
const stagePolicy = `
tenants:
  - id: acme
    features: [refunds, expenses]
    roles:
      support: [ticket.read, expense.report.submit]
      manager: [ticket.read, expense.report.approve]
      finance: [ticket.read, payment.refund]
      lead: [ticket.read, expense.report.submit, expense.report.approve]
    users:
      - {id: alice, org: support, roles: [support]}
      - {id: bob, org: support, roles: [manager]}
      - {id: carol, org: finance, roles: [finance]}
      - {id: lena, org: support, roles: [lead]}
      - {id: olga, org: support, roles: [support], disabled: true}
    agents:
      - {id: support-bot, user: alice}
      - {id: finance-bot, user: carol}
      - {id: retired-bot, user: alice, disabled: true}
  - id: globex
    features: [refunds]
    roles:
      support: [ticket.read, payment.refund]
    users:
      - {id: dave, org: support, roles: [support]}
`

// Arguments of the commands the stage tests call.
const (
	refundArgs  = `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"2500"},"reason":"Customer was charged twice","cardholder_reference":"CH4242424242"}`
	createArgs  = `{"title":"Customer visit Lyon","lines":[{"description":"Train Paris-Lyon","amount":{"currency_code":"EUR","amount_minor":8900},"category":"EXPENSE_CATEGORY_TRAVEL"}],"payroll_id":"P-0042"}`
	searchArgs  = `{"query":"charged twice"}`
	approveArgs = `{"report_id":"ER-2003","comment":"OK"}`
)

// testPrincipal is a user of tenant, or an agent acting for one.
func testPrincipal(tenant, user, agent string) identity.Principal {
	p := identity.Principal{Kind: identity.KindUser, Tenant: tenant, UserID: user, AgentID: agent}
	if agent != "" {
		p.Kind = identity.KindAgent
	}
	return p
}

// callAs is the context of a call made by p, as the transport leaves it.
func callAs(t testing.TB, p identity.Principal) context.Context {
	return identity.WithPrincipal(t.Context(), p)
}

// stageHarness is an Executor over in-memory parts, with handles on them.
type stageHarness struct {
	e       *Executor
	set     *manifest.Set
	dir     *flakyDirectory
	audit   *fakeAudit
	confirm *fakeConfirm
	disp    *fakeDispatcher
	store   *fakeStore
}

// newStageHarness builds the Executor; opts adjust its configuration.
func newStageHarness(t testing.TB, opts ...func(*Config)) *stageHarness {
	t.Helper()
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	dir := dirmem.New()
	if _, err := directory.Apply(t.Context(), dir, []byte(stagePolicy)); err != nil {
		t.Fatal(err)
	}
	h := &stageHarness{
		set: set, dir: &flakyDirectory{r: directory.Direct(dir)}, audit: &fakeAudit{},
		confirm: &fakeConfirm{}, disp: &fakeDispatcher{}, store: newFakeStore(),
	}
	cfg := Config{
		Manifest: set, Directory: h.dir, Audit: h.audit, Confirm: h.confirm, Dispatcher: h.disp, Store: h.store,
		// The spool flusher never runs during a test: a stage's rows
		// are where the stage put them.
		SpoolInterval: time.Hour,
		Logger:        slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		o(&cfg)
	}
	h.e, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.e.Close)
	return h
}

// invocation is a fresh invocation of call, as Execute starts one.
func (h *stageHarness) invocation(call Call) *invocation {
	return &invocation{id: NewInvocationID(), call: call, start: h.e.cfg.Now()}
}

// stageNamed is the pipeline's entry for the stage name.
func stageNamed(t testing.TB, name string) *stage {
	t.Helper()
	for i := range pipeline {
		if pipeline[i].name == name {
			return &pipeline[i]
		}
	}
	t.Fatalf("the pipeline has no stage %s", name)
	return nil
}

// stageBody is what the chain runs for s in the invocation's mode: its check in
// check mode, where it has one, its run otherwise.
func stageBody(s *stage, inv *invocation) func(*Executor, context.Context, *invocation) (*Result, error) {
	if inv.checking && s.check != nil {
		return s.check
	}
	return s.run
}

// run runs the one stage name on inv, in inv's mode, as the chain would.
func (h *stageHarness) run(t testing.TB, ctx context.Context, inv *invocation, name string) (*Result, error) {
	t.Helper()
	return stageBody(stageNamed(t, name), inv)(h.e, ctx, inv)
}

// through runs every stage before name on inv, in inv's mode, each of
// which must hand the call on: inv is then what stage name gets.
func (h *stageHarness) through(t testing.TB, ctx context.Context, inv *invocation, name string) {
	t.Helper()
	stageNamed(t, name)
	for i := range pipeline {
		s := &pipeline[i]
		if s.name == name {
			return
		}
		if res, err := stageBody(s, inv)(h.e, ctx, inv); res != nil || err != nil {
			t.Fatalf("stage %s, before %s: (%v, %v), want it to hand the call on", s.name, name, res, err)
		}
	}
}

// prepared is a fresh invocation of call made by p, in check mode when
// checking, through the stages before name.
func (h *stageHarness) prepared(t testing.TB, p identity.Principal, call Call, name string, checking bool) (context.Context, *invocation) {
	t.Helper()
	ctx := callAs(t, p)
	inv := h.invocation(call)
	inv.checking = checking
	h.through(t, ctx, inv, name)
	return ctx, inv
}

// passes runs stage name on inv and asserts that it hands the call on and
// writes no audit row.
func (h *stageHarness) passes(t *testing.T, ctx context.Context, inv *invocation, name string) {
	t.Helper()
	mark := h.audit.mark()
	res, err := h.run(t, ctx, inv, name)
	if res != nil || err != nil {
		t.Fatalf("%s = (%v, %v), want (nil, nil): the call handed on", name, res, err)
	}
	if rows := h.audit.since(mark); len(rows) != 0 {
		t.Fatalf("%s handed the call on and wrote %d audit rows: %v", name, len(rows), rows)
	}
}

// stageRefusal is one way a stage refuses, or fails: the call, and the state
// that makes the stage refuse it, and what it must refuse with.
type stageRefusal struct {
	name string
	// p makes the call; anonymous: no principal in the context at all.
	p         identity.Principal
	anonymous bool
	call      Call
	// config adjusts the executor, arrange the fakes before the call, and
	// edit the invocation the earlier stages left (each optional).
	config  func(*Config)
	arrange func(h *stageHarness)
	edit    func(h *stageHarness, inv *invocation)
	// stage and code are the refusal's; failed marks a fault (a part that
	// could not be reached), whose outcome is failed, not refused.
	stage, code string
	failed      bool
	// check asserts more about the refusal (optional).
	check func(t *testing.T, h *stageHarness, inv *invocation, fe *failure.Error)
}

// stageRefuses runs each case against stage name twice, on a fresh harness
// each time: as a call, where the refusal must come with exactly one
// outcome row (refused, or failed for a fault) naming the invocation, the
// stage and the code; and in check mode, where it must be the same
// refusal with no row and no effect (no challenge, no redemption, no key
// reserved). Neither dispatches.
func stageRefuses(t *testing.T, name string, cases []stageRefusal) {
	t.Helper()
	for _, tc := range cases {
		for _, checking := range []bool{false, true} {
			mode := "call"
			if checking {
				mode = "check"
			}
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				var opts []func(*Config)
				if tc.config != nil {
					opts = append(opts, tc.config)
				}
				h := newStageHarness(t, opts...)
				if tc.arrange != nil {
					tc.arrange(h)
				}
				ctx := t.Context()
				if !tc.anonymous {
					ctx = callAs(t, tc.p)
				}
				inv := h.invocation(tc.call)
				inv.checking = checking
				h.through(t, ctx, inv, name)
				if tc.edit != nil {
					tc.edit(h, inv)
				}
				effects := h.confirm.calls()
				mark := h.audit.mark()
				res, err := h.run(t, ctx, inv, name)
				h.e.wg.Wait() // rows written after the answer, if any
				fe := wantRefusal(t, res, err, inv, tc.stage, tc.code)
				outcome := contract.OutcomeRefused
				if tc.failed {
					outcome = contract.OutcomeFailed
					if spec, _ := failure.Lookup(tc.code); spec.Retriable && !fe.Retriable {
						t.Errorf("the fault %s is retriable in the table of codes, not in the refusal", tc.code)
					}
				}
				if inv.ending.outcome != outcome || inv.ending.stage != tc.stage || inv.ending.code != tc.code {
					t.Errorf("the invocation ended %+v, want %s at %s with %s", inv.ending, outcome, tc.stage, tc.code)
				}
				rows := h.audit.since(mark)
				switch {
				case checking && len(rows) != 0:
					t.Errorf("in check mode the refusal wrote %d rows, want none (the check writes its own): %v", len(rows), rows)
				case !checking:
					wantOutcomeRow(t, rows, inv, outcome, tc.stage, tc.code)
				}
				if checking {
					if got := h.confirm.calls(); got.open != effects.open || got.redeem != effects.redeem || got.release != effects.release {
						t.Errorf("in check mode the stage opened, redeemed or released a challenge: %+v, before %+v", got, effects)
					}
					if k := h.store.heldBy(inv.id); k != nil {
						t.Errorf("in check mode the stage reserved the key %+v", *k)
					}
				}
				if n := h.disp.count(); n != 0 {
					t.Errorf("%d dispatches, want none", n)
				}
				if tc.check != nil {
					tc.check(t, h, inv, fe)
				}
			})
		}
	}
}

// wantRefusal asserts that a stage ended the call with the refusal stage,
// code, naming inv, and returns it.
func wantRefusal(t *testing.T, res *Result, err error, inv *invocation, stage, code string) *failure.Error {
	t.Helper()
	var fe *failure.Error
	if res != nil || !errors.As(err, &fe) {
		t.Fatalf("got (%v, %v), want the refusal %s/%s", res, err, stage, code)
	}
	if fe.Stage != stage || fe.Code != code {
		t.Fatalf("refused with %s/%s (%s), want %s/%s", fe.Stage, fe.Code, fe.Message, stage, code)
	}
	if fe.InvocationID != inv.id {
		t.Errorf("the refusal names invocation %q, want %q", fe.InvocationID, inv.id)
	}
	return fe
}

// wantOutcomeRow asserts that rows are exactly one outcome row of inv with
// outcome, stage and code.
func wantOutcomeRow(t *testing.T, rows []*mandatev1.AuditRecord, inv *invocation, outcome, stage, code string) {
	t.Helper()
	if len(rows) != 1 {
		t.Fatalf("%d audit rows, want one outcome row: %v", len(rows), rows)
	}
	r := rows[0]
	if r.GetPhase() != contract.PhaseOutcome || r.GetOutcome() != outcome || r.GetStage() != stage || r.GetCode() != code ||
		r.GetInvocationId() != inv.id || r.GetTenant() != inv.p.Tenant || r.GetCommand() != commandOf(inv) {
		t.Fatalf("audit row %v, want an outcome row of %s: %s at %s with %s", r, inv.id, outcome, stage, code)
	}
}

// commandOf is the command an audit row of inv names.
func commandOf(inv *invocation) string {
	if validCommand(inv.call.Code) {
		return inv.call.Code
	}
	return "unknown"
}

// flakyDirectory is a directory resolver that can be made to fail, or to
// answer for it.
type flakyDirectory struct {
	r    directory.Resolver
	mu   sync.Mutex
	err  error
	with func(directory.Resolution) directory.Resolution
}

func (d *flakyDirectory) Resolve(ctx context.Context, tenant, userID, agentID string) (directory.Resolution, error) {
	d.mu.Lock()
	err, with := d.err, d.with
	d.mu.Unlock()
	if err != nil {
		return directory.Resolution{}, err
	}
	res, err := d.r.Resolve(ctx, tenant, userID, agentID)
	if err == nil && with != nil {
		res = with(res)
	}
	return res, err
}

// fakeAudit is an audit trail that keeps every row appended to it, with a
// sequence number, and can be taken away.
type fakeAudit struct {
	mu   sync.Mutex
	rows []*mandatev1.AuditRecord
	down error
	// hung makes every append wait for its context, as a trail whose
	// database hangs does.
	hung bool
	// unanswered counts the appends made while hung.
	unanswered int
}

func (a *fakeAudit) Append(ctx context.Context, in *mandatev1.AppendRequest, _ ...grpc.CallOption) (*mandatev1.AppendResponse, error) {
	a.mu.Lock()
	if a.hung {
		a.unanswered++
		a.mu.Unlock()
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	defer a.mu.Unlock()
	if a.down != nil {
		return nil, a.down
	}
	out := make([]*mandatev1.AuditRecord, 0, len(in.GetRecords()))
	for _, r := range in.GetRecords() {
		stored := proto.CloneOf(r)
		stored.Seq = int64(len(a.rows) + 1)
		a.rows = append(a.rows, stored)
		out = append(out, stored)
	}
	return &mandatev1.AppendResponse{Records: out}, nil
}

// takeAway makes every append fail with err (nil: brings the trail back).
func (a *fakeAudit) takeAway(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.down = err
}

// hang makes every append wait for its context (false: answers again).
func (a *fakeAudit) hang(hung bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hung = hung
}

// mark is where the rows appended from now on start.
func (a *fakeAudit) mark() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.rows)
}

// since returns the rows appended after mark.
func (a *fakeAudit) since(mark int) []*mandatev1.AuditRecord {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.rows[mark:])
}

// fakeConfirm is a confirm service that records what it was asked. Open
// opens challenge "ch-1" (unless openErr is set); Redeem grants, as carol
// over grantVia (default the API), unless redeemErr is set; Get answers
// challenge (nil: not found) or getErr; Release gives the grant back, so
// that it redeems again, unless releaseErr is set.
type fakeConfirm struct {
	mu         sync.Mutex
	opened     []*mandatev1.OpenRequest
	redeemed   []*mandatev1.RedeemRequest
	released   []*mandatev1.ReleaseRequest
	read       []*mandatev1.ConfirmServiceGetRequest
	openErr    error
	redeemErr  error
	releaseErr error
	getErr     error
	challenge  *mandatev1.Challenge
	grantVia   string
}

// confirmCalls counts the calls of each kind a fakeConfirm took.
type confirmCalls struct{ open, redeem, release, get int }

func (c *fakeConfirm) calls() confirmCalls {
	c.mu.Lock()
	defer c.mu.Unlock()
	return confirmCalls{len(c.opened), len(c.redeemed), len(c.released), len(c.read)}
}

// script runs f on the fake under its lock.
func (c *fakeConfirm) script(f func(c *fakeConfirm)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(c)
}

func (c *fakeConfirm) Open(_ context.Context, in *mandatev1.OpenRequest, _ ...grpc.CallOption) (*mandatev1.Challenge, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.opened = append(c.opened, in)
	if c.openErr != nil {
		return nil, c.openErr
	}
	return &mandatev1.Challenge{ChallengeId: "ch-1", Command: in.GetCommand(), InvocationDigest: in.GetInvocationDigest(),
		InvocationId: in.GetInvocationId(), State: mandatev1.ChallengeState_CHALLENGE_STATE_PENDING,
		ApprovalUrl: "http://approve.test/approve/ch-1"}, nil
}

func (c *fakeConfirm) Redeem(_ context.Context, in *mandatev1.RedeemRequest, _ ...grpc.CallOption) (*mandatev1.Grant, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.redeemed = append(c.redeemed, in)
	if c.redeemErr != nil {
		return nil, c.redeemErr
	}
	via := c.grantVia
	if via == "" {
		via = "api"
	}
	return &mandatev1.Grant{ChallengeId: in.GetChallengeId(), Approver: "carol", Channel: via, DecidedAt: timestamppb.Now()}, nil
}

func (c *fakeConfirm) Release(_ context.Context, in *mandatev1.ReleaseRequest, _ ...grpc.CallOption) (*mandatev1.Challenge, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = append(c.released, in)
	if c.releaseErr != nil {
		return nil, c.releaseErr
	}
	// A grant given back redeems again, as the confirm service's does.
	c.redeemErr = nil
	return &mandatev1.Challenge{ChallengeId: in.GetChallengeId(), State: mandatev1.ChallengeState_CHALLENGE_STATE_APPROVED}, nil
}

func (c *fakeConfirm) Get(_ context.Context, in *mandatev1.ConfirmServiceGetRequest, _ ...grpc.CallOption) (*mandatev1.Challenge, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read = append(c.read, in)
	switch {
	case c.getErr != nil:
		return nil, c.getErr
	case c.challenge == nil:
		return nil, failure.New(StageConfirmation, failure.CodeConfirmationNotFound, "no such challenge").GRPCStatus().Err()
	}
	return proto.CloneOf(c.challenge), nil
}

// fakeDispatcher is a backend that counts the calls dispatched to it and
// answers reply, or err. It keeps receipts too: receipt answers for an
// invocation whose effect is unknown (nil: no receipts, ErrNoReceipt).
type fakeDispatcher struct {
	mu      sync.Mutex
	sent    []Dispatch
	reply   Reply
	err     error
	receipt func(Dispatch) (Receipt, error)
	asked   []Dispatch
}

func (d *fakeDispatcher) Dispatch(_ context.Context, disp Dispatch) (Reply, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sent = append(d.sent, disp)
	return d.reply, d.err
}

func (d *fakeDispatcher) Receipt(_ context.Context, disp Dispatch) (Receipt, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.asked = append(d.asked, disp)
	if d.receipt == nil {
		return Receipt{}, ErrNoReceipt
	}
	return d.receipt(disp)
}

// script runs f on the fake under its lock.
func (d *fakeDispatcher) script(f func(d *fakeDispatcher)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d)
}

func (d *fakeDispatcher) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.sent)
}

// receipts are the dispatches whose receipts were asked for.
func (d *fakeDispatcher) receipts() []Dispatch {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.asked)
}

func (d *fakeDispatcher) dispatched() []Dispatch {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.sent)
}

// fakeStore is the part of the executor's store the stages use, in a map:
// idempotency records (Reserve, Peek, Reclaim, Settle, Release, Finish),
// executions (Executed) and the spool. down makes every call fail. The
// embedded Store is nil: a method no stage uses panics if called.
type fakeStore struct {
	Store
	mu         sync.Mutex
	keys       map[IdemKey]*fakeKey
	executions []Execution
	finished   []Finish
	releasedK  []IdemKey
	spooled    []SpooledRow
	// spoolHung makes Spool wait for its context, as a hung database does.
	spoolHung bool
	asked     []executedQuery
	down      error
	// spends are the limits' spends, by tenant and bucket; refunded
	// the receipts given back, in order.
	spends   map[string][]Lapse
	refunded [][]Spent
	// spentUnder are the keys recorded spendings named.
	spentUnder []IdemKey
	// parked are the parked calls by tenant and challenge; parkErr fails
	// Park.
	parked  map[[2]string]Parked
	parkErr error
}

// Spend keeps the limits' spends in a map, as the contract says, on the
// real clock.
func (s *fakeStore) Spend(_ context.Context, sp Spending) ([]Balance, error) {
	if err := ValidSpending(sp); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return nil, s.down
	}
	if s.spends == nil {
		s.spends = map[string][]Lapse{}
	}
	now := time.Now()
	out := make([]Balance, len(sp.Items))
	all := true
	for i, it := range sp.Items {
		var live []Lapse
		for _, l := range s.spends[sp.Tenant+"\x00"+it.Bucket] {
			if l.At.After(now) {
				live = append(live, l)
				out[i].Used += l.Amount
			}
		}
		out[i].Fits = out[i].Used+it.Amount <= it.Max
		if !out[i].Fits {
			all = false
			out[i].RetryAfter = RetryAfterOf(live, it.Amount, it.Max, now)
		}
	}
	if sp.DryRun || (!all && !sp.Force) {
		return out, nil
	}
	if sp.Key != nil {
		s.spentUnder = append(s.spentUnder, *sp.Key)
	}
	for i, it := range sp.Items {
		if it.Amount > 0 {
			b := sp.Tenant + "\x00" + it.Bucket
			out[i].Lapses = SpendLapses(now, it.Window)
			s.spends[b] = append(s.spends[b], Lapse{Amount: it.Amount, At: out[i].Lapses})
		}
	}
	return out, nil
}

// Refund takes the receipt's spends off their buckets.
func (s *fakeStore) Refund(_ context.Context, tenant string, receipt []Spent) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return s.down
	}
	for _, r := range receipt {
		b := tenant + "\x00" + r.Bucket
		for i, l := range s.spends[b] {
			if l.At.Equal(r.Lapses) && l.Amount == r.Amount {
				s.spends[b] = slices.Delete(s.spends[b], i, i+1)
				break
			}
		}
	}
	s.refunded = append(s.refunded, receipt)
	return nil
}

// spent is what tenant's bucket holds, summed.
func (s *fakeStore) spent(tenant, bucket string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, l := range s.spends[tenant+"\x00"+bucket] {
		n += l.Amount
	}
	return n
}

// Renew keeps a running call's claim: the fake's keys have no lease, so
// a claim still held by invocation is renewed as it is.
func (s *fakeStore) Renew(_ context.Context, key IdemKey, invocation string, _ time.Duration) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return false, s.down
	}
	k := s.keys[key]
	return k != nil && !k.done && k.invocation == invocation, nil
}

// fakeKey is one idempotency record.
type fakeKey struct {
	digest, invocation string
	// done: the call finished, and saved is its response; abandoned: its
	// lease ran out without an outcome.
	done, abandoned bool
	saved           Saved
}

// executedQuery is one question separation of duties asked.
type executedQuery struct {
	tenant, user string
	commands     []string
	subject      string
}

func newFakeStore() *fakeStore { return &fakeStore{keys: map[IdemKey]*fakeKey{}} }

// script runs f on the store under its lock.
func (s *fakeStore) script(f func(s *fakeStore)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// key returns a copy of the record of k, nil when there is none.
func (s *fakeStore) key(k IdemKey) *fakeKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.keys[k]; ok {
		c := *r
		return &c
	}
	return nil
}

// released are the keys given back, in order.
func (s *fakeStore) released() []IdemKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.releasedK)
}

// finishes are the outcomes saved, in order.
func (s *fakeStore) finishes() []Finish {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.finished)
}

// heldBy is the key a record of invocation holds, nil when none.
func (s *fakeStore) heldBy(invocation string) *IdemKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, r := range s.keys {
		if r.invocation == invocation {
			return &k
		}
	}
	return nil
}

func (s *fakeStore) answer(r *fakeKey, digest string) (*Saved, error) {
	switch {
	case r.digest != digest:
		return nil, ErrKeyReused
	case r.abandoned:
		return nil, &AbandonedError{InvocationID: r.invocation}
	case !r.done:
		return nil, ErrInFlight
	}
	saved := r.saved
	return &saved, nil
}

func (s *fakeStore) Reserve(_ context.Context, k IdemKey, claim Reservation) (*Saved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return nil, s.down
	}
	if r, ok := s.keys[k]; ok {
		return s.answer(r, claim.Digest)
	}
	s.keys[k] = &fakeKey{digest: claim.Digest, invocation: claim.InvocationID}
	return nil, nil
}

func (s *fakeStore) Peek(_ context.Context, k IdemKey, digest string) (*Saved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return nil, s.down
	}
	if r, ok := s.keys[k]; ok {
		return s.answer(r, digest)
	}
	return nil, nil
}

func (s *fakeStore) Reclaim(_ context.Context, k IdemKey, previous string, claim Reservation) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return false, s.down
	}
	if r, ok := s.keys[k]; !ok || r.invocation != previous {
		return false, nil
	}
	s.keys[k] = &fakeKey{digest: claim.Digest, invocation: claim.InvocationID}
	return true, nil
}

func (s *fakeStore) Settle(_ context.Context, k IdemKey, saved Saved) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return s.down
	}
	if r, ok := s.keys[k]; ok && r.invocation == saved.InvocationID {
		r.done, r.abandoned, r.saved = true, false, saved
	}
	return nil
}

func (s *fakeStore) Release(_ context.Context, k IdemKey) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return s.down
	}
	delete(s.keys, k)
	s.releasedK = append(s.releasedK, k)
	return nil
}

func (s *fakeStore) Finish(_ context.Context, f Finish) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return s.down
	}
	s.finished = append(s.finished, f)
	if f.Key != nil {
		if r, ok := s.keys[*f.Key]; ok {
			r.done, r.saved = true, f.Saved
		}
	}
	if f.Execution != nil {
		s.executions = append(s.executions, *f.Execution)
	}
	return nil
}

func (s *fakeStore) Executed(_ context.Context, tenant, user string, commands []string, subject string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, executedQuery{tenant, user, slices.Clone(commands), subject})
	if s.down != nil {
		return false, s.down
	}
	for _, x := range s.executions {
		if x.Tenant == tenant && x.User == user && x.Subject == subject && slices.Contains(commands, x.Command) {
			return true, nil
		}
	}
	return false, nil
}

func (s *fakeStore) Spool(ctx context.Context, row SpooledRow) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spoolHung {
		s.mu.Unlock()
		<-ctx.Done()
		s.mu.Lock()
		return ctx.Err()
	}
	if s.down != nil {
		return s.down
	}
	s.spooled = append(s.spooled, row)
	return nil
}

// outbox decodes the rows spooled so far, in order.
func (s *fakeStore) outbox(t *testing.T) []*mandatev1.AuditRecord {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*mandatev1.AuditRecord, 0, len(s.spooled))
	for _, r := range s.spooled {
		rec, err := decodeSpooled(r.Record)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rec)
	}
	return out
}

// Spooled answers the spool flusher, which runs no sooner than an hour
// into a test: nothing to flush.
func (s *fakeStore) Spooled(context.Context, int) ([]SpooledRow, error) { return nil, nil }

// Park keeps a parked call in a map, as the contract says.
func (s *fakeStore) Park(_ context.Context, p Parked) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := cmp.Or(s.down, s.parkErr); err != nil {
		return err
	}
	if err := ValidParked(p, time.Now()); err != nil {
		return err
	}
	if s.parked == nil {
		s.parked = map[[2]string]Parked{}
	}
	p.Expires = ParkedUntil(p.Expires, time.Now())
	s.parked[[2]string{p.Tenant, p.ChallengeID}] = p
	return nil
}

// Parked answers a copy of the record, nil when there is none or it
// expired.
func (s *fakeStore) Parked(_ context.Context, tenant, challenge string) (*Parked, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return nil, s.down
	}
	p, ok := s.parked[[2]string{tenant, challenge}]
	if !ok || !time.Now().Before(p.Expires) {
		return nil, nil
	}
	p.Canonical, p.Withheld = slices.Clone(p.Canonical), slices.Clone(p.Withheld)
	return &p, nil
}

// Unpark drops the record.
func (s *fakeStore) Unpark(_ context.Context, tenant, challenge string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return s.down
	}
	delete(s.parked, [2]string{tenant, challenge})
	return nil
}

// parkedCall is a copy of the record of tenant's challenge, expired or
// not, nil when there is none.
func (s *fakeStore) parkedCall(tenant, challenge string) *Parked {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.parked[[2]string{tenant, challenge}]; ok {
		return &p
	}
	return nil
}
