package helpdesktest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

// Run runs the conformance suite. newStore must return an empty store, independent of the
// stores returned by other calls; closing it is up to newStore (t.Cleanup).
func Run(t *testing.T, newStore func(t *testing.T) helpdesk.Store) {
	s := &suite{newStore: newStore}
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"TicketRoundTrip", s.testTicketRoundTrip},
		{"UpdateTicket", s.testUpdateTicket},
		{"InvalidRecords", s.testInvalidRecords},
		{"SearchFilters", s.testSearchFilters},
		{"SearchPagination", s.testSearchPagination},
		{"Refunds", s.testRefunds},
		{"EraseCustomer", s.testEraseCustomer},
		{"ReportRoundTrip", s.testReportRoundTrip},
		{"TenantIsolation", s.testTenantIsolation},
		{"Sequences", s.testSequences},
		{"IdempotencyKeys", s.testIdempotencyKeys},
		{"Receipts", s.testReceipts},
		{"Rollback", s.testRollback},
		{"PanicRollsBack", s.testPanicRollsBack},
		{"ConcurrentUpdates", s.testConcurrentUpdates},
		{"ConcurrentClaims", s.testConcurrentClaims},
		{"ConcurrentNextID", s.testConcurrentNextID},
		{"Seed", s.testSeed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // every test has its own store
			tt.fn(t)
		})
	}
}

type suite struct {
	newStore func(t *testing.T) helpdesk.Store
}

// Base is the creation time of the records the suite writes.
var Base = time.Date(2026, 2, 1, 10, 0, 0, 0, time.UTC)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Ticket returns a valid open ticket paid 10.00 EUR; tests adjust the fields they care about.
func Ticket(tenant, id string) helpdesk.Ticket {
	return helpdesk.Ticket{
		Tenant: tenant, ID: id, Org: "support", Subject: "Subject of " + id, Status: helpdesk.TicketOpen,
		CustomerEmail: "customer@example.com", Paid: helpdesk.Money{Currency: "EUR", Minor: 1000},
		Tags: []string{"billing"}, CreatedAt: Base,
	}
}

// Report returns a valid draft report with two lines; tests adjust the fields they care about.
func Report(tenant, id, owner string) helpdesk.ExpenseReport {
	km := 12.5
	return helpdesk.ExpenseReport{
		Tenant: tenant, ID: id, Owner: owner, OwnerOrg: "support", Title: "Report " + id,
		State: helpdesk.ReportDraft, PayrollID: "P-0001", Labels: map[string]string{"project": "atlas"},
		Lines: []helpdesk.Line{
			{Description: "Taxi", Amount: helpdesk.Money{Currency: "EUR", Minor: 2500}, Category: helpdesk.CategoryTravel},
			{Description: "Mileage", Amount: helpdesk.Money{Currency: "EUR", Minor: 600}, Category: helpdesk.CategoryTravel, DistanceKm: &km},
		},
		CreatedAt: Base,
	}
}

func refund(tenant, id, ticketID string, minor int64, at time.Time) helpdesk.Refund {
	return helpdesk.Refund{
		Tenant: tenant, ID: id, TicketID: ticketID, Amount: helpdesk.Money{Currency: "EUR", Minor: minor},
		Reason: "Goodwill", Status: helpdesk.RefundAccepted, GatewayRef: "gw-" + id,
		RequestedBy: "carol", AgentID: "finance-bot", InvocationID: "inv-" + id, IssuedAt: at,
	}
}

func inTx(t *testing.T, s helpdesk.Store, fn func(tx helpdesk.Tx) error) {
	t.Helper()
	if err := s.InTx(testCtx(t), fn); err != nil {
		t.Fatalf("InTx: %v", err)
	}
}

func insertTickets(t *testing.T, s helpdesk.Store, ts ...helpdesk.Ticket) {
	t.Helper()
	inTx(t, s, func(tx helpdesk.Tx) error {
		for _, tk := range ts {
			if err := tx.InsertTicket(testCtx(t), tk); err != nil {
				return err
			}
		}
		return nil
	})
}

func mustEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got  %+v\n want %+v", what, got, want)
	}
}

func ids(ts []helpdesk.Ticket) []string {
	out := make([]string, 0, len(ts))
	for _, t := range ts {
		out = append(out, t.ID)
	}
	return out
}

