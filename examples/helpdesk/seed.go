package helpdesk

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// SeedUser is a user the seed data refers to. The backend keeps no users — callers come with
// tokens — so these are what tests and `mandate dev` mint tokens for; they match
// examples/policy/demo.yaml.
type SeedUser struct {
	Tenant string
	ID     string
	Org    string
	// Manager is true for users who approve their org's expense reports.
	Manager bool
}

// SeedUsers are the users of the seed data.
var SeedUsers = []SeedUser{
	{Tenant: "acme", ID: "alice", Org: "support"},
	{Tenant: "acme", ID: "bob", Org: "support", Manager: true},
	{Tenant: "acme", ID: "carol", Org: "finance"},
	{Tenant: "globex", ID: "dave", Org: "support"},
}

// SeedTime is the instant the seed data is dated from; seeded records are a few days older.
var SeedTime = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

func seedDay(days int, hour int) time.Time {
	return SeedTime.AddDate(0, 0, -days).Add(time.Duration(hour) * time.Hour)
}

func eur(minor int64) Money { return Money{Currency: "EUR", Minor: minor} }
func usd(minor int64) Money { return Money{Currency: "USD", Minor: minor} }

// seedTickets are inserted in order; each tenant's ids come from its ticket sequence, and the
// floor jumps to T-2001 where the data says so.
var seedTickets = []struct {
	floor int64
	t     Ticket
}{
	{ticketFloor, Ticket{
		Tenant: "acme", ID: "T-1001", Org: "support", Status: TicketOpen,
		Subject:       "Customer charged twice for order 4471",
		CustomerEmail: "jane.doe@example.com", Paid: eur(4990),
		Tags: []string{"billing", "double-charge"}, CreatedAt: seedDay(6, 1),
	}},
	{ticketFloor, Ticket{
		Tenant: "acme", ID: "T-1002", Org: "support", Status: TicketPending,
		Subject:       "Cannot reset my password",
		CustomerEmail: "li.wei@example.com",
		Tags:          []string{"account"}, CreatedAt: seedDay(4, 2),
	}},
	{ticketFloor, Ticket{
		Tenant: "acme", ID: "T-1003", Org: "support", Status: TicketClosed,
		Subject:       "Charged twice after the plan upgrade",
		CustomerEmail: "jane.doe@example.com", Paid: eur(1990), Refunded: eur(1990),
		Tags: []string{"billing"}, CreatedAt: seedDay(20, 3),
	}},
	{ticketFloor, Ticket{
		Tenant: "globex", ID: "T-1001", Org: "support", Status: TicketOpen,
		Subject:       "Shipment arrived damaged",
		CustomerEmail: "purchasing@initech.example", Paid: usd(12500),
		Tags: []string{"shipping"}, CreatedAt: seedDay(3, 4),
	}},
	{2000, Ticket{
		Tenant: "globex", ID: "T-2001", Org: "support", Status: TicketOpen,
		Subject:       "Charged twice for invoice 88",
		CustomerEmail: "accounts@initech.example", Paid: usd(3000),
		Tags: []string{"billing", "double-charge"}, CreatedAt: seedDay(2, 5),
	}},
}

func seedReports() []ExpenseReport {
	return []ExpenseReport{
		{
			Tenant: "acme", ID: "ER-2001", Owner: "alice", OwnerOrg: "support", State: ReportDraft,
			Title: "Team offsite Paris", PayrollID: "P-0042", Labels: map[string]string{"project": "atlas"},
			Lines: []Line{
				{Description: "Train Lyon-Paris", Amount: eur(5600), Category: CategoryTravel},
				{Description: "Hotel, one night", Amount: eur(11000), Category: CategoryLodging},
			},
			CreatedAt: seedDay(5, 1),
		},
		{
			Tenant: "acme", ID: "ER-2002", Owner: "alice", OwnerOrg: "support", State: ReportSubmitted,
			Title: "Conference Berlin", PayrollID: "P-0042",
			Lines: []Line{
				{Description: "Flight Paris-Berlin", Amount: eur(23000), Category: CategoryTravel},
				{Description: "Hotel, two nights", Amount: eur(45000), Category: CategoryLodging},
			},
			SubmittedBy: "alice", SubmittedAt: seedDay(3, 2), SubmitNote: "Receipts attached",
			CreatedAt: seedDay(4, 1),
		},
		{
			Tenant: "acme", ID: "ER-2003", Owner: "alice", OwnerOrg: "support", State: ReportSubmitted,
			Title: "Client dinner Madrid", BankAccountAlias: "alice-main",
			Lines: []Line{
				{Description: "Dinner with the Initech team", Amount: eur(8650), Category: CategoryMeals},
			},
			SubmittedBy: "alice", SubmittedAt: seedDay(1, 3), SubmitNote: "For bob's approval",
			CreatedAt: seedDay(2, 1),
		},
	}
}

// Seed loads the demo data into s, in one transaction:
//
//   - acme: tickets T-1001 (open, paid 49.90 EUR, "Customer charged twice…", org support),
//     T-1002 (pending, nothing paid) and T-1003 (closed, 19.90 EUR paid and refunded);
//     expense reports of alice ER-2001 (draft), ER-2002 (submitted) and ER-2003 (submitted,
//     for bob to approve).
//   - globex: tickets T-1001 (same id as acme's, other content, paid 125.00 USD) and T-2001.
//
// Every example declared in proto/examples/helpdesk/v1 runs as written against this data, as
// the right user of SeedUsers. Seeding a store that holds the data already does nothing;
// seeding a store whose sequences have moved on without it fails.
func Seed(ctx context.Context, s Store) error {
	if _, err := s.Ticket(ctx, "acme", "T-1001"); err == nil {
		return nil
	} else if !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("helpdesk: seed: %w", err)
	}
	return s.InTx(ctx, func(tx Tx) error {
		for _, st := range seedTickets {
			if err := seedID(ctx, tx, st.t.Tenant, SeqTicket, st.floor, "T-%d", st.t.ID); err != nil {
				return err
			}
			if err := tx.InsertTicket(ctx, st.t.Clone()); err != nil {
				return fmt.Errorf("helpdesk: seed ticket %s/%s: %w", st.t.Tenant, st.t.ID, err)
			}
		}
		for _, r := range seedReports() {
			if err := seedID(ctx, tx, r.Tenant, SeqReport, reportFloor, "ER-%d", r.ID); err != nil {
				return err
			}
			if err := tx.InsertReport(ctx, r); err != nil {
				return fmt.Errorf("helpdesk: seed report %s/%s: %w", r.Tenant, r.ID, err)
			}
		}
		return nil
	})
}

// seedID takes the next id of seq and checks it is the one the seed data names, so later ids
// continue after the seeded ones.
func seedID(ctx context.Context, tx Tx, tenant string, seq Sequence, floor int64, format, want string) error {
	n, err := tx.NextID(ctx, tenant, seq, floor)
	if err != nil {
		return fmt.Errorf("helpdesk: seed: %w", err)
	}
	if got := fmt.Sprintf(format, n); got != want {
		return fmt.Errorf("helpdesk: seed: %s %s sequence is at %s, not %s: the store is not empty", tenant, seq, got, want)
	}
	return nil
}
