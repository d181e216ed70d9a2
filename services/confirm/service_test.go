package confirm_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
	"github.com/mandate-dev/mandate/services/confirm/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a test clock the memory store reads.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type fixture struct {
	svc   *confirm.Service
	store *memory.Store
	clock *clock
	dir   directory.Store
}

func setup(t *testing.T, realTime bool) *fixture {
	t.Helper()
	dir := dirmem.New()
	if _, err := directory.Apply(context.Background(), dir, []byte(confirmtest.Policy)); err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)}
	opts := memory.Options{Now: clk.Now}
	if realTime {
		opts.Now = nil
	}
	store := memory.New(opts)
	t.Cleanup(store.Close)
	svc, err := confirm.New(confirm.Config{
		Store: store, Directory: directory.Direct(dir), Commands: confirmtest.Commands(),
		ApprovalBaseURL: "https://confirm.example/",
	})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{svc: svc, store: store, clock: clk, dir: dir}
}

// Principals as the transports hand them over.
var (
	// The executor relaying support-bot, acting for alice.
	botForAlice = identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "support-bot", Via: "executor"}
	// The executor relaying alice herself.
	aliceViaExecutor = identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "alice", Via: "executor"}
	alice            = human("acme", "alice")
	carol            = human("acme", "carol")
	bob              = human("acme", "bob") // holds payment.approve, disabled
	mallory          = human("acme", "mallory")
	gina             = human("globex", "gina")
	// finance-bot acts for carol, who may approve payouts.
	financeBot = identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "carol", AgentID: "finance-bot"}
)

func human(tenant, user string) identity.Principal {
	return identity.Principal{Kind: identity.KindUser, Tenant: tenant, UserID: user}
}

var invocations atomic.Int64

func (f *fixture) open(t *testing.T, p identity.Principal, command string) confirm.Challenge {
	t.Helper()
	inv := fmt.Sprintf("inv-%d", invocations.Add(1))
	c, err := f.svc.Open(context.Background(), p, confirm.OpenRequest{
		Command: command, InvocationDigest: confirmtest.Digest(inv), InvocationID: inv,
		ArgumentsJSON:  `{"ticket_id":"T-1","amount_cents":1250,"cardholder_reference":"[withheld]"}`,
		WithheldFields: []string{"/cardholder_reference"},
	})
	if err != nil {
		t.Fatalf("Open %s: %v", command, err)
	}
	return c
}

func wantCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	var ce *confirm.Error
	if !errors.As(err, &ce) || ce.Code != code {
		t.Fatalf("%s: got %v, want %s", what, err, code)
	}
}

func (f *fixture) state(t *testing.T, id string) confirm.State {
	t.Helper()
	c, err := f.store.Get(context.Background(), "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	return c.State
}

// Rule: agents never approve — confirmation.approver_not_allowed — also
// when the agent's token names a user the policy would accept.
func TestRule_AgentsNeverApprove_confirmation_approver_not_allowed(t *testing.T) {
	f := setup(t, false)
	refund := f.open(t, botForAlice, "ticket.refund")  // alice may approve it herself
	payout := f.open(t, botForAlice, "payment.payout") // carol may approve it
	cases := []struct {
		name string
		p    identity.Principal
		id   string
	}{
		{"support-bot for alice, alice's own refund", identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "support-bot"}, refund.ID},
		{"support-bot relayed by a service", botForAlice, refund.ID},
		{"finance-bot for carol, who holds payment.approve", financeBot, payout.ID},
		{"an agent id on a user-kind principal", identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "carol", AgentID: "finance-bot"}, payout.ID},
		{"a service without a user", identity.Principal{Kind: identity.KindService, ServiceName: "executor"}, refund.ID},
	}
	for _, tc := range cases {
		for _, approve := range []bool{true, false} {
			_, err := f.svc.Decide(context.Background(), tc.p, tc.id, approve, confirm.ChannelAPI)
			wantCode(t, tc.name, err, failure.CodeConfirmationApproverNotAllowed)
		}
		if got := f.state(t, tc.id); got != confirm.StatePending {
			t.Fatalf("%s: the challenge moved to %s", tc.name, got)
		}
	}
}