func (s *suite) testTicketRoundTrip(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	full := Ticket("acme", "T-1")
	full.Refunded = helpdesk.Money{Currency: "EUR", Minor: 250}
	full.Tags = []string{"billing", "vip"}
	full.CreatedAt = time.Date(2026, 2, 1, 10, 0, 0, 123456789, time.FixedZone("CET", 3600))
	unpaid := Ticket("acme", "T-2")
	unpaid.Paid, unpaid.Tags = helpdesk.Money{}, nil
	zeroRefund := Ticket("acme", "T-3")
	zeroRefund.Refunded = helpdesk.Money{Currency: "EUR"}
	insertTickets(t, st, full, unpaid, zeroRefund)

	for _, want := range []helpdesk.Ticket{full, unpaid, zeroRefund} {
		got, err := st.Ticket(ctx, "acme", want.ID)
		if err != nil {
			t.Fatal(err)
		}
		mustEqual(t, want.ID, got, want.Normalize())
	}
	if got, _ := st.Ticket(ctx, "acme", "T-1"); got.CreatedAt.Nanosecond() != 123456000 || got.CreatedAt.Location() != time.UTC {
		t.Errorf("created_at = %v, want UTC at microsecond precision", got.CreatedAt)
	}
	if got, _ := st.Ticket(ctx, "acme", "T-3"); !got.Refunded.IsZero() {
		t.Errorf("a zero refund reads back as %+v, want zero Money", got.Refunded)
	}
	if _, err := st.Ticket(ctx, "acme", "T-404"); !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("unknown ticket: err = %v, want ErrNotFound", err)
	}
	err := st.InTx(ctx, func(tx helpdesk.Tx) error { return tx.InsertTicket(ctx, Ticket("acme", "T-1")) })
	if !errors.Is(err, helpdesk.ErrConflict) {
		t.Errorf("duplicate insert: err = %v, want ErrConflict", err)
	}
	// Changing what the caller passed in or got back does not change the store.
	got, _ := st.Ticket(ctx, "acme", "T-1")
	got.Tags[0] = "changed"
	full.Tags[1] = "changed"
	again, _ := st.Ticket(ctx, "acme", "T-1")
	mustEqual(t, "tags after caller mutation", again.Tags, []string{"billing", "vip"})
}

func (s *suite) testUpdateTicket(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	insertTickets(t, st, Ticket("acme", "T-1"))
	var locked helpdesk.Ticket
	inTx(t, st, func(tx helpdesk.Tx) error {
		tk, err := tx.TicketForUpdate(ctx, "acme", "T-1")
		if err != nil {
			return err
		}
		tk.Status, tk.Subject, tk.Org = helpdesk.TicketPending, "New subject", "finance"
		tk.Refunded = helpdesk.Money{Currency: "EUR", Minor: 400}
		tk.Tags = []string{"escalated"}
		locked = tk
		return tx.UpdateTicket(ctx, tk)
	})
	got, err := st.Ticket(ctx, "acme", "T-1")
	if err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "updated ticket", got, locked.Normalize())

	err = st.InTx(ctx, func(tx helpdesk.Tx) error { return tx.UpdateTicket(ctx, Ticket("acme", "T-404")) })
	if !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("update of an unknown ticket: err = %v, want ErrNotFound", err)
	}
	err = st.InTx(ctx, func(tx helpdesk.Tx) error {
		_, err := tx.TicketForUpdate(ctx, "acme", "T-404")
		return err
	})
	if !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("TicketForUpdate of an unknown ticket: err = %v, want ErrNotFound", err)
	}
}

