package executortest

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/services/executor"
)

// ParkedCall returns a parked call of tenant's challenge, expiring in an hour (whole
// microseconds).
func ParkedCall(tenant, challenge string) executor.Parked {
	return executor.Parked{
		Tenant: tenant, ChallengeID: challenge, Command: "ticket.refund",
		DeclarationDigest: "decl-1", InputDigest: "input-1",
		// Wire bytes: opaque to the store, not valid UTF-8 on purpose.
		Canonical:       []byte{0x0a, 0x02, 'T', '1', 0x10, 0xff, 0x01},
		Arguments:       `{"ticket_id":"T1","cardholder_reference":"[withheld]"}`,
		Withheld:        []string{"/cardholder_reference"},
		ArgumentsDigest: "args-1", InvocationDigest: "inv-digest-1",
		Expires: time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond),
	}
}

func mustPark(t *testing.T, st executor.Store, p executor.Parked) {
	t.Helper()
	if err := st.Park(testCtx(t), p); err != nil {
		t.Fatalf("Park(%s/%s): %v", p.Tenant, p.ChallengeID, err)
	}
}

func mustParked(t *testing.T, st executor.Store, tenant, challenge string) *executor.Parked {
	t.Helper()
	p, err := st.Parked(testCtx(t), tenant, challenge)
	if err != nil {
		t.Fatalf("Parked(%s, %s): %v", tenant, challenge, err)
	}
	return p
}

func sameParked(a, b executor.Parked) bool {
	return a.Tenant == b.Tenant && a.ChallengeID == b.ChallengeID && a.Command == b.Command &&
		a.DeclarationDigest == b.DeclarationDigest && a.InputDigest == b.InputDigest &&
		bytes.Equal(a.Canonical, b.Canonical) && a.Arguments == b.Arguments && slices.Equal(a.Withheld, b.Withheld) &&
		a.ArgumentsDigest == b.ArgumentsDigest && a.InvocationDigest == b.InvocationDigest && a.Expires.Equal(b.Expires)
}

// testPark: a parked call reads back as parked, per tenant and challenge, as a copy; parking
// the challenge again replaces it; Unpark drops it (and dropping nothing is no error); an
// empty request and no withheld fields survive the round trip.
func (s *suite) testPark(t *testing.T) {
	st := s.newStore(t)
	want := ParkedCall("acme", "ch-1")
	mustPark(t, st, want)
	got := mustParked(t, st, "acme", "ch-1")
	if got == nil || !sameParked(*got, want) {
		t.Fatalf("Parked = %+v, want %+v", got, want)
	}
	got.Canonical[0], got.Withheld[0] = 'x', "x"
	if again := mustParked(t, st, "acme", "ch-1"); again == nil || !sameParked(*again, want) {
		t.Fatalf("a change to what Parked returned reached the store: %+v", again)
	}
	for _, other := range [][2]string{{"globex", "ch-1"}, {"acme", "ch-2"}} {
		if p := mustParked(t, st, other[0], other[1]); p != nil {
			t.Fatalf("Parked(%s, %s) = %+v, want none", other[0], other[1], p)
		}
	}

	replaced := ParkedCall("acme", "ch-1")
	replaced.InputDigest, replaced.Canonical, replaced.Withheld, replaced.Arguments = "input-2", nil, nil, "{}"
	mustPark(t, st, replaced)
	got = mustParked(t, st, "acme", "ch-1")
	if got == nil || got.InputDigest != "input-2" || len(got.Canonical) != 0 || len(got.Withheld) != 0 || got.Arguments != "{}" {
		t.Fatalf("Parked after parking again = %+v, want the second record, empty request, nothing withheld", got)
	}

	mustPark(t, st, ParkedCall("globex", "ch-1"))
	if err := st.Unpark(testCtx(t), "acme", "ch-1"); err != nil {
		t.Fatal(err)
	}
	if p := mustParked(t, st, "acme", "ch-1"); p != nil {
		t.Fatalf("Parked after Unpark = %+v", p)
	}
	if p := mustParked(t, st, "globex", "ch-1"); p == nil {
		t.Fatal("Unpark of acme's challenge dropped globex's")
	}
	if err := st.Unpark(testCtx(t), "acme", "ch-1"); err != nil {
		t.Fatalf("Unpark of nothing: %v", err)
	}
}

