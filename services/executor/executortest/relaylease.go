package executortest

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/mandate-dev/mandate/services/executor"
)

// The relay lease (executor.RelayLeaser): one holder at a time per store.

// mustRelayLease takes the store's relay lease, which must be free.
func mustRelayLease(t *testing.T, l executor.RelayLeaser, ctx context.Context, who string) func() {
	t.Helper()
	return mustRelayLeaseOf(t, l, ctx, who, nil).Release
}

// mustRelayLeaseOf takes the store's relay lease, which must be free, asking which of own are
// still spooled.
func mustRelayLeaseOf(t *testing.T, l executor.RelayLeaser, ctx context.Context, who string, own []int64) *executor.RelayLease {
	t.Helper()
	lease, err := l.TryRelayLease(ctx, own)
	if err != nil || lease == nil {
		t.Fatalf("%s: TryRelayLease = %v, %v; want the lease", who, lease, err)
	}
	return lease
}

// wantRelayLeaseBusy asserts that the store's relay lease is held by another.
func wantRelayLeaseBusy(t *testing.T, l executor.RelayLeaser, who string) {
	t.Helper()
	lease, err := l.TryRelayLease(testCtx(t), nil)
	if err != nil || lease != nil {
		if lease != nil {
			lease.Release()
		}
		t.Fatalf("%s: TryRelayLease = %v, %v; want it refused, the lease being held", who, lease, err)
	}
}

// testRelayLease: a second holder is refused the relay lease while the first holds it, and
// gets it once the first releases it; releasing twice gives back nothing of the next
// holder's; a holder whose context was cancelled mid-round still gives it back. The lease
// names those of the ids asked about still spooled, in order, and the oldest spooled id.
func (s *suite) testRelayLease(t *testing.T) {
	st := s.newStore(t)
	l, ok := st.(executor.RelayLeaser)
	if !ok {
		t.Skip("the store does not lease relay rounds")
	}
	ctx := testCtx(t)
	first := mustRelayLease(t, l, ctx, "first holder")
	wantRelayLeaseBusy(t, l, "second holder, while the first holds it")
	wantRelayLeaseBusy(t, l, "second holder, asking again")
	first()
	second := mustRelayLease(t, l, ctx, "second holder, after the first released it")
	first() // again: a no-op
	wantRelayLeaseBusy(t, l, "third holder, after the first released it twice")
	second()

	cctx, cancel := context.WithCancel(ctx)
	held := mustRelayLease(t, l, cctx, "a holder whose context is cancelled mid-round")
	cancel()
	wantRelayLeaseBusy(t, l, "another, before the cancelled holder released it")
	held()
	mustRelayLease(t, l, ctx, "another, after the cancelled holder released it")()

	var ids []int64
	for i := range 3 {
		inv := fmt.Sprint("inv-", i)
		if err := st.Spool(ctx, executor.SpooledRow{Tenant: "acme", InvocationID: inv, Record: []byte(`{"invocation_id":"` + inv + `"}`), Time: Base}); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := st.Spooled(ctx, 10)
	if err != nil || len(rows) != 3 {
		t.Fatalf("Spooled = %+v, %v", rows, err)
	}
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	if err := st.Unspool(ctx, ids[1:2]); err != nil {
		t.Fatal(err)
	}
	still := func(asked []int64) ([]int64, int64) {
		lease := mustRelayLeaseOf(t, l, ctx, "a holder asking what is still spooled", asked)
		lease.Release()
		return lease.Left, lease.Oldest
	}
	asked := []int64{ids[2], ids[1], ids[0], ids[2] + 1000}
	if got, oldest := still(asked); !slices.Equal(got, []int64{ids[0], ids[2]}) || oldest != ids[0] {
		t.Fatalf("still spooled of %v = %v, oldest %d; want %v, oldest %d", asked, got, oldest, []int64{ids[0], ids[2]}, ids[0])
	}
	if err := st.Unspool(ctx, ids[:1]); err != nil {
		t.Fatal(err)
	}
	if got, oldest := still(nil); len(got) != 0 || oldest != ids[2] {
		t.Fatalf("still spooled of none = %v, oldest %d; want none, oldest %d", got, oldest, ids[2])
	}
	if err := st.Unspool(ctx, ids[2:]); err != nil {
		t.Fatal(err)
	}
	if got, oldest := still(ids); len(got) != 0 || oldest != 0 {
		t.Fatalf("still spooled of an empty spool = %v, oldest %d; want none, oldest 0", got, oldest)
	}
}