func (s *suite) testInvalidRecords(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	insertTickets(t, st, Ticket("acme", "T-1"))
	overRefunded := Ticket("acme", "T-1")
	overRefunded.Refunded = helpdesk.Money{Currency: "EUR", Minor: 1001}
	otherCurrency := Ticket("acme", "T-1")
	otherCurrency.Refunded = helpdesk.Money{Currency: "USD", Minor: 1}
	badStatus := Ticket("acme", "T-2")
	badStatus.Status = "lost"
	mixed := Report("acme", "ER-1", "alice")
	mixed.Lines[1].Amount.Currency = "USD"
	noOwner := Report("acme", "ER-2", "")
	zeroRefund := refund("acme", "RF-1", "T-1", 0, Base)
	tests := []struct {
		name string
		fn   func(tx helpdesk.Tx) error
	}{
		{"refunded more than paid", func(tx helpdesk.Tx) error { return tx.UpdateTicket(ctx, overRefunded) }},
		{"refunded in another currency", func(tx helpdesk.Tx) error { return tx.UpdateTicket(ctx, otherCurrency) }},
		{"unknown status", func(tx helpdesk.Tx) error { return tx.InsertTicket(ctx, badStatus) }},
		{"mixed currencies", func(tx helpdesk.Tx) error { return tx.InsertReport(ctx, mixed) }},
		{"report without owner", func(tx helpdesk.Tx) error { return tx.InsertReport(ctx, noOwner) }},
		{"refund of nothing", func(tx helpdesk.Tx) error { return tx.InsertRefund(ctx, zeroRefund) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := st.InTx(ctx, tt.fn); !errors.Is(err, helpdesk.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
	got, _ := st.Ticket(ctx, "acme", "T-1")
	mustEqual(t, "ticket after refused updates", got, Ticket("acme", "T-1").Normalize())
}

func (s *suite) testSearchFilters(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	mk := func(id, subject string, status helpdesk.TicketStatus, email string, tags []string, day int) helpdesk.Ticket {
		tk := Ticket("acme", id)
		tk.Subject, tk.Status, tk.CustomerEmail, tk.Tags = subject, status, email, tags
		tk.CreatedAt = Base.AddDate(0, 0, day)
		return tk
	}
	insertTickets(t, st,
		mk("T-1", "Customer CHARGED twice", helpdesk.TicketOpen, "jane@example.com", []string{"billing", "double-charge"}, 1),
		mk("T-2", "Password reset", helpdesk.TicketPending, "li@example.com", []string{"account"}, 2),
		mk("T-3", "charged twice again", helpdesk.TicketClosed, "Jane@Example.com", []string{"billing"}, 3),
		mk("T-4", "100% off coupon_code", helpdesk.TicketOpen, "li@example.com", nil, 4),
	)
	other := mk("T-5", "charged twice", helpdesk.TicketOpen, "jane@example.com", []string{"billing"}, 5)
	other.Tenant = "globex"
	insertTickets(t, st, other)

	tests := []struct {
		name string
		f    helpdesk.TicketFilter
		want []string
	}{
		{"everything, newest first", helpdesk.TicketFilter{}, []string{"T-4", "T-3", "T-2", "T-1"}},
		{"query is a case-insensitive substring", helpdesk.TicketFilter{Query: "Charged Twice"}, []string{"T-3", "T-1"}},
		{"query has no wildcards", helpdesk.TicketFilter{Query: "100%"}, []string{"T-4"}},
		{"underscore is literal", helpdesk.TicketFilter{Query: "ch_rged"}, nil},
		{"status", helpdesk.TicketFilter{Statuses: []helpdesk.TicketStatus{helpdesk.TicketOpen}}, []string{"T-4", "T-1"}},
		{"statuses", helpdesk.TicketFilter{Statuses: []helpdesk.TicketStatus{helpdesk.TicketPending, helpdesk.TicketClosed}}, []string{"T-3", "T-2"}},
		{"query and status", helpdesk.TicketFilter{Query: "charged twice", Statuses: []helpdesk.TicketStatus{helpdesk.TicketOpen}}, []string{"T-1"}},
		{"email ignores case", helpdesk.TicketFilter{CustomerEmail: "JANE@example.com"}, []string{"T-3", "T-1"}},
		{"one tag", helpdesk.TicketFilter{Tags: []string{"billing"}}, []string{"T-3", "T-1"}},
		{"all tags", helpdesk.TicketFilter{Tags: []string{"billing", "double-charge"}}, []string{"T-1"}},
		{"tag nobody has", helpdesk.TicketFilter{Tags: []string{"billing", "nope"}}, nil},
		{"created at or after", helpdesk.TicketFilter{CreatedAfter: Base.AddDate(0, 0, 3)}, []string{"T-4", "T-3"}},
		{"no match", helpdesk.TicketFilter{Query: "refund"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := st.SearchTickets(ctx, "acme", tt.f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ids(got), tt.want) {
				t.Fatalf("ids = %v, want %v", ids(got), tt.want)
			}
		})
	}
	got, err := st.SearchTickets(ctx, "acme", helpdesk.TicketFilter{}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := st.Ticket(ctx, "acme", "T-1")
	mustEqual(t, "searched ticket", got[3], want)
}

func (s *suite) testSearchPagination(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	var all []helpdesk.Ticket
	for i := range 11 {
		tk := Ticket("acme", fmt.Sprintf("T-%d", 1000+i))
		tk.CreatedAt = Base.Add(time.Duration(i/3) * time.Hour) // three tickets share each instant
		all = append(all, tk)
	}
	insertTickets(t, st, all...)
	var want []string
	for i := len(all) - 1; i >= 0; i-- {
		want = append(want, all[i].ID)
	}
	var got []string
	var after *helpdesk.TicketCursor
	for page := 0; ; page++ {
		if page > 10 {
			t.Fatal("pagination does not end")
		}
		ts, err := st.SearchTickets(ctx, "acme", helpdesk.TicketFilter{}, after, 4)
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) > 4 {
			t.Fatalf("page of %d, limit 4", len(ts))
		}
		got = append(got, ids(ts)...)
		if len(ts) < 4 {
			break
		}
		last := ts[len(ts)-1]
		after = &helpdesk.TicketCursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages = %v, want %v", got, want)
	}
}

func (s *suite) testRefunds(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	insertTickets(t, st, Ticket("acme", "T-1"), Ticket("acme", "T-2"))
	r1 := refund("acme", "RF-2", "T-1", 300, Base.Add(time.Minute))
	r2 := refund("acme", "RF-1", "T-1", 200, Base.Add(2*time.Minute))
	r3 := refund("acme", "RF-3", "T-2", 100, Base)
	inTx(t, st, func(tx helpdesk.Tx) error {
		return errors.Join(tx.InsertRefund(ctx, r1), tx.InsertRefund(ctx, r2), tx.InsertRefund(ctx, r3))
	})
	got, err := st.Refund(ctx, "acme", "RF-2")
	if err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "refund", got, r1.Normalize())
	list, err := st.Refunds(ctx, "acme", "T-1")
	if err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "refunds of T-1, oldest first", list, []helpdesk.Refund{r1.Normalize(), r2.Normalize()})
	if _, err := st.Refund(ctx, "acme", "RF-404"); !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("unknown refund: err = %v, want ErrNotFound", err)
	}
	err = st.InTx(ctx, func(tx helpdesk.Tx) error { return tx.InsertRefund(ctx, r1) })
	if !errors.Is(err, helpdesk.ErrConflict) {
		t.Errorf("duplicate refund: err = %v, want ErrConflict", err)
	}
	err = st.InTx(ctx, func(tx helpdesk.Tx) error { return tx.InsertRefund(ctx, refund("acme", "RF-9", "T-404", 1, Base)) })
	if !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("refund of an unknown ticket: err = %v, want ErrNotFound", err)
	}
}