// Rule: REQUESTING_USER — only the user the call is made for decides.
func TestRule_RequestingUserPolicy(t *testing.T) {
	f := setup(t, false)
	c := f.open(t, botForAlice, "ticket.refund")
	if c.Approver.Kind != confirm.ApproverRequestingUser {
		t.Fatalf("policy %+v", c.Approver)
	}
	_, err := f.svc.Decide(context.Background(), carol, c.ID, true, confirm.ChannelAPI)
	wantCode(t, "carol deciding alice's refund", err, failure.CodeConfirmationApproverNotAllowed)
	_, err = f.svc.Decide(context.Background(), mallory, c.ID, true, confirm.ChannelAPI)
	wantCode(t, "mallory deciding alice's refund", err, failure.CodeConfirmationApproverNotAllowed)
	got, err := f.svc.Decide(context.Background(), alice, c.ID, true, confirm.ChannelApprovalPage)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != confirm.StateApproved || got.DecidedBy != "alice" || got.DecisionChannel != confirm.ChannelApprovalPage {
		t.Fatalf("decided %+v", got)
	}
}

// Rule: PERMISSION_HOLDER — another active user of the tenant holding the
// permission; never the requester (four eyes).
func TestRule_FourEyes_confirmation_approver_not_allowed(t *testing.T) {
	f := setup(t, false)
	c := f.open(t, botForAlice, "payment.payout")
	if c.Approver != (confirm.ApproverPolicy{Kind: confirm.ApproverPermissionHolder, Permission: "payment.approve"}) {
		t.Fatalf("policy %+v", c.Approver)
	}
	ctx := context.Background()
	_, err := f.svc.Decide(ctx, alice, c.ID, true, confirm.ChannelAPI)
	wantCode(t, "the requester approving her own four-eyes payout", err, failure.CodeConfirmationApproverNotAllowed)
	_, err = f.svc.Decide(ctx, mallory, c.ID, true, confirm.ChannelAPI)
	wantCode(t, "a user without payment.approve", err, failure.CodeConfirmationApproverNotAllowed)
	_, err = f.svc.Decide(ctx, bob, c.ID, true, confirm.ChannelAPI)
	wantCode(t, "a disabled holder of payment.approve", err, failure.CodeAuthorizationPrincipalInactive)
	// payment.payout is L4: carol holds payment.approve, but approves
	// only on the approval page.
	_, err = f.svc.Decide(ctx, carol, c.ID, true, confirm.ChannelAPI)
	wantCode(t, "carol approving an L4 payout over the API", err, failure.CodeConfirmationApproverNotAllowed)
	got, err := f.svc.Decide(ctx, carol, c.ID, true, confirm.ChannelApprovalPage)
	if err != nil || got.State != confirm.StateApproved || got.DecidedBy != "carol" {
		t.Fatalf("carol approving: %+v %v", got, err)
	}
}

// Rule: L4 always records an approver: an L4 command without a declared
// approver cannot be opened, and an L4 grant names its human approver.
func TestRule_L4AlwaysRecordsAnApprover(t *testing.T) {
	f := setup(t, false)
	_, err := f.svc.Open(context.Background(), botForAlice, confirm.OpenRequest{
		Command: "vendor.purge", InvocationDigest: confirmtest.Digest("purge"), InvocationID: "inv-purge",
	})
	wantCode(t, "opening an L4 command without an approver policy", err, failure.CodeConfirmationApproverNotAllowed)

	c := f.open(t, botForAlice, "payment.payout")
	if _, err := f.svc.Decide(context.Background(), carol, c.ID, true, confirm.ChannelMCPElicitation); !errors.Is(err, confirm.ErrApproverNotAllowed) {
		t.Fatalf("approving an L4 call off the approval page: %v", err)
	}
	if _, err := f.svc.Decide(context.Background(), carol, c.ID, true, confirm.ChannelApprovalPage); err != nil {
		t.Fatal(err)
	}
	g, err := f.svc.Redeem(context.Background(), botForAlice, c.ID, c.InvocationDigest, "")
	if err != nil {
		t.Fatal(err)
	}
	if g.Approver != "carol" || g.ChallengeID != c.ID || g.Channel != confirm.ChannelApprovalPage || g.DecidedAt.IsZero() {
		t.Fatalf("grant %+v, want carol's recorded approval", g)
	}
}