// testParkExpiry: an expired parked call is not read, and Purge deletes it (and only it);
// a record is never kept more than MaxParkedFor, whatever its challenge's expiry.
func (s *suite) testParkExpiry(t *testing.T) {
	st := s.newStore(t)
	short := ParkedCall("acme", "ch-short")
	short.Expires = time.Now().Add(shortTTL)
	mustPark(t, st, short)
	mustPark(t, st, ParkedCall("acme", "ch-live"))
	long := ParkedCall("acme", "ch-long")
	long.Expires = time.Now().Add(30 * 24 * time.Hour)
	before := time.Now()
	mustPark(t, st, long)
	time.Sleep(expiryWait)

	if p := mustParked(t, st, "acme", "ch-short"); p != nil {
		t.Fatalf("an expired parked call was read: %+v", p)
	}
	if p := mustParked(t, st, "acme", "ch-long"); p == nil || p.Expires.After(time.Now().Add(executor.MaxParkedFor)) ||
		p.Expires.Before(before.Add(executor.MaxParkedFor).Add(-time.Second)) {
		t.Fatalf("a call parked for 30 days: %+v, want it kept %s", p, executor.MaxParkedFor)
	}
	if n := mustPurge(t, st, executor.PurgePolicy{Now: time.Now(), KeepEvents: TTL}); n != (executor.Purged{Parked: 1}) {
		t.Fatalf("Purge = %+v, want 1 parked call", n)
	}
	if p := mustParked(t, st, "acme", "ch-live"); p == nil {
		t.Fatal("Purge deleted a live parked call")
	}
	if n := mustPurge(t, st, executor.PurgePolicy{Now: time.Now(), KeepEvents: TTL}); n != (executor.Purged{}) {
		t.Fatalf("Purge again = %+v, want nothing", n)
	}
}

// testParkInvalid: a record past MaxParkedBytes is refused with ErrParkedTooLarge, one
// without tenant, challenge or command, or already expired, with ErrParkedInvalid; none of
// them is kept.
func (s *suite) testParkInvalid(t *testing.T) {
	st := s.newStore(t)
	big := ParkedCall("acme", "ch-big")
	big.Arguments = strings.Repeat("x", executor.MaxParkedBytes)
	if err := st.Park(testCtx(t), big); !errors.Is(err, executor.ErrParkedTooLarge) {
		t.Fatalf("Park of %d bytes: %v, want ErrParkedTooLarge", big.Size(), err)
	}
	cases := map[string]func(*executor.Parked){
		"no tenant":    func(p *executor.Parked) { p.Tenant = "" },
		"no challenge": func(p *executor.Parked) { p.ChallengeID = "" },
		"no command":   func(p *executor.Parked) { p.Command = "" },
		"expired":      func(p *executor.Parked) { p.Expires = time.Now().Add(-time.Second) },
		"no expiry":    func(p *executor.Parked) { p.Expires = time.Time{} },
	}
	for name, edit := range cases {
		p := ParkedCall("acme", "ch-bad")
		edit(&p)
		if err := st.Park(testCtx(t), p); !errors.Is(err, executor.ErrParkedInvalid) {
			t.Errorf("Park, %s: %v, want ErrParkedInvalid", name, err)
		}
	}
	for _, c := range []string{"ch-big", "ch-bad"} {
		if p := mustParked(t, st, "acme", c); p != nil {
			t.Fatalf("a refused record was kept: %+v", p)
		}
	}
}