func (s *suite) testEraseCustomer(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	mk := func(tenant, id, email string) helpdesk.Ticket {
		tk := Ticket(tenant, id)
		tk.CustomerEmail = email
		return tk
	}
	insertTickets(t, st, mk("acme", "T-1", "Jane.Doe@Example.com"), mk("acme", "T-2", "jane.doe@example.com"),
		mk("acme", "T-3", "li.wei@example.com"), mk("globex", "T-1", "jane.doe@example.com"))
	erasure := helpdesk.Erasure{
		Tenant: "acme", ID: "CE-4001", Reason: "Deletion request DR-1", RequestedBy: "carol", AgentID: "finance-bot",
		InvocationID: "inv-erase", ErasedAt: time.Date(2026, 2, 2, 10, 0, 0, 123456789, time.UTC),
	}

	// A rolled-back erasure changes nothing.
	err := st.InTx(ctx, func(tx helpdesk.Tx) error {
		if _, err := tx.EraseCustomer(ctx, "acme", "jane.doe@example.com", erasure.Tombstone()); err != nil {
			return err
		}
		return errAbort
	})
	if !errors.Is(err, errAbort) {
		t.Fatalf("InTx returned %v, want the callback's error", err)
	}
	if got, _ := st.Ticket(ctx, "acme", "T-1"); got.CustomerEmail != "Jane.Doe@Example.com" {
		t.Fatalf("rolled-back erasure is visible: %q", got.CustomerEmail)
	}

	inTx(t, st, func(tx helpdesk.Tx) error {
		n, err := tx.EraseCustomer(ctx, "acme", "JANE.DOE@example.com", erasure.Tombstone())
		if err != nil {
			return err
		}
		if n != 2 {
			t.Errorf("erased %d tickets, want 2 (the email compared case-insensitively, in acme only)", n)
		}
		erasure.TicketsErased = n
		return tx.InsertErasure(ctx, erasure)
	})
	for _, want := range []helpdesk.Ticket{
		mk("acme", "T-1", "erased:CE-4001"), mk("acme", "T-2", "erased:CE-4001"),
		mk("acme", "T-3", "li.wei@example.com"), mk("globex", "T-1", "jane.doe@example.com"),
	} {
		got, err := st.Ticket(ctx, want.Tenant, want.ID)
		if err != nil {
			t.Fatal(err)
		}
		mustEqual(t, want.Tenant+"/"+want.ID, got, want.Normalize())
	}
	found, err := st.SearchTickets(ctx, "acme", helpdesk.TicketFilter{CustomerEmail: "jane.doe@example.com"}, nil, 10)
	if err != nil || len(found) != 0 {
		t.Errorf("search for the erased email: %v %v, want nothing", ids(found), err)
	}
	got, err := st.Erasure(ctx, "acme", "CE-4001")
	if err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "erasure", got, erasure.Normalize())
	if _, err := st.Erasure(ctx, "globex", "CE-4001"); !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("another tenant's erasure: err = %v, want ErrNotFound", err)
	}

	// Erasing again finds nothing left.
	inTx(t, st, func(tx helpdesk.Tx) error {
		n, err := tx.EraseCustomer(ctx, "acme", "jane.doe@example.com", "erased:CE-4002")
		if err == nil && n != 0 {
			t.Errorf("a repeated erasure changed %d tickets, want 0", n)
		}
		return err
	})
	err = st.InTx(ctx, func(tx helpdesk.Tx) error { return tx.InsertErasure(ctx, erasure) })
	if !errors.Is(err, helpdesk.ErrConflict) {
		t.Errorf("duplicate erasure: err = %v, want ErrConflict", err)
	}
	for name, fn := range map[string]func(tx helpdesk.Tx) error{
		"empty email": func(tx helpdesk.Tx) error {
			_, err := tx.EraseCustomer(ctx, "acme", "", "erased:CE-9")
			return err
		},
		"empty tombstone": func(tx helpdesk.Tx) error {
			_, err := tx.EraseCustomer(ctx, "acme", "li.wei@example.com", "")
			return err
		},
		"erasure without time": func(tx helpdesk.Tx) error {
			return tx.InsertErasure(ctx, helpdesk.Erasure{Tenant: "acme", ID: "CE-9"})
		},
	} {
		if err := st.InTx(ctx, fn); !errors.Is(err, helpdesk.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	if got, _ := st.Ticket(ctx, "acme", "T-3"); got.CustomerEmail != "li.wei@example.com" {
		t.Errorf("a refused erasure changed T-3: %q", got.CustomerEmail)
	}
}

func (s *suite) testReportRoundTrip(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	full := Report("acme", "ER-1", "alice")
	bare := Report("acme", "ER-2", "alice")
	bare.Labels, bare.PayrollID, bare.BankAccountAlias, bare.OwnerOrg = nil, "", "alice-main", ""
	inTx(t, st, func(tx helpdesk.Tx) error {
		return errors.Join(tx.InsertReport(ctx, full), tx.InsertReport(ctx, bare))
	})
	for _, want := range []helpdesk.ExpenseReport{full, bare} {
		got, err := st.Report(ctx, "acme", want.ID)
		if err != nil {
			t.Fatal(err)
		}
		mustEqual(t, want.ID, got, want.Normalize())
	}
	if got, _ := st.Report(ctx, "acme", "ER-2"); got.Labels != nil {
		t.Errorf("no labels read back as %#v, want nil", got.Labels)
	}

	var updated helpdesk.ExpenseReport
	inTx(t, st, func(tx helpdesk.Tx) error {
		r, err := tx.ReportForUpdate(ctx, "acme", "ER-1")
		if err != nil {
			return err
		}
		r.State, r.SubmittedBy, r.SubmittedAt, r.SubmitNote = helpdesk.ReportSubmitted, "alice", Base.Add(time.Hour), "note"
		r.ApprovedBy, r.ApprovedAt, r.ApprovalComment = "bob", Base.Add(2*time.Hour), "ok"
		r.RecallReason, r.Title = "typo", "Renamed"
		r.Labels["cost_center"] = "42"
		updated = r
		return tx.UpdateReport(ctx, r)
	})
	got, err := st.Report(ctx, "acme", "ER-1")
	if err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "updated report", got, updated.Normalize())

	moved := Report("acme", "ER-2", "mallory")
	moved.OwnerOrg, moved.CreatedAt = "finance", Base.Add(time.Hour)
	inTx(t, st, func(tx helpdesk.Tx) error { return tx.UpdateReport(ctx, moved) })
	got, _ = st.Report(ctx, "acme", "ER-2")
	if got.Owner != "alice" || got.OwnerOrg != "" || !got.CreatedAt.Equal(Base) {
		t.Errorf("UpdateReport changed owner, org or creation time: %+v", got)
	}

	if _, err := st.Report(ctx, "acme", "ER-404"); !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("unknown report: err = %v, want ErrNotFound", err)
	}
	err = st.InTx(ctx, func(tx helpdesk.Tx) error { return tx.UpdateReport(ctx, Report("acme", "ER-404", "alice")) })
	if !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("update of an unknown report: err = %v, want ErrNotFound", err)
	}
	err = st.InTx(ctx, func(tx helpdesk.Tx) error { return tx.InsertReport(ctx, full) })
	if !errors.Is(err, helpdesk.ErrConflict) {
		t.Errorf("duplicate report: err = %v, want ErrConflict", err)
	}
}

