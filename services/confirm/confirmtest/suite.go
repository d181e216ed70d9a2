package confirmtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/services/confirm"
)

// Backend is what the suite tests: one store of challenges, sessions and
// notices.
type Backend interface {
	confirm.Store
	confirm.SessionStore
	confirm.NoticeStore
}

// Run runs the conformance suite. newBackend must return an empty backend,
// independent of those returned by other calls; closing it is up to
// newBackend (t.Cleanup). Expiry is tested with real time (TTLs well under
// a second), because the Postgres store judges expiry by the database's
// clock.
func Run(t *testing.T, newBackend func(t *testing.T) Backend) {
	s := &suite{newBackend: newBackend}
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"CreateGet", s.testCreateGet},
		{"CreateIsIdempotentPerInvocation", s.testCreateIdempotent},
		{"CreateRefusesInvalid", s.testCreateInvalid},
		{"TenantIsolation", s.testTenantIsolation},
		{"Decide", s.testDecide},
		{"DecideTwice", s.testDecideTwice},
		{"DecideAfterExpiry", s.testDecideAfterExpiry},
		{"Redeem", s.testRedeem},
		{"RedeemRefusals", s.testRedeemRefusals},
		{"Release", s.testRelease},
		{"ConcurrentRedeem", s.testConcurrentRedeem},
		{"ConcurrentDecide", s.testConcurrentDecide},
		{"ListPending", s.testListPending},
		{"CountPending", s.testCountPending},
		{"Watch", s.testWatch},
		{"WatchExpiry", s.testWatchExpiry},
		{"WatchEnds", s.testWatchEnds},
		{"LoginTokensAreSingleUse", s.testLoginTokens},
		{"Sessions", s.testSessions},
		{"NoticeOpened", s.testNoticeOpened},
		{"NoticeDecided", s.testNoticeDecided},
		{"NoticeNotOnRefusal", s.testNoticeNotOnRefusal},
		{"ExpireDueOncePerChallenge", s.testExpireDue},
		{"ClaimNoticesHidesClaimed", s.testClaimHides},
		{"ClaimNoticesAgainAfterLease", s.testClaimAfterLease},
		{"NoticeFailed", s.testNoticeFailed},
		{"NoticeDelivered", s.testNoticeDelivered},
		{"NoticeGiveUp", s.testNoticeGiveUp},
		{"NoticesOldestFirst", s.testNoticesOldestFirst},
		{"NoticeTenantIsolation", s.testNoticeTenantIsolation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // every test has its own backend
			tt.fn(t)
		})
	}
}

type suite struct {
	newBackend func(t *testing.T) Backend
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// create stores c with ttl and fails the test on error.
func create(t *testing.T, b Backend, c confirm.Challenge, ttl time.Duration) confirm.Challenge {
	t.Helper()
	stored, created, err := b.Create(testCtx(t), c, ttl)
	if err != nil || !created {
		t.Fatalf("Create: created=%v err=%v", created, err)
	}
	return stored
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got %v, want %v", what, err, want)
	}
}

var approve = confirm.Decision{Approve: true, By: "alice", Channel: confirm.ChannelAPI}