// Rule: a user of another tenant never sees or decides a challenge —
// confirmation.not_found.
func TestRule_OtherTenant_confirmation_not_found(t *testing.T) {
	f := setup(t, true)
	c := f.open(t, botForAlice, "ticket.refund")
	ctx := context.Background()
	_, err := f.svc.Get(ctx, gina, c.ID)
	wantCode(t, "Get", err, failure.CodeConfirmationNotFound)
	_, err = f.svc.Decide(ctx, gina, c.ID, true, confirm.ChannelAPI)
	wantCode(t, "Decide", err, failure.CodeConfirmationNotFound)
	_, err = f.svc.Await(ctx, gina, c.ID)
	wantCode(t, "Await", err, failure.CodeConfirmationNotFound)
	if _, err := f.svc.Decide(ctx, alice, c.ID, true, confirm.ChannelAPI); err != nil {
		t.Fatal(err)
	}
	_, err = f.svc.Redeem(ctx, identity.Principal{Kind: identity.KindUser, Tenant: "globex", UserID: "gina", Via: "executor"}, c.ID, c.InvocationDigest, "")
	wantCode(t, "Redeem", err, failure.CodeConfirmationNotFound)
	if list, err := f.svc.Pending(ctx, gina, 10); err != nil || len(list) != 0 {
		t.Fatalf("Pending for gina: %v %v", list, err)
	}
}

// Rule: deciding twice — confirmation.already_decided.
func TestRule_DecideTwice_confirmation_already_decided(t *testing.T) {
	f := setup(t, false)
	c := f.open(t, botForAlice, "ticket.refund")
	if _, err := f.svc.Decide(context.Background(), alice, c.ID, false, confirm.ChannelAPI); err != nil {
		t.Fatal(err)
	}
	for _, approve := range []bool{true, false} {
		_, err := f.svc.Decide(context.Background(), alice, c.ID, approve, confirm.ChannelAPI)
		wantCode(t, "second decision", err, failure.CodeConfirmationAlreadyDecided)
	}
	if got := f.state(t, c.ID); got != confirm.StateDeclined {
		t.Fatalf("state %s", got)
	}
}

// Rule: deciding after expiry — confirmation.expired.
func TestRule_DecideAfterExpiry_confirmation_expired(t *testing.T) {
	f := setup(t, false)
	c := f.open(t, botForAlice, "ticket.refund")
	if !c.ExpiresAt.Equal(c.CreatedAt.Add(confirm.DefaultTTL)) {
		t.Fatalf("default TTL: created %v, expires %v", c.CreatedAt, c.ExpiresAt)
	}
	f.clock.Advance(confirm.DefaultTTL)
	_, err := f.svc.Decide(context.Background(), alice, c.ID, true, confirm.ChannelAPI)
	wantCode(t, "Decide at expiry", err, failure.CodeConfirmationExpired)
	if got, _ := f.svc.Get(context.Background(), alice, c.ID); got.State != confirm.StateExpired {
		t.Fatalf("state %s, want EXPIRED", got.State)
	}
}