func (s *suite) testTenantIsolation(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	acme, globex := Ticket("acme", "T-1"), Ticket("globex", "T-1")
	globex.Subject, globex.Paid = "Globex's own", helpdesk.Money{Currency: "USD", Minor: 5}
	insertTickets(t, st, acme, globex)
	inTx(t, st, func(tx helpdesk.Tx) error {
		return errors.Join(
			tx.InsertRefund(ctx, refund("acme", "RF-1", "T-1", 100, Base)),
			tx.InsertReport(ctx, Report("acme", "ER-1", "alice")),
		)
	})
	got, err := st.Ticket(ctx, "globex", "T-1")
	if err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "globex's T-1", got, globex.Normalize())
	if list, _ := st.SearchTickets(ctx, "globex", helpdesk.TicketFilter{}, nil, 0); len(list) != 1 || list[0].Subject != "Globex's own" {
		t.Errorf("globex search = %+v", list)
	}
	if list, _ := st.SearchTickets(ctx, "initech", helpdesk.TicketFilter{}, nil, 0); len(list) != 0 {
		t.Errorf("a tenant without tickets found %v", ids(list))
	}
	if _, err := st.Refund(ctx, "globex", "RF-1"); !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("globex reads acme's refund: err = %v", err)
	}
	if list, _ := st.Refunds(ctx, "globex", "T-1"); len(list) != 0 {
		t.Errorf("globex lists acme's refunds: %+v", list)
	}
	if _, err := st.Report(ctx, "globex", "ER-1"); !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("globex reads acme's report: err = %v", err)
	}
	err = st.InTx(ctx, func(tx helpdesk.Tx) error {
		_, err := tx.ReportForUpdate(ctx, "globex", "ER-1")
		return err
	})
	if !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("globex locks acme's report: err = %v", err)
	}
	err = st.InTx(ctx, func(tx helpdesk.Tx) error { return tx.UpdateReport(ctx, Report("globex", "ER-1", "alice")) })
	if !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("globex updates acme's report: err = %v", err)
	}
}