// waitState polls until the challenge reads as state (expiry is judged by
// the store's clock).
func waitState(t *testing.T, b Backend, tenant, id string, state confirm.State) confirm.Challenge {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := b.Get(testCtx(t), tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		if c.State == state {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("challenge stayed %s, want %s", c.State, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *suite) testCreateGet(t *testing.T) {
	b := s.newBackend(t)
	in := Challenge("acme", "inv-1")
	in.State, in.DecidedBy = confirm.StateApproved, "mallory" // ignored: a new challenge is pending
	before := time.Now().Add(-time.Minute)
	stored := create(t, b, in, 10*time.Minute)
	if stored.State != confirm.StatePending || stored.DecidedBy != "" || !stored.DecidedAt.IsZero() {
		t.Fatalf("new challenge %+v, want pending and undecided", stored)
	}
	if stored.CreatedAt.Before(before) || stored.ExpiresAt.Sub(stored.CreatedAt) != 10*time.Minute {
		t.Fatalf("created %v expires %v, want now and now+10m", stored.CreatedAt, stored.ExpiresAt)
	}
	got, err := b.Get(testCtx(t), "acme", in.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := in
	want.State, want.DecidedBy = confirm.StatePending, ""
	want.CreatedAt, want.ExpiresAt = stored.CreatedAt, stored.ExpiresAt
	if diff := Diff(got, want); diff != "" {
		t.Fatalf("round trip: %s", diff)
	}
	if _, err := b.Get(testCtx(t), "acme", confirm.NewID()); !errors.Is(err, confirm.ErrNotFound) {
		t.Fatalf("Get of an unknown id: %v", err)
	}
}

func (s *suite) testCreateIdempotent(t *testing.T) {
	b := s.newBackend(t)
	first := create(t, b, Challenge("acme", "inv-1"), time.Minute)
	again := Challenge("acme", "inv-1")
	got, created, err := b.Create(testCtx(t), again, time.Hour)
	if err != nil || created || got.ID != first.ID || !got.ExpiresAt.Equal(first.ExpiresAt) {
		t.Fatalf("second Create for the same invocation: %v created=%v err=%v, want the first (%s)", got.ID, created, err, first.ID)
	}
	// The same invocation id in another tenant is another invocation.
	other := create(t, b, Challenge("globex", "inv-1"), time.Minute)
	if other.ID == first.ID {
		t.Fatal("tenants share a challenge")
	}
}

func (s *suite) testCreateInvalid(t *testing.T) {
	b := s.newBackend(t)
	cases := []struct {
		name string
		edit func(*confirm.Challenge)
		ttl  time.Duration
	}{
		{"no id", func(c *confirm.Challenge) { c.ID = "" }, time.Minute},
		{"no tenant", func(c *confirm.Challenge) { c.Tenant = "" }, time.Minute},
		{"no invocation", func(c *confirm.Challenge) { c.InvocationID = "" }, time.Minute},
		{"bad digest", func(c *confirm.Challenge) { c.InvocationDigest = "ABC" }, time.Minute},
		{"no requester", func(c *confirm.Challenge) { c.RequesterUser = "" }, time.Minute},
		{"no approver kind", func(c *confirm.Challenge) { c.Approver.Kind = "" }, time.Minute},
		{"holder without permission", func(c *confirm.Challenge) { c.Approver.Kind = confirm.ApproverPermissionHolder }, time.Minute},
		{"zero ttl", func(*confirm.Challenge) {}, 0},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Challenge("acme", fmt.Sprintf("inv-%d", i))
			tc.edit(&c)
			_, _, err := b.Create(testCtx(t), c, tc.ttl)
			wantErr(t, "Create", err, confirm.ErrInvalid)
		})
	}
}

func (s *suite) testTenantIsolation(t *testing.T) {
	b := s.newBackend(t)
	c := create(t, b, Challenge("acme", "inv-1"), time.Minute)
	ctx := testCtx(t)
	_, err := b.Get(ctx, "globex", c.ID)
	wantErr(t, "Get from globex", err, confirm.ErrNotFound)
	_, err = b.Decide(ctx, "globex", c.ID, approve)
	wantErr(t, "Decide from globex", err, confirm.ErrNotFound)
	_, err = b.Watch(ctx, "globex", c.ID)
	wantErr(t, "Watch from globex", err, confirm.ErrNotFound)
	if _, err := b.Decide(ctx, "acme", c.ID, approve); err != nil {
		t.Fatal(err)
	}
	_, err = b.Redeem(ctx, "globex", c.ID, c.InvocationDigest)
	wantErr(t, "Redeem from globex", err, confirm.ErrNotFound)
	if list, err := b.ListPending(ctx, "globex", 10); err != nil || len(list) != 0 {
		t.Fatalf("ListPending(globex) = %v, %v", list, err)
	}
}

func (s *suite) testDecide(t *testing.T) {
	b := s.newBackend(t)
	for _, approve := range []bool{true, false} {
		t.Run(fmt.Sprint("approve=", approve), func(t *testing.T) {
			c := create(t, b, Challenge("acme", fmt.Sprint("inv-", approve)), time.Minute)
			got, err := b.Decide(testCtx(t), "acme", c.ID, confirm.Decision{Approve: approve, By: "carol", Channel: confirm.ChannelApprovalPage})
			if err != nil {
				t.Fatal(err)
			}
			want := map[bool]confirm.State{true: confirm.StateApproved, false: confirm.StateDeclined}[approve]
			if got.State != want || got.DecidedBy != "carol" || got.DecisionChannel != confirm.ChannelApprovalPage ||
				got.DecidedAt.Before(c.CreatedAt) || got.DecidedAt.After(c.ExpiresAt) {
				t.Fatalf("decided %+v, want %s by carol via approval_page", got, want)
			}
			read, err := b.Get(testCtx(t), "acme", c.ID)
			if err != nil || Diff(read, got) != "" {
				t.Fatalf("Get after Decide: %s %v", Diff(read, got), err)
			}
		})
	}
	c := create(t, b, Challenge("acme", "inv-bad"), time.Minute)
	_, err := b.Decide(testCtx(t), "acme", c.ID, confirm.Decision{Approve: true, By: "", Channel: confirm.ChannelAPI})
	wantErr(t, "Decide without a decider", err, confirm.ErrInvalid)
	_, err = b.Decide(testCtx(t), "acme", c.ID, confirm.Decision{Approve: true, By: "alice", Channel: "fax"})
	wantErr(t, "Decide through an unknown channel", err, confirm.ErrInvalid)
	_, err = b.Decide(testCtx(t), "acme", confirm.NewID(), approve)
	wantErr(t, "Decide of an unknown id", err, confirm.ErrNotFound)
}

func (s *suite) testDecideTwice(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	c := create(t, b, Challenge("acme", "inv-1"), time.Minute)
	if _, err := b.Decide(ctx, "acme", c.ID, confirm.Decision{By: "alice", Channel: confirm.ChannelAPI}); err != nil {
		t.Fatal(err)
	}
	_, err := b.Decide(ctx, "acme", c.ID, approve)
	wantErr(t, "approving a declined challenge", err, confirm.ErrAlreadyDecided)
	got, _ := b.Get(ctx, "acme", c.ID)
	if got.State != confirm.StateDeclined {
		t.Fatalf("state %s after the refused second decision", got.State)
	}
	r := create(t, b, Challenge("acme", "inv-2"), time.Minute)
	if _, err := b.Decide(ctx, "acme", r.ID, approve); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Redeem(ctx, "acme", r.ID, r.InvocationDigest); err != nil {
		t.Fatal(err)
	}
	_, err = b.Decide(ctx, "acme", r.ID, approve)
	wantErr(t, "deciding a redeemed challenge", err, confirm.ErrAlreadyDecided)
}

func (s *suite) testDecideAfterExpiry(t *testing.T) {
	b := s.newBackend(t)
	c := create(t, b, Challenge("acme", "inv-1"), 300*time.Millisecond)
	waitState(t, b, "acme", c.ID, confirm.StateExpired)
	_, err := b.Decide(testCtx(t), "acme", c.ID, approve)
	wantErr(t, "Decide after expiry", err, confirm.ErrExpired)
	// A decided challenge stays decided: a declined one does not expire.
	d := create(t, b, Challenge("acme", "inv-2"), 300*time.Millisecond)
	if _, err := b.Decide(testCtx(t), "acme", d.ID, confirm.Decision{By: "alice", Channel: confirm.ChannelAPI}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	if got, _ := b.Get(testCtx(t), "acme", d.ID); got.State != confirm.StateDeclined {
		t.Fatalf("declined challenge reads %s after its expiry", got.State)
	}
	_, err = b.Decide(testCtx(t), "acme", d.ID, approve)
	wantErr(t, "Decide of a declined challenge after expiry", err, confirm.ErrAlreadyDecided)
}

func (s *suite) testRedeem(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	c := create(t, b, Challenge("acme", "inv-1"), time.Minute)
	decided, err := b.Decide(ctx, "acme", c.ID, approve)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Redeem(ctx, "acme", c.ID, c.InvocationDigest)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != confirm.StateRedeemed || got.RedeemedAt.IsZero() || got.DecidedBy != "alice" || !got.DecidedAt.Equal(decided.DecidedAt) {
		t.Fatalf("redeemed %+v", got)
	}
	if g := confirm.GrantOf(got); g.Approver != "alice" || g.ChallengeID != c.ID || g.Channel != confirm.ChannelAPI {
		t.Fatalf("grant %+v", g)
	}
}

// testRelease: a redeemed grant given back for its own digest can be
// redeemed once more; another digest, a pending or declined challenge, or
// an unknown one cannot be released.
func (s *suite) testRelease(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	c := create(t, b, Challenge("acme", "inv-release"), time.Minute)
	if _, err := b.Release(ctx, "acme", c.ID, c.InvocationDigest); !errors.Is(err, confirm.ErrPending) {
		t.Errorf("releasing a pending challenge: %v, want ErrPending", err)
	}
	if _, err := b.Decide(ctx, "acme", c.ID, approve); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Redeem(ctx, "acme", c.ID, c.InvocationDigest); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Release(ctx, "acme", c.ID, Digest("another")); !errors.Is(err, confirm.ErrGrantMismatch) {
		t.Errorf("releasing for another digest: %v, want ErrGrantMismatch", err)
	}
	got, err := b.Release(ctx, "acme", c.ID, c.InvocationDigest)
	if err != nil || got.State != confirm.StateApproved || !got.RedeemedAt.IsZero() || got.DecidedBy != "alice" {
		t.Fatalf("released %+v %v", got, err)
	}
	if again, err := b.Release(ctx, "acme", c.ID, c.InvocationDigest); err != nil || again.State != confirm.StateApproved {
		t.Fatalf("releasing twice: %+v %v", again, err)
	}
	if _, err := b.Redeem(ctx, "acme", c.ID, c.InvocationDigest); err != nil {
		t.Fatalf("redeeming the released grant: %v", err)
	}
	if _, err := b.Redeem(ctx, "acme", c.ID, c.InvocationDigest); !errors.Is(err, confirm.ErrAlreadyRedeemed) {
		t.Fatalf("a released grant redeemed twice: %v", err)
	}
	if _, err := b.Release(ctx, "globex", c.ID, c.InvocationDigest); !errors.Is(err, confirm.ErrNotFound) {
		t.Errorf("releasing another tenant's challenge: %v, want ErrNotFound", err)
	}
	declined := create(t, b, Challenge("acme", "inv-declined"), time.Minute)
	if _, err := b.Decide(ctx, "acme", declined.ID, confirm.Decision{Approve: false, By: "alice", Channel: confirm.ChannelAPI}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Release(ctx, "acme", declined.ID, declined.InvocationDigest); !errors.Is(err, confirm.ErrRefused) {
		t.Errorf("releasing a declined challenge: %v, want ErrRefused", err)
	}
}

func (s *suite) testRedeemRefusals(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	type setup func(t *testing.T, c confirm.Challenge)
	decide := func(d confirm.Decision) setup {
		return func(t *testing.T, c confirm.Challenge) {
			if _, err := b.Decide(ctx, "acme", c.ID, d); err != nil {
				t.Fatal(err)
			}
		}
	}
	redeemed := func(t *testing.T, c confirm.Challenge) {
		decide(approve)(t, c)
		if _, err := b.Redeem(ctx, "acme", c.ID, c.InvocationDigest); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name      string
		ttl       time.Duration
		setup     setup
		expire    bool
		digestFor string // "" = the challenge's own invocation
		want      error
	}{
		{"replayed", time.Minute, redeemed, false, "", confirm.ErrAlreadyRedeemed},
		{"changed arguments", time.Minute, decide(approve), false, "inv-other", confirm.ErrGrantMismatch},
		{"declined", time.Minute, decide(confirm.Decision{By: "alice", Channel: confirm.ChannelAPI}), false, "", confirm.ErrRefused},
		{"still pending", time.Minute, nil, false, "", confirm.ErrPending},
		{"pending and expired", 300 * time.Millisecond, nil, true, "", confirm.ErrExpired},
		{"approved and expired", 300 * time.Millisecond, decide(approve), true, "", confirm.ErrExpired},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := create(t, b, Challenge("acme", fmt.Sprintf("inv-%d", i)), tc.ttl)
			if tc.setup != nil {
				tc.setup(t, c)
			}
			if tc.expire {
				waitState(t, b, "acme", c.ID, confirm.StateExpired)
			}
			digest := c.InvocationDigest
			if tc.digestFor != "" {
				digest = Digest(tc.digestFor)
			}
			before, _ := b.Get(ctx, "acme", c.ID)
			_, err := b.Redeem(ctx, "acme", c.ID, digest)
			wantErr(t, "Redeem", err, tc.want)
			after, _ := b.Get(ctx, "acme", c.ID)
			if diff := Diff(after, before); diff != "" {
				t.Fatalf("a refused Redeem changed the challenge: %s", diff)
			}
		})
	}
}

// testConcurrentRedeem: 64 redeemers of one approved grant, exactly one
// wins.
func (s *suite) testConcurrentRedeem(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	c := create(t, b, Challenge("acme", "inv-1"), time.Minute)
	if _, err := b.Decide(ctx, "acme", c.ID, approve); err != nil {
		t.Fatal(err)
	}
	var ok, replayed, other atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 64 {
		wg.Go(func() {
			<-start
			_, err := b.Redeem(ctx, "acme", c.ID, c.InvocationDigest)
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, confirm.ErrAlreadyRedeemed):
				replayed.Add(1)
			default:
				other.Add(1)
				t.Errorf("Redeem: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	if ok.Load() != 1 || replayed.Load() != 63 || other.Load() != 0 {
		t.Fatalf("%d redeemed, %d already_redeemed, %d other; want 1, 63, 0", ok.Load(), replayed.Load(), other.Load())
	}
}

func (s *suite) testConcurrentDecide(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	c := create(t, b, Challenge("acme", "inv-1"), time.Minute)
	var ok, twice atomic.Int32
	var winner atomic.Value
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 32 {
		wg.Go(func() {
			<-start
			d := confirm.Decision{Approve: i%2 == 0, By: fmt.Sprint("user-", i), Channel: confirm.ChannelAPI}
			got, err := b.Decide(ctx, "acme", c.ID, d)
			switch {
			case err == nil:
				ok.Add(1)
				winner.Store(got)
			case errors.Is(err, confirm.ErrAlreadyDecided):
				twice.Add(1)
			default:
				t.Errorf("Decide: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	if ok.Load() != 1 || twice.Load() != 31 {
		t.Fatalf("%d decisions recorded, %d already_decided; want 1 and 31", ok.Load(), twice.Load())
	}
	stored, _ := b.Get(ctx, "acme", c.ID)
	if diff := Diff(stored, winner.Load().(confirm.Challenge)); diff != "" {
		t.Fatalf("stored decision is not the winner's: %s", diff)
	}
}

func (s *suite) testListPending(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	var ids []string
	for i := range 4 {
		c := create(t, b, Challenge("acme", fmt.Sprintf("inv-%d", i)), time.Minute)
		ids = append(ids, c.ID)
		time.Sleep(2 * time.Millisecond) // distinct creation times
	}
	if _, err := b.Decide(ctx, "acme", ids[1], approve); err != nil {
		t.Fatal(err)
	}
	expiring := create(t, b, Challenge("acme", "inv-expiring"), 200*time.Millisecond)
	create(t, b, Challenge("globex", "inv-g"), time.Minute)
	waitState(t, b, "acme", expiring.ID, confirm.StateExpired)

	got, err := b.ListPending(ctx, "acme", 10)
	if err != nil {
		t.Fatal(err)
	}
	var gotIDs []string
	for _, c := range got {
		gotIDs = append(gotIDs, c.ID)
		if c.State != confirm.StatePending {
			t.Errorf("listed %s in state %s", c.ID, c.State)
		}
	}
	if want := []string{ids[3], ids[2], ids[0]}; !slices.Equal(gotIDs, want) {
		t.Fatalf("ListPending = %v, want %v (pending, newest first)", gotIDs, want)
	}
	if got, _ := b.ListPending(ctx, "acme", 1); len(got) != 1 || got[0].ID != ids[3] {
		t.Fatalf("ListPending limit 1 = %v", got)
	}
}

// testCountPending: only the requester's own pending, unexpired
// challenges of the tenant count.
func (s *suite) testCountPending(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	mine := make([]confirm.Challenge, 3)
	for i := range mine {
		mine[i] = create(t, b, Challenge("acme", fmt.Sprintf("inv-mine-%d", i)), time.Minute)
	}
	direct := Challenge("acme", "inv-direct")
	direct.RequesterAgent = ""
	create(t, b, direct, time.Minute)
	other := Challenge("acme", "inv-other")
	other.RequesterUser = "carol"
	create(t, b, other, time.Minute)
	create(t, b, Challenge("globex", "inv-globex"), time.Minute)
	expiring := create(t, b, Challenge("acme", "inv-expiring"), 200*time.Millisecond)
	if _, err := b.Decide(ctx, "acme", mine[0].ID, approve); err != nil {
		t.Fatal(err)
	}
	waitState(t, b, "acme", expiring.ID, confirm.StateExpired)
	for _, c := range []struct {
		tenant, user, agent string
		want                int
	}{
		{"acme", "alice", "support-bot", 2}, {"acme", "alice", "", 1}, {"acme", "carol", "support-bot", 1},
		{"globex", "alice", "support-bot", 1}, {"acme", "bob", "", 0},
	} {
		if n, err := b.CountPending(ctx, c.tenant, c.user, c.agent); err != nil || n != c.want {
			t.Errorf("CountPending(%s, %s, %q) = %d, %v; want %d", c.tenant, c.user, c.agent, n, err, c.want)
		}
	}
}

func recv(t *testing.T, ch <-chan confirm.Challenge) (confirm.Challenge, bool) {
	t.Helper()
	select {
	case c, ok := <-ch:
		return c, ok
	case <-time.After(10 * time.Second):
		t.Fatal("Watch sent nothing for 10s")
	}
	return confirm.Challenge{}, false
}

func (s *suite) testWatch(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	c := create(t, b, Challenge("acme", "inv-1"), time.Minute)
	ch, err := b.Watch(ctx, "acme", c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if first, ok := recv(t, ch); !ok || first.State != confirm.StatePending || first.ID != c.ID {
		t.Fatalf("first: %+v %v", first, ok)
	}
	if _, err := b.Decide(ctx, "acme", c.ID, approve); err != nil {
		t.Fatal(err)
	}
	if got, ok := recv(t, ch); !ok || got.State != confirm.StateApproved || got.DecidedBy != "alice" {
		t.Fatalf("after Decide: %+v %v", got, ok)
	}
	if _, ok := recv(t, ch); ok {
		t.Fatal("Watch went on after the challenge was decided")
	}
	// Watching a decided challenge sends it once and ends.
	ch, err = b.Watch(ctx, "acme", c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := recv(t, ch); !ok || got.State != confirm.StateApproved {
		t.Fatalf("watching a decided challenge: %+v %v", got, ok)
	}
	if _, ok := recv(t, ch); ok {
		t.Fatal("Watch of a decided challenge did not end")
	}
	_, err = b.Watch(ctx, "acme", confirm.NewID())
	wantErr(t, "Watch of an unknown id", err, confirm.ErrNotFound)
}

func (s *suite) testWatchExpiry(t *testing.T) {
	b := s.newBackend(t)
	// Long enough that the first read comes before expiry on a loaded
	// machine (300 ms did not, once, in CI).
	c := create(t, b, Challenge("acme", "inv-1"), 1500*time.Millisecond)
	ch, err := b.Watch(testCtx(t), "acme", c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if first, _ := recv(t, ch); first.State != confirm.StatePending {
		t.Fatalf("first: %s", first.State)
	}
	if got, ok := recv(t, ch); !ok || got.State != confirm.StateExpired {
		t.Fatalf("at expiry: %+v %v, want EXPIRED", got, ok)
	}
	if _, ok := recv(t, ch); ok {
		t.Fatal("Watch went on after expiry")
	}
}

func (s *suite) testWatchEnds(t *testing.T) {
	b := s.newBackend(t)
	c := create(t, b, Challenge("acme", "inv-1"), time.Minute)
	ctx, cancel := context.WithCancel(testCtx(t))
	ch, err := b.Watch(ctx, "acme", c.ID)
	if err != nil {
		t.Fatal(err)
	}
	recv(t, ch)
	cancel()
	if _, ok := recv(t, ch); ok {
		t.Fatal("Watch sent after its context ended")
	}
}

func (s *suite) testLoginTokens(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	exp := time.Now().Add(5 * time.Minute)
	if err := b.ConsumeLoginToken(ctx, "jti-1", exp); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "reusing a sign-in token", b.ConsumeLoginToken(ctx, "jti-1", exp), confirm.ErrLoginTokenUsed)
	wantErr(t, "empty jti", b.ConsumeLoginToken(ctx, "", exp), confirm.ErrInvalid)
	var ok atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			switch err := b.ConsumeLoginToken(ctx, "jti-race", exp); {
			case err == nil:
				ok.Add(1)
			case !errors.Is(err, confirm.ErrLoginTokenUsed):
				t.Errorf("ConsumeLoginToken: %v", err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 1 {
		t.Fatalf("a sign-in token was accepted %d times", ok.Load())
	}
}

func (s *suite) testSessions(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	in := confirm.Session{IDHash: Digest("cookie-1"), Tenant: "acme", UserID: "carol", CSRFToken: "csrf-1"}
	stored, err := b.CreateSession(ctx, in, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if stored.ExpiresAt.Sub(stored.CreatedAt) != time.Hour {
		t.Fatalf("session lifetime %v", stored.ExpiresAt.Sub(stored.CreatedAt))
	}
	got, err := b.Session(ctx, in.IDHash)
	if err != nil || got != stored {
		t.Fatalf("Session = %+v, %v; want %+v", got, err, stored)
	}
	_, err = b.CreateSession(ctx, in, time.Hour)
	wantErr(t, "a second session with the same id", err, confirm.ErrInvalid)
	_, err = b.CreateSession(ctx, confirm.Session{IDHash: Digest("x"), Tenant: "acme", UserID: "carol"}, time.Hour)
	wantErr(t, "a session without CSRF token", err, confirm.ErrInvalid)
	if err := b.DeleteSession(ctx, in.IDHash); err != nil {
		t.Fatal(err)
	}
	_, err = b.Session(ctx, in.IDHash)
	wantErr(t, "a deleted session", err, confirm.ErrNotFound)
	if err := b.DeleteSession(ctx, in.IDHash); err != nil {
		t.Fatalf("deleting twice: %v", err)
	}
	short := confirm.Session{IDHash: Digest("cookie-2"), Tenant: "acme", UserID: "carol", CSRFToken: "csrf-2"}
	if _, err := b.CreateSession(ctx, short, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	_, err = b.Session(ctx, short.IDHash)
	wantErr(t, "an expired session", err, confirm.ErrNotFound)
}

// Diff describes how two challenges differ, or returns "" when they are the
// same (times compared with Equal, nil and empty slices alike).
func Diff(got, want confirm.Challenge) string {
	var d []string
	add := func(field string, g, w any) { d = append(d, fmt.Sprintf("%s: got %v, want %v", field, g, w)) }
	eqs := map[string][2]string{
		"ID": {got.ID, want.ID}, "Tenant": {got.Tenant, want.Tenant}, "Command": {got.Command, want.Command},
		"Risk": {got.Risk, want.Risk}, "InvocationDigest": {got.InvocationDigest, want.InvocationDigest},
		"InvocationID": {got.InvocationID, want.InvocationID}, "RequesterUser": {got.RequesterUser, want.RequesterUser},
		"RequesterAgent": {got.RequesterAgent, want.RequesterAgent}, "State": {string(got.State), string(want.State)},
		"ApproverKind": {string(got.Approver.Kind), string(want.Approver.Kind)}, "ApproverPermission": {got.Approver.Permission, want.Approver.Permission},
		"DecidedBy": {got.DecidedBy, want.DecidedBy}, "DecisionChannel": {got.DecisionChannel, want.DecisionChannel},
	}
	keys := make([]string, 0, len(eqs))
	for k := range eqs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if eqs[k][0] != eqs[k][1] {
			add(k, eqs[k][0], eqs[k][1])
		}
	}
	for name, pair := range map[string][2]time.Time{
		"CreatedAt": {got.CreatedAt, want.CreatedAt}, "ExpiresAt": {got.ExpiresAt, want.ExpiresAt},
		"DecidedAt": {got.DecidedAt, want.DecidedAt}, "RedeemedAt": {got.RedeemedAt, want.RedeemedAt},
	} {
		if !pair[0].Equal(pair[1]) {
			add(name, pair[0], pair[1])
		}
	}
	gp, wp := got.Prompt, want.Prompt
	if gp.Title != wp.Title || gp.Summary != wp.Summary || gp.Risk != wp.Risk || gp.Reversible != wp.Reversible ||
		gp.Recall != wp.Recall || gp.ArgumentsJSON != wp.ArgumentsJSON || gp.RequestedBy != wp.RequestedBy ||
		!slices.Equal(gp.SideEffects, wp.SideEffects) || !slices.Equal(gp.Permissions, wp.Permissions) ||
		!slices.Equal(gp.WithheldFields, wp.WithheldFields) {
		add("Prompt", fmt.Sprintf("%+v", gp), fmt.Sprintf("%+v", wp))
	}
	slices.Sort(d)
	return fmt.Sprint(d)[1 : len(fmt.Sprint(d))-1]
}