// Rule: redeeming is single use and bound to the digest.
func TestRule_Redeem(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		// arrange returns the digest to redeem with.
		arrange func(t *testing.T, f *fixture, c confirm.Challenge) (identity.Principal, string)
		code    string
	}{
		{"replayed", func(t *testing.T, f *fixture, c confirm.Challenge) (identity.Principal, string) {
			approveIt(t, f, c)
			if _, err := f.svc.Redeem(ctx, botForAlice, c.ID, c.InvocationDigest, ""); err != nil {
				t.Fatal(err)
			}
			return botForAlice, c.InvocationDigest
		}, failure.CodeConfirmationAlreadyRedeemed},
		{"same grant, changed arguments", func(t *testing.T, f *fixture, c confirm.Challenge) (identity.Principal, string) {
			approveIt(t, f, c)
			return botForAlice, confirmtest.Digest("refund 12500 instead")
		}, failure.CodeConfirmationGrantMismatch},
		{"another principal's invocation", func(t *testing.T, f *fixture, c confirm.Challenge) (identity.Principal, string) {
			approveIt(t, f, c)
			return aliceViaExecutor, c.InvocationDigest
		}, failure.CodeConfirmationGrantMismatch},
		{"expired", func(t *testing.T, f *fixture, c confirm.Challenge) (identity.Principal, string) {
			approveIt(t, f, c)
			f.clock.Advance(confirm.DefaultTTL + time.Second)
			return botForAlice, c.InvocationDigest
		}, failure.CodeConfirmationExpired},
		{"declined", func(t *testing.T, f *fixture, c confirm.Challenge) (identity.Principal, string) {
			if _, err := f.svc.Decide(ctx, alice, c.ID, false, confirm.ChannelAPI); err != nil {
				t.Fatal(err)
			}
			return botForAlice, c.InvocationDigest
		}, failure.CodeConfirmationRefused},
		{"still pending", func(_ *testing.T, _ *fixture, c confirm.Challenge) (identity.Principal, string) {
			return botForAlice, c.InvocationDigest
		}, failure.CodeConfirmationPending},
		{"malformed digest", func(_ *testing.T, _ *fixture, c confirm.Challenge) (identity.Principal, string) {
			return botForAlice, "ABC"
		}, failure.CodeSchemaInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name+"/"+tc.code, func(t *testing.T) {
			f := setup(t, false)
			c := f.open(t, botForAlice, "ticket.refund")
			p, digest := tc.arrange(t, f, c)
			before := f.state(t, c.ID)
			_, err := f.svc.Redeem(ctx, p, c.ID, digest, "")
			wantCode(t, "Redeem", err, tc.code)
			if after := f.state(t, c.ID); after != before {
				t.Fatalf("a refused Redeem moved the challenge from %s to %s", before, after)
			}
		})
	}
}

func approveIt(t *testing.T, f *fixture, c confirm.Challenge) {
	t.Helper()
	if _, err := f.svc.Decide(context.Background(), alice, c.ID, true, confirm.ChannelAPI); err != nil {
		t.Fatal(err)
	}
}

// Rule: consent never carries over — a grant serves one digest, once; the
// same request made again needs a new approval.
func TestRule_ConsentNeverCarriesOver(t *testing.T) {
	f := setup(t, false)
	ctx := context.Background()
	req := confirm.OpenRequest{Command: "ticket.refund", InvocationDigest: confirmtest.Digest("A"), InvocationID: "inv-A", ArgumentsJSON: `{"ticket_id":"T-1"}`}
	c, err := f.svc.Open(ctx, botForAlice, req)
	if err != nil {
		t.Fatal(err)
	}
	approveIt(t, f, c)
	if _, err := f.svc.Redeem(ctx, botForAlice, c.ID, confirmtest.Digest("B"), ""); !errors.Is(err, confirm.ErrGrantMismatch) {
		t.Fatalf("redeeming for other arguments: %v", err)
	}
	if _, err := f.svc.Redeem(ctx, botForAlice, c.ID, c.InvocationDigest, ""); err != nil {
		t.Fatal(err)
	}
	// Opening again for the same invocation returns the first challenge; a
	// different request under the same invocation id is refused.
	again, err := f.svc.Open(ctx, botForAlice, req)
	if err != nil || again.ID != c.ID || again.State != confirm.StateRedeemed {
		t.Fatalf("re-open: %+v %v", again, err)
	}
	changed := req
	changed.InvocationDigest = confirmtest.Digest("B")
	_, err = f.svc.Open(ctx, botForAlice, changed)
	wantCode(t, "same invocation, other request", err, failure.CodeConfirmationGrantMismatch)
	// A new invocation of the same request needs a new decision.
	req.InvocationID = "inv-A2"
	next, err := f.svc.Open(ctx, botForAlice, req)
	if err != nil || next.ID == c.ID || next.State != confirm.StatePending {
		t.Fatalf("new invocation: %+v %v", next, err)
	}
	_, err = f.svc.Redeem(ctx, botForAlice, next.ID, next.InvocationDigest, "")
	wantCode(t, "the new challenge before anyone decided", err, failure.CodeConfirmationPending)
}