func (s *suite) testSequences(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	var got []int64
	inTx(t, st, func(tx helpdesk.Tx) error {
		for _, c := range []struct {
			tenant string
			seq    helpdesk.Sequence
			floor  int64
		}{
			{"acme", helpdesk.SeqTicket, 1000},
			{"acme", helpdesk.SeqTicket, 1000},
			{"acme", helpdesk.SeqReport, 2000},
			{"globex", helpdesk.SeqTicket, 1000},
			{"globex", helpdesk.SeqTicket, 2000}, // a higher floor jumps ahead
			{"globex", helpdesk.SeqTicket, 1000}, // a lower one does not go back
		} {
			n, err := tx.NextID(ctx, c.tenant, c.seq, c.floor)
			if err != nil {
				return err
			}
			got = append(got, n)
		}
		return nil
	})
	mustEqual(t, "ids", got, []int64{1001, 1002, 2001, 1001, 2001, 2002})
	// Committed counters survive the transaction.
	inTx(t, st, func(tx helpdesk.Tx) error {
		n, err := tx.NextID(ctx, "acme", helpdesk.SeqTicket, 1000)
		if err == nil && n != 1003 {
			t.Errorf("after commit: %d, want 1003", n)
		}
		return err
	})
}

func (s *suite) testIdempotencyKeys(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	k := helpdesk.IdempotencyKey{Tenant: "acme", UserID: "alice", Command: "expense.report.create", Key: "k1"}
	inTx(t, st, func(tx helpdesk.Tx) error {
		c, err := tx.ClaimKey(ctx, k, "d1")
		if err != nil {
			return err
		}
		mustEqual(t, "first claim", c, helpdesk.Claim{New: true, Digest: "d1"})
		return tx.CompleteKey(ctx, k, "ER-1")
	})
	inTx(t, st, func(tx helpdesk.Tx) error {
		c, err := tx.ClaimKey(ctx, k, "d2")
		if err != nil {
			return err
		}
		mustEqual(t, "second claim", c, helpdesk.Claim{Digest: "d1", ResultID: "ER-1"})
		for _, other := range []helpdesk.IdempotencyKey{
			{Tenant: "globex", UserID: "alice", Command: k.Command, Key: "k1"},
			{Tenant: "acme", UserID: "bob", Command: k.Command, Key: "k1"},
			{Tenant: "acme", UserID: "alice", Command: "ticket.refund", Key: "k1"},
		} {
			c, err := tx.ClaimKey(ctx, other, "d3")
			if err != nil {
				return err
			}
			if !c.New {
				t.Errorf("%+v: claim = %+v, want a new claim: keys are scoped by tenant, user and command", other, c)
			}
		}
		return nil
	})
	err := st.InTx(ctx, func(tx helpdesk.Tx) error {
		return tx.CompleteKey(ctx, helpdesk.IdempotencyKey{Tenant: "acme", UserID: "alice", Command: k.Command, Key: "unclaimed"}, "ER-9")
	})
	if !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("completing an unclaimed key: err = %v, want ErrNotFound", err)
	}
}

var errAbort = errors.New("abort")

// testReceipts: receipts commit and roll back with the transaction's effects, and a fenced or
// executed invocation refuses a second receipt (pkg/receipt holds the stores to the rest).
func (s *suite) testReceipts(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	insertTickets(t, st, Ticket("acme", "T-1"))
	executed := receipt.Receipt{InvocationID: "inv-1", State: receipt.Executed, Method: "/h.v1.H/Refund", Result: []byte{10, 1, 'x'}, RecordedAt: Base}
	err := st.InTx(ctx, func(tx helpdesk.Tx) error {
		if err := tx.InsertRefund(ctx, refund("acme", "RF-1", "T-1", 500, Base)); err != nil {
			return err
		}
		if err := tx.RecordReceipt(ctx, executed); err != nil {
			return err
		}
		return errAbort
	})
	if !errors.Is(err, errAbort) {
		t.Fatalf("InTx returned %v, want the callback's error", err)
	}
	inTx(t, st, func(tx helpdesk.Tx) error {
		if r, found, err := tx.Receipt(ctx, "inv-1"); err != nil || found {
			t.Errorf("rolled-back receipt: %+v, %v, %v", r, found, err)
		}
		return nil
	})
	if list, _ := st.Refunds(ctx, "acme", "T-1"); len(list) != 0 {
		t.Errorf("rolled-back refund row is visible: %+v", list)
	}

	inTx(t, st, func(tx helpdesk.Tx) error {
		if err := tx.InsertRefund(ctx, refund("acme", "RF-1", "T-1", 500, Base)); err != nil {
			return err
		}
		return tx.RecordReceipt(ctx, executed)
	})
	inTx(t, st, func(tx helpdesk.Tx) error {
		r, found, err := tx.Receipt(ctx, "inv-1")
		if err != nil || !found || r.State != receipt.Executed || r.Method != executed.Method || string(r.Result) != string(executed.Result) || !r.RecordedAt.Equal(Base) {
			t.Errorf("receipt = %+v, %v, %v; want %+v", r, found, err, executed)
		}
		return nil
	})
	if err := st.InTx(ctx, func(tx helpdesk.Tx) error { return tx.RecordReceipt(ctx, executed) }); !errors.Is(err, receipt.ErrExecuted) {
		t.Errorf("second receipt: err = %v, want receipt.ErrExecuted", err)
	}
	fence := receipt.Receipt{InvocationID: "inv-2", State: receipt.NotExecuted, RecordedAt: Base}
	inTx(t, st, func(tx helpdesk.Tx) error { return tx.RecordReceipt(ctx, fence) })
	late := executed
	late.InvocationID = "inv-2"
	if err := st.InTx(ctx, func(tx helpdesk.Tx) error { return tx.RecordReceipt(ctx, late) }); !errors.Is(err, receipt.ErrFenced) {
		t.Errorf("receipt of a fenced invocation: err = %v, want receipt.ErrFenced", err)
	}
	if err := st.InTx(ctx, func(tx helpdesk.Tx) error { return tx.RecordReceipt(ctx, receipt.Receipt{State: receipt.Executed}) }); !errors.Is(err, receipt.ErrInvalid) {
		t.Errorf("malformed receipt: err = %v, want receipt.ErrInvalid", err)
	}
}

