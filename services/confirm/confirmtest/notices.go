package confirmtest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/services/confirm"
)

// claim claims up to 1000 due notices for lease and fails the test on
// error.
func claim(t *testing.T, b Backend, lease time.Duration) []confirm.Notice {
	t.Helper()
	ns, err := b.ClaimNotices(testCtx(t), 1000, lease)
	if err != nil {
		t.Fatalf("ClaimNotices: %v", err)
	}
	return ns
}

// deliverAll claims every due notice and drops it, so that later claims
// see only what the test does next.
func deliverAll(t *testing.T, b Backend) {
	t.Helper()
	for _, n := range claim(t, b, time.Hour) {
		if err := b.NoticeDelivered(testCtx(t), n.ID); err != nil {
			t.Fatalf("NoticeDelivered: %v", err)
		}
	}
}

// describe lists notices for failure messages.
func describe(ns []confirm.Notice) string {
	var parts []string
	for _, n := range ns {
		parts = append(parts, fmt.Sprintf("#%d %s %s/%s attempts=%d", n.ID, n.Kind, n.Tenant, n.ChallengeID, n.Attempts))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func noticeIDs(ns []confirm.Notice) []int64 {
	ids := make([]int64, len(ns))
	for i, n := range ns {
		ids[i] = n.ID
	}
	return ids
}

// wantNotice fails unless n reports kind about c (as stored now) at at.
func wantNotice(t *testing.T, n confirm.Notice, kind confirm.NoticeKind, c confirm.Challenge, at time.Time) {
	t.Helper()
	if n.Kind != kind || n.Tenant != c.Tenant || n.ChallengeID != c.ID || !n.At.Equal(at) || n.Attempts != 0 {
		t.Fatalf("notice %s at %v, want %s of %s/%s at %v, no attempts", describe([]confirm.Notice{n}), n.At, kind, c.Tenant, c.ID, at)
	}
	if diff := Diff(n.Challenge, c); diff != "" {
		t.Fatalf("the notice's challenge: %s", diff)
	}
}

// testNoticeOpened: Create records one opened notice, with the challenge,
// only when it creates one.
func (s *suite) testNoticeOpened(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	if ns := claim(t, b, time.Hour); len(ns) != 0 {
		t.Fatalf("a new store has notices: %s", describe(ns))
	}
	c := create(t, b, Challenge("acme", "inv-1"), time.Minute)
	ns := claim(t, b, time.Hour)
	if len(ns) != 1 {
		t.Fatalf("after Create: %s, want one opened notice", describe(ns))
	}
	wantNotice(t, ns[0], confirm.NoticeOpened, c, c.CreatedAt)
	if ns[0].ID <= 0 {
		t.Fatalf("notice id %d", ns[0].ID)
	}
	if err := b.NoticeDelivered(ctx, ns[0].ID); err != nil {
		t.Fatal(err)
	}
	// Opening the same invocation again returns the first challenge and
	// announces nothing; neither does a refused Create.
	if _, created, err := b.Create(ctx, Challenge("acme", "inv-1"), time.Minute); err != nil || created {
		t.Fatalf("re-open: created=%v err=%v", created, err)
	}
	bad := Challenge("acme", "inv-2")
	bad.InvocationDigest = "nope"
	_, _, err := b.Create(ctx, bad, time.Minute)
	wantErr(t, "Create with a bad digest", err, confirm.ErrInvalid)
	if ns := claim(t, b, time.Hour); len(ns) != 0 {
		t.Fatalf("after an idempotent re-open and a refused Create: %s, want none", describe(ns))
	}
}

// testNoticeDecided: a decision records one decided notice carrying the
// decided challenge; Redeem and Release record nothing.
func (s *suite) testNoticeDecided(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	for _, approve := range []bool{true, false} {
		c := create(t, b, Challenge("acme", fmt.Sprint("inv-", approve)), time.Minute)
		deliverAll(t, b)
		decided, err := b.Decide(ctx, "acme", c.ID, confirm.Decision{Approve: approve, By: "carol", Channel: confirm.ChannelApprovalPage})
		if err != nil {
			t.Fatal(err)
		}
		ns := claim(t, b, time.Hour)
		if len(ns) != 1 {
			t.Fatalf("after Decide(approve=%v): %s, want one decided notice", approve, describe(ns))
		}
		wantNotice(t, ns[0], confirm.NoticeDecided, decided, decided.DecidedAt)
		if err := b.NoticeDelivered(ctx, ns[0].ID); err != nil {
			t.Fatal(err)
		}
		if approve {
			if _, err := b.Redeem(ctx, "acme", c.ID, c.InvocationDigest); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Release(ctx, "acme", c.ID, c.InvocationDigest); err != nil {
				t.Fatal(err)
			}
			if ns := claim(t, b, time.Hour); len(ns) != 0 {
				t.Fatalf("after Redeem and Release: %s, want none", describe(ns))
			}
		}
	}
}

// testNoticeNotOnRefusal: a refused decision records nothing.
func (s *suite) testNoticeNotOnRefusal(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	c := create(t, b, Challenge("acme", "inv-1"), time.Minute)
	expiring := create(t, b, Challenge("acme", "inv-2"), 300*time.Millisecond)
	deliverAll(t, b)
	_, err := b.Decide(ctx, "acme", c.ID, confirm.Decision{Approve: true, Channel: confirm.ChannelAPI})
	wantErr(t, "Decide without a decider", err, confirm.ErrInvalid)
	_, err = b.Decide(ctx, "acme", c.ID, confirm.Decision{Approve: true, By: "alice", Channel: "fax"})
	wantErr(t, "Decide through an unknown channel", err, confirm.ErrInvalid)
	_, err = b.Decide(ctx, "globex", c.ID, approve)
	wantErr(t, "Decide from another tenant", err, confirm.ErrNotFound)
	_, err = b.Decide(ctx, "acme", confirm.NewID(), approve)
	wantErr(t, "Decide of an unknown id", err, confirm.ErrNotFound)
	if _, err := b.Decide(ctx, "acme", c.ID, confirm.Decision{By: "alice", Channel: confirm.ChannelAPI}); err != nil {
		t.Fatal(err)
	}
	_, err = b.Decide(ctx, "acme", c.ID, approve)
	wantErr(t, "deciding twice", err, confirm.ErrAlreadyDecided)
	waitState(t, b, "acme", expiring.ID, confirm.StateExpired)
	_, err = b.Decide(ctx, "acme", expiring.ID, approve)
	wantErr(t, "Decide after expiry", err, confirm.ErrExpired)
	ns := claim(t, b, time.Hour)
	if len(ns) != 1 || ns[0].Kind != confirm.NoticeDecided || ns[0].ChallengeID != c.ID || ns[0].Challenge.State != confirm.StateDeclined {
		t.Fatalf("notices %s, want only the one decline", describe(ns))
	}
}

// testExpireDue: of 16 concurrent sweeps, each expired pending challenge
// (any tenant) gets exactly one expired notice; decided and unexpired ones
// get none, and a challenge never gets a second one, even once the first
// was delivered.
func (s *suite) testExpireDue(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	const ttl = 300 * time.Millisecond
	// Decided before its expiry: an approved grant that expires unredeemed,
	// and a declined challenge.
	approved := create(t, b, Challenge("acme", "inv-approved"), ttl)
	declined := create(t, b, Challenge("acme", "inv-declined"), ttl)
	if _, err := b.Decide(ctx, "acme", approved.ID, approve); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Decide(ctx, "acme", declined.ID, confirm.Decision{By: "alice", Channel: confirm.ChannelAPI}); err != nil {
		t.Fatal(err)
	}
	open := create(t, b, Challenge("acme", "inv-open"), time.Minute)
	var expiring []confirm.Challenge
	for i := range 10 {
		tenant := "acme"
		if i%3 == 1 {
			tenant = "globex"
		}
		expiring = append(expiring, create(t, b, Challenge(tenant, fmt.Sprint("inv-", i)), ttl))
		time.Sleep(time.Millisecond) // distinct expiry times
	}
	if n, err := b.ExpireDue(ctx, 0); err != nil || n != 0 {
		t.Fatalf("ExpireDue(limit 0) = %d, %v", n, err)
	}
	deliverAll(t, b)
	for _, c := range expiring {
		waitState(t, b, c.Tenant, c.ID, confirm.StateExpired)
	}
	waitState(t, b, "acme", approved.ID, confirm.StateExpired)

	// A limited sweep takes those that expired first.
	if n, err := b.ExpireDue(ctx, 3); err != nil || n != 3 {
		t.Fatalf("ExpireDue(limit 3) = %d, %v; want 3", n, err)
	}
	first := claim(t, b, time.Hour)
	if len(first) != 3 {
		t.Fatalf("after ExpireDue(limit 3): %s", describe(first))
	}
	for i := range expiring {
		expiring[i].State = confirm.StateExpired // as Get reads it now
	}
	for i, n := range first {
		wantNotice(t, n, confirm.NoticeExpired, expiring[i], expiring[i].ExpiresAt)
	}

	var total atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 16 {
		wg.Go(func() {
			<-start
			n, err := b.ExpireDue(ctx, 100)
			if err != nil {
				t.Errorf("ExpireDue: %v", err)
			}
			total.Add(int64(n))
		})
	}
	close(start)
	wg.Wait()
	if total.Load() != 7 {
		t.Fatalf("16 concurrent sweeps recorded %d expired notices, want 7", total.Load())
	}
	rest := claim(t, b, time.Hour)
	if len(rest) != 7 {
		t.Fatalf("after the concurrent sweeps: %s, want 7 expired notices", describe(rest))
	}
	for i, n := range rest {
		wantNotice(t, n, confirm.NoticeExpired, expiring[3+i], expiring[3+i].ExpiresAt)
	}
	if n, err := b.ExpireDue(ctx, 100); err != nil || n != 0 {
		t.Fatalf("a second sweep recorded %d, %v; want 0", n, err)
	}
	for _, n := range append(first, rest...) {
		if err := b.NoticeDelivered(ctx, n.ID); err != nil {
			t.Fatal(err)
		}
	}
	_, err := b.Decide(ctx, expiring[0].Tenant, expiring[0].ID, approve)
	wantErr(t, "Decide of a challenge with an expired notice", err, confirm.ErrExpired)
	if n, err := b.ExpireDue(ctx, 100); err != nil || n != 0 {
		t.Fatalf("a sweep after delivery recorded %d, %v; want 0", n, err)
	}
	if ns := claim(t, b, time.Hour); len(ns) != 0 {
		t.Fatalf("left over: %s, want none (nothing for decided, unexpired (%s) or already announced challenges)",
			describe(ns), open.ID)
	}
}

// testClaimHides: concurrent claimers get disjoint notices; a claim hides
// them until the lease runs out.
func (s *suite) testClaimHides(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	_, err := b.ClaimNotices(ctx, 10, 0)
	wantErr(t, "ClaimNotices without a lease", err, confirm.ErrInvalid)
	all := map[string]bool{}
	for i := range 20 {
		all[create(t, b, Challenge("acme", fmt.Sprint("inv-", i)), time.Minute).ID] = true
	}
	if ns, err := b.ClaimNotices(ctx, 0, time.Hour); err != nil || len(ns) != 0 {
		t.Fatalf("ClaimNotices(limit 0) = %s, %v", describe(ns), err)
	}
	var mu sync.Mutex
	seen := map[int64]string{}
	claimed := map[string]bool{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 8 {
		wg.Go(func() {
			<-start
			ns, err := b.ClaimNotices(ctx, 5, time.Hour)
			if err != nil {
				t.Errorf("ClaimNotices: %v", err)
				return
			}
			if len(ns) > 5 {
				t.Errorf("ClaimNotices(limit 5) returned %d", len(ns))
			}
			mu.Lock()
			defer mu.Unlock()
			for _, n := range ns {
				if seen[n.ID] != "" {
					t.Errorf("notice %d claimed twice", n.ID)
				}
				seen[n.ID], claimed[n.ChallengeID] = n.ChallengeID, true
			}
		})
	}
	close(start)
	wg.Wait()
	for _, n := range claim(t, b, time.Hour) { // whatever the concurrent claims left
		if seen[n.ID] != "" {
			t.Fatalf("notice %d claimed again within its lease", n.ID)
		}
		seen[n.ID], claimed[n.ChallengeID] = n.ChallengeID, true
	}
	if len(seen) != 20 || len(claimed) != 20 {
		t.Fatalf("claimed %d notices of %d challenges, want 20 of 20", len(seen), len(claimed))
	}
	for id := range claimed {
		if !all[id] {
			t.Fatalf("claimed a notice of unknown challenge %s", id)
		}
	}
	if ns := claim(t, b, time.Hour); len(ns) != 0 {
		t.Fatalf("claimed within the lease: %s", describe(ns))
	}
}

// testClaimAfterLease: a claimed notice nobody reported on is claimed again
// once its lease has run out, as it was.
func (s *suite) testClaimAfterLease(t *testing.T) {
	b := s.newBackend(t)
	c := create(t, b, Challenge("acme", "inv-1"), time.Minute)
	const lease = time.Second
	first := claim(t, b, lease)
	if len(first) != 1 {
		t.Fatalf("first claim: %s", describe(first))
	}
	if ns := claim(t, b, lease); len(ns) != 0 {
		t.Fatalf("claimed again within the lease: %s", describe(ns))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ns := claim(t, b, lease)
		if len(ns) == 1 {
			wantNotice(t, ns[0], confirm.NoticeOpened, c, c.CreatedAt)
			if ns[0].ID != first[0].ID {
				t.Fatalf("claimed #%d after the lease, want #%d", ns[0].ID, first[0].ID)
			}
			return
		}
		if len(ns) != 0 {
			t.Fatalf("after the lease: %s", describe(ns))
		}
		if time.Now().After(deadline) {
			t.Fatal("the notice was not claimed again after its lease ran out")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testNoticeFailed: a failed attempt counts and delays the next one; any
// reason is accepted.
func (s *suite) testNoticeFailed(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	create(t, b, Challenge("acme", "inv-1"), time.Minute)
	ns := claim(t, b, time.Hour)
	if len(ns) != 1 {
		t.Fatalf("claim: %s", describe(ns))
	}
	id := ns[0].ID
	// A webhook's answer may be long, binary, anything.
	junk := strings.Repeat("é", 400) + "\xff\x00\xc3" + strings.Repeat("x", 10_000)
	if err := b.NoticeFailed(ctx, id, time.Hour, junk); err != nil {
		t.Fatalf("NoticeFailed: %v", err)
	}
	if ns := claim(t, b, time.Hour); len(ns) != 0 {
		t.Fatalf("claimed before its next attempt: %s", describe(ns))
	}
	if err := b.NoticeFailed(ctx, id, 0, "503 Service Unavailable"); err != nil {
		t.Fatal(err)
	}
	ns = claim(t, b, time.Hour)
	if len(ns) != 1 || ns[0].ID != id || ns[0].Attempts != 2 {
		t.Fatalf("after two failures, the second without delay: %s, want #%d with 2 attempts", describe(ns), id)
	}
	if err := b.NoticeFailed(ctx, id, -time.Hour, "timeout"); err != nil {
		t.Fatal(err)
	}
	if ns = claim(t, b, time.Hour); len(ns) != 1 || ns[0].Attempts != 3 {
		t.Fatalf("after a failure with a negative delay: %s, want #%d with 3 attempts", describe(ns), id)
	}
	if err := b.NoticeFailed(ctx, id+1000, 0, "unknown"); err != nil {
		t.Fatalf("NoticeFailed of an unknown notice: %v", err)
	}
}

// testNoticeDelivered: a delivered notice is gone; reporting on it again,
// or on an unknown one, is no error and does not bring it back.
func (s *suite) testNoticeDelivered(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	create(t, b, Challenge("acme", "inv-1"), time.Minute)
	create(t, b, Challenge("acme", "inv-2"), time.Minute)
	ns := claim(t, b, time.Hour)
	if len(ns) != 2 {
		t.Fatalf("claim: %s", describe(ns))
	}
	for range 2 {
		if err := b.NoticeDelivered(ctx, ns[0].ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.NoticeDelivered(ctx, ns[1].ID+1000); err != nil {
		t.Fatalf("NoticeDelivered of an unknown notice: %v", err)
	}
	// Both due again: only the undelivered one comes back.
	for _, n := range ns {
		if err := b.NoticeFailed(ctx, n.ID, 0, "late report"); err != nil {
			t.Fatal(err)
		}
	}
	if got := claim(t, b, time.Hour); len(got) != 1 || got[0].ID != ns[1].ID {
		t.Fatalf("after delivering #%d: %s, want only #%d", ns[0].ID, describe(got), ns[1].ID)
	}
}

// testNoticeGiveUp: a given-up notice is never claimed again, neither after
// its lease nor after a late failure report.
func (s *suite) testNoticeGiveUp(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	create(t, b, Challenge("acme", "inv-1"), time.Minute)
	create(t, b, Challenge("acme", "inv-2"), time.Minute)
	const lease = 200 * time.Millisecond
	ns := claim(t, b, lease)
	if len(ns) != 2 {
		t.Fatalf("claim: %s", describe(ns))
	}
	if err := b.NoticeGiveUp(ctx, ns[0].ID, "410 Gone "+strings.Repeat("\x00", 600)); err != nil {
		t.Fatal(err)
	}
	if err := b.NoticeFailed(ctx, ns[0].ID, 0, "late report"); err != nil {
		t.Fatal(err)
	}
	if err := b.NoticeGiveUp(ctx, ns[0].ID+1000, "unknown"); err != nil {
		t.Fatalf("NoticeGiveUp of an unknown notice: %v", err)
	}
	time.Sleep(2 * lease)
	got := claim(t, b, time.Hour)
	if len(got) != 1 || got[0].ID != ns[1].ID {
		t.Fatalf("after giving up #%d: %s, want only #%d", ns[0].ID, describe(got), ns[1].ID)
	}
}

// testNoticesOldestFirst: notices are claimed in the order they were
// recorded, a retried one before newer ones.
func (s *suite) testNoticesOldestFirst(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	var cs []confirm.Challenge
	for i := range 3 {
		cs = append(cs, create(t, b, Challenge("acme", fmt.Sprint("inv-", i)), time.Minute))
	}
	if _, err := b.Decide(ctx, "acme", cs[0].ID, approve); err != nil {
		t.Fatal(err)
	}
	head, err := b.ClaimNotices(ctx, 2, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tail := claim(t, b, time.Hour)
	got := append(slices.Clone(head), tail...)
	want := []struct {
		kind confirm.NoticeKind
		id   string
	}{{confirm.NoticeOpened, cs[0].ID}, {confirm.NoticeOpened, cs[1].ID}, {confirm.NoticeOpened, cs[2].ID}, {confirm.NoticeDecided, cs[0].ID}}
	if len(head) != 2 || len(got) != len(want) {
		t.Fatalf("claims %s then %s, want 2 then 2", describe(head), describe(tail))
	}
	for i, w := range want {
		if got[i].Kind != w.kind || got[i].ChallengeID != w.id || (i > 0 && got[i].ID <= got[i-1].ID) {
			t.Fatalf("claimed %s, want opened 0, 1, 2 then decided 0, ids increasing", describe(got))
		}
	}
	// The first two fail and are due again: they still come first.
	for _, n := range head {
		if err := b.NoticeFailed(ctx, n.ID, 0, "502 Bad Gateway"); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range tail {
		if err := b.NoticeFailed(ctx, n.ID, 0, "502 Bad Gateway"); err != nil {
			t.Fatal(err)
		}
	}
	if again := claim(t, b, time.Hour); !slices.Equal(noticeIDs(again), noticeIDs(got)) {
		t.Fatalf("claimed again: %s, want %s", describe(again), describe(got))
	}
}

// testNoticeTenantIsolation: a notice carries its own tenant's challenge,
// even when another tenant has one for the same invocation.
func (s *suite) testNoticeTenantIsolation(t *testing.T) {
	b := s.newBackend(t)
	ctx := testCtx(t)
	acme := create(t, b, Challenge("acme", "inv-1"), time.Minute)
	globex := create(t, b, Challenge("globex", "inv-1"), time.Minute)
	if _, err := b.Decide(ctx, "globex", globex.ID, confirm.Decision{Approve: true, By: "gina", Channel: confirm.ChannelAPI}); err != nil {
		t.Fatal(err)
	}
	ns := claim(t, b, time.Hour)
	per := map[string]int{}
	for _, n := range ns {
		per[n.Tenant]++
		if n.Challenge.Tenant != n.Tenant || n.Challenge.ID != n.ChallengeID {
			t.Fatalf("notice of %s/%s carries challenge %s/%s", n.Tenant, n.ChallengeID, n.Challenge.Tenant, n.Challenge.ID)
		}
		stored, err := b.Get(ctx, n.Tenant, n.ChallengeID)
		if err != nil {
			t.Fatal(err)
		}
		if diff := Diff(n.Challenge, stored); diff != "" {
			t.Fatalf("notice #%d's challenge is not its tenant's: %s", n.ID, diff)
		}
		if _, err := b.Get(ctx, map[string]string{"acme": "globex", "globex": "acme"}[n.Tenant], n.ChallengeID); !errors.Is(err, confirm.ErrNotFound) {
			t.Fatalf("the other tenant reads %s: %v", n.ChallengeID, err)
		}
	}
	if per["acme"] != 1 || per["globex"] != 2 || len(ns) != 3 {
		t.Fatalf("notices %s, want acme's opened, globex's opened and decided", describe(ns))
	}
	if acme.ID == globex.ID {
		t.Fatal("tenants share a challenge")
	}
}