// TestConcurrentRedeems: 64 goroutines redeem one approved challenge;
// exactly one gets the grant.
func TestConcurrentRedeems(t *testing.T) {
	f := setup(t, false)
	c := f.open(t, botForAlice, "ticket.refund")
	approveIt(t, f, c)
	var won, replayed atomic.Int32
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			_, err := f.svc.Redeem(context.Background(), botForAlice, c.ID, c.InvocationDigest, "")
			switch {
			case err == nil:
				won.Add(1)
			case errors.Is(err, confirm.ErrAlreadyRedeemed):
				replayed.Add(1)
			default:
				t.Errorf("Redeem: %v", err)
			}
		})
	}
	wg.Wait()
	if won.Load() != 1 || replayed.Load() != 63 {
		t.Fatalf("%d redeemed, %d already_redeemed; want 1 and 63", won.Load(), replayed.Load())
	}
}

func TestOpen(t *testing.T) {
	f := setup(t, false)
	ctx := context.Background()
	c := f.open(t, botForAlice, "payment.payout")
	if c.Tenant != "acme" || c.RequesterUser != "alice" || c.RequesterAgent != "support-bot" || c.Risk != "L4" ||
		c.Prompt.Title != "Pay out to a vendor (payment.payout)" || c.Prompt.RequestedBy != "support-bot acting for alice" {
		t.Fatalf("opened %+v", c)
	}
	if url := f.svc.ApprovalURL(c.ID); url != "https://confirm.example/approve/"+c.ID {
		t.Fatalf("approval URL %q", url)
	}
	if !confirm.ValidID(c.ID) || len(c.ID) != 22 {
		t.Fatalf("id %q is not 128 random bits in base64url", c.ID)
	}
	valid := confirm.OpenRequest{Command: "ticket.refund", InvocationDigest: confirmtest.Digest("x"), InvocationID: "inv-x"}
	cases := []struct {
		name string
		p    identity.Principal
		edit func(*confirm.OpenRequest)
		code string
	}{
		{"a user directly", alice, nil, failure.CodeAuthorizationPermissionDenied},
		{"an agent directly", identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "support-bot"}, nil, failure.CodeAuthorizationPermissionDenied},
		{"a service without the requester", identity.Principal{Kind: identity.KindService, ServiceName: "executor"}, nil, failure.CodeAuthorizationPermissionDenied},
		{"unknown command", botForAlice, func(r *confirm.OpenRequest) { r.Command = "ticket.burn" }, failure.CodeCommandNotFound},
		{"draft command", botForAlice, func(r *confirm.OpenRequest) { r.Command = "ticket.merge" }, failure.CodeCommandNotFound},
		{"requester lacks the command's permission", identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "mallory", Via: "executor"}, nil, failure.CodeAuthorizationPermissionDenied},
		{"unregistered agent", identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "rogue-bot", Via: "executor"}, nil, failure.CodeAuthorizationPrincipalInactive},
		{"ttl over 24h", botForAlice, func(r *confirm.OpenRequest) { r.TTL = 25 * time.Hour }, failure.CodeSchemaInvalid},
		{"negative ttl", botForAlice, func(r *confirm.OpenRequest) { r.TTL = -time.Second }, failure.CodeSchemaInvalid},
		{"upper-case digest", botForAlice, func(r *confirm.OpenRequest) { r.InvocationDigest = "AB" + r.InvocationDigest[2:] }, failure.CodeSchemaInvalid},
		{"arguments not JSON", botForAlice, func(r *confirm.OpenRequest) { r.ArgumentsJSON = "refund please" }, failure.CodeSchemaInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name+"/"+tc.code, func(t *testing.T) {
			req := valid
			if tc.edit != nil {
				tc.edit(&req)
			}
			_, err := f.svc.Open(ctx, tc.p, req)
			wantCode(t, "Open", err, tc.code)
		})
	}
	long := valid
	long.InvocationID, long.TTL = "inv-long", 24*time.Hour
	got, err := f.svc.Open(ctx, botForAlice, long)
	if err != nil || got.ExpiresAt.Sub(got.CreatedAt) != 24*time.Hour {
		t.Fatalf("24h challenge: %v %v", got.ExpiresAt.Sub(got.CreatedAt), err)
	}
}