func (s *suite) testRollback(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	insertTickets(t, st, Ticket("acme", "T-1"))
	inTx(t, st, func(tx helpdesk.Tx) error { return tx.InsertReport(ctx, Report("acme", "ER-1", "alice")) })
	k := helpdesk.IdempotencyKey{Tenant: "acme", UserID: "alice", Command: "c", Key: "k"}
	err := st.InTx(ctx, func(tx helpdesk.Tx) error {
		tk, _ := tx.TicketForUpdate(ctx, "acme", "T-1")
		tk.Refunded = helpdesk.Money{Currency: "EUR", Minor: 500}
		r, _ := tx.ReportForUpdate(ctx, "acme", "ER-1")
		r.State = helpdesk.ReportApproved
		_, nerr := tx.NextID(ctx, "acme", helpdesk.SeqRefund, 3000)
		_, cerr := tx.ClaimKey(ctx, k, "d")
		if err := errors.Join(
			tx.UpdateTicket(ctx, tk), tx.InsertRefund(ctx, refund("acme", "RF-1", "T-1", 500, Base)),
			tx.UpdateReport(ctx, r), tx.InsertTicket(ctx, Ticket("acme", "T-2")), nerr, cerr,
		); err != nil {
			return err
		}
		return fmt.Errorf("wrapped: %w", errAbort)
	})
	if !errors.Is(err, errAbort) {
		t.Fatalf("InTx returned %v, want the callback's error", err)
	}
	if tk, _ := st.Ticket(ctx, "acme", "T-1"); !tk.Refunded.IsZero() {
		t.Errorf("rolled-back refund was booked: %+v", tk.Refunded)
	}
	if _, err := st.Ticket(ctx, "acme", "T-2"); !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("rolled-back insert is visible: %v", err)
	}
	if list, _ := st.Refunds(ctx, "acme", "T-1"); len(list) != 0 {
		t.Errorf("rolled-back refund row is visible: %+v", list)
	}
	if r, _ := st.Report(ctx, "acme", "ER-1"); r.State != helpdesk.ReportDraft {
		t.Errorf("rolled-back transition is visible: %s", r.State)
	}
	inTx(t, st, func(tx helpdesk.Tx) error {
		n, err := tx.NextID(ctx, "acme", helpdesk.SeqRefund, 3000)
		if err == nil && n != 3001 {
			t.Errorf("sequence after rollback = %d, want 3001", n)
		}
		c, cerr := tx.ClaimKey(ctx, k, "d")
		if cerr == nil && !c.New {
			t.Errorf("a rolled-back claim is still held: %+v", c)
		}
		return errors.Join(err, cerr)
	})
}

func (s *suite) testPanicRollsBack(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the callback's panic was swallowed")
			}
		}()
		_ = st.InTx(ctx, func(tx helpdesk.Tx) error {
			if err := tx.InsertTicket(ctx, Ticket("acme", "T-1")); err != nil {
				return err
			}
			panic("boom")
		})
	}()
	if _, err := st.Ticket(ctx, "acme", "T-1"); !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("insert of a panicking transaction is visible: %v", err)
	}
	insertTickets(t, st, Ticket("acme", "T-1")) // the store is still usable
}

// testConcurrentUpdates checks that TicketForUpdate serialises read-modify-write
// transactions: no increment is lost.
func (s *suite) testConcurrentUpdates(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	insertTickets(t, st, Ticket("acme", "T-1"))
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			errs <- st.InTx(ctx, func(tx helpdesk.Tx) error {
				tk, err := tx.TicketForUpdate(ctx, "acme", "T-1")
				if err != nil {
					return err
				}
				time.Sleep(time.Millisecond) // widen the window a lost update needs
				tk.Refunded = helpdesk.Money{Currency: "EUR", Minor: tk.Refunded.Minor + 10}
				return tx.UpdateTicket(ctx, tk)
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	tk, _ := st.Ticket(ctx, "acme", "T-1")
	if tk.Refunded.Minor != n*10 {
		t.Fatalf("refunded = %d after %d increments of 10: updates were lost", tk.Refunded.Minor, n)
	}
}

// testConcurrentClaims checks that one key is claimed exactly once and that the losers see the
// winner's result.
func (s *suite) testConcurrentClaims(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	k := helpdesk.IdempotencyKey{Tenant: "acme", UserID: "alice", Command: "expense.report.create", Key: "race"}
	const n = 12
	var mu sync.Mutex
	var winners []string
	seen := map[string]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			err := st.InTx(ctx, func(tx helpdesk.Tx) error {
				c, err := tx.ClaimKey(ctx, k, "d")
				if err != nil {
					return err
				}
				id := fmt.Sprintf("ER-%d", i)
				if c.New {
					time.Sleep(5 * time.Millisecond) // hold the claim while others arrive
					mu.Lock()
					winners = append(winners, id)
					mu.Unlock()
					return tx.CompleteKey(ctx, k, id)
				}
				mu.Lock()
				seen[c.ResultID]++
				mu.Unlock()
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if len(winners) != 1 {
		t.Fatalf("%d transactions claimed the key: %v", len(winners), winners)
	}
	mustEqual(t, "results seen by the others", seen, map[string]int{winners[0]: n - 1})
}

func (s *suite) testConcurrentNextID(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	const n = 25
	got := make(chan int64, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			err := st.InTx(ctx, func(tx helpdesk.Tx) error {
				id, err := tx.NextID(ctx, "acme", helpdesk.SeqReport, 2000)
				got <- id
				return err
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	close(got)
	var all []int64
	for id := range got {
		all = append(all, id)
	}
	slices.Sort(all)
	for i, id := range all {
		if id != int64(2001+i) {
			t.Fatalf("ids = %v, want 2001…%d without gaps or duplicates", all, 2000+n)
		}
	}
}

func (s *suite) testSeed(t *testing.T) {
	st, ctx := s.newStore(t), testCtx(t)
	if err := helpdesk.Seed(ctx, st); err != nil {
		t.Fatal(err)
	}
	if err := helpdesk.Seed(ctx, st); err != nil {
		t.Fatalf("seeding twice: %v", err)
	}
	acme, err := st.SearchTickets(ctx, "acme", helpdesk.TicketFilter{}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "acme tickets", ids(acme), []string{"T-1002", "T-1001", "T-1003"})
	globex, _ := st.SearchTickets(ctx, "globex", helpdesk.TicketFilter{}, nil, 0)
	mustEqual(t, "globex tickets", ids(globex), []string{"T-2001", "T-1001"})
	t1001, _ := st.Ticket(ctx, "acme", "T-1001")
	if t1001.Paid != (helpdesk.Money{Currency: "EUR", Minor: 4990}) || t1001.Status != helpdesk.TicketOpen || t1001.Org != "support" {
		t.Errorf("acme T-1001 = %+v", t1001)
	}
	for id, want := range map[string]helpdesk.ReportState{"ER-2001": helpdesk.ReportDraft, "ER-2002": helpdesk.ReportSubmitted, "ER-2003": helpdesk.ReportSubmitted} {
		r, err := st.Report(ctx, "acme", id)
		if err != nil || r.State != want || r.Owner != "alice" {
			t.Errorf("%s = %+v, %v; want alice's, %s", id, r, err, want)
		}
	}
	// Ids continue after the seeded ones.
	inTx(t, st, func(tx helpdesk.Tx) error {
		r, rerr := tx.NextID(ctx, "acme", helpdesk.SeqReport, 2000)
		tk, terr := tx.NextID(ctx, "globex", helpdesk.SeqTicket, 1000)
		if r != 2004 || tk != 2002 {
			t.Errorf("next ids = ER-%d, globex T-%d; want ER-2004, T-2002", r, tk)
		}
		return errors.Join(rerr, terr)
	})

	dirty := s.newStore(t)
	inTx(t, dirty, func(tx helpdesk.Tx) error {
		_, err := tx.NextID(ctx, "acme", helpdesk.SeqTicket, 1000)
		return err
	})
	if err := helpdesk.Seed(ctx, dirty); err == nil {
		t.Error("seeding a store whose sequences moved on succeeded")
	}
	if _, err := dirty.Ticket(ctx, "globex", "T-1001"); !errors.Is(err, helpdesk.ErrNotFound) {
		t.Errorf("a failed seed left data behind: %v", err)
	}
}