// TestVisibility: the requester (user or any of its agents) and eligible
// approvers see a challenge; anyone else in the tenant does not.
func TestVisibility(t *testing.T) {
	f := setup(t, false)
	payout := f.open(t, botForAlice, "payment.payout")
	cases := []struct {
		name string
		p    identity.Principal
		sees bool
	}{
		{"alice, the requester", alice, true},
		{"support-bot, alice's agent", identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "support-bot"}, true},
		{"carol, an eligible approver", carol, true},
		{"finance-bot, the approver's agent", financeBot, false},
		{"mallory, without payment.approve", mallory, false},
	}
	for _, tc := range cases {
		_, err := f.svc.Get(context.Background(), tc.p, payout.ID)
		if tc.sees && err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if !tc.sees {
			wantCode(t, tc.name, err, failure.CodeConfirmationNotFound)
		}
	}
	_, err := f.svc.Get(context.Background(), bob, payout.ID)
	wantCode(t, "bob, disabled", err, failure.CodeAuthorizationPrincipalInactive)
	_, err = f.svc.Get(context.Background(), alice, "not-an-id")
	wantCode(t, "malformed id", err, failure.CodeConfirmationNotFound)
	list, err := f.svc.Pending(context.Background(), carol, 10)
	if err != nil || len(list) != 1 || list[0].ID != payout.ID {
		t.Fatalf("carol's pending list: %v %v", list, err)
	}
	if list, _ := f.svc.Pending(context.Background(), mallory, 10); len(list) != 0 {
		t.Fatalf("mallory's pending list: %v", list)
	}
	if err := f.svc.CanDecide(context.Background(), alice, payout); !errors.Is(err, confirm.ErrApproverNotAllowed) {
		t.Fatalf("CanDecide(alice, her payout) = %v", err)
	}
	if err := f.svc.CanDecide(context.Background(), carol, payout); err != nil {
		t.Fatalf("CanDecide(carol) = %v", err)
	}
}

// TestAwait: the requester's agent waits; the approver's decision ends the
// wait.
func TestAwait(t *testing.T) {
	f := setup(t, true)
	c := f.open(t, botForAlice, "ticket.refund")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := f.svc.Await(ctx, botForAlice, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if first := <-ch; first.State != confirm.StatePending {
		t.Fatalf("first %s", first.State)
	}
	go func() { _, _ = f.svc.Decide(context.Background(), alice, c.ID, true, confirm.ChannelAPI) }()
	if got := <-ch; got.State != confirm.StateApproved || got.DecidedBy != "alice" {
		t.Fatalf("after the decision: %+v", got)
	}
	if _, ok := <-ch; ok {
		t.Fatal("Await went on after the decision")
	}
}
