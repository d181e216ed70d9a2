package helpdesk

import (
	"math"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
)

// Conversions between the wire messages and the domain types. Enum values outside the
// declared ones never reach here: the server validates requests against their buf.validate
// rules first (defined_only, not_in: [0]).

var ticketStatuses = map[helpdeskv1.TicketStatus]TicketStatus{
	helpdeskv1.TicketStatus_TICKET_STATUS_OPEN:    TicketOpen,
	helpdeskv1.TicketStatus_TICKET_STATUS_PENDING: TicketPending,
	helpdeskv1.TicketStatus_TICKET_STATUS_CLOSED:  TicketClosed,
}

var categories = map[helpdeskv1.ExpenseCategory]Category{
	helpdeskv1.ExpenseCategory_EXPENSE_CATEGORY_TRAVEL:  CategoryTravel,
	helpdeskv1.ExpenseCategory_EXPENSE_CATEGORY_LODGING: CategoryLodging,
	helpdeskv1.ExpenseCategory_EXPENSE_CATEGORY_MEALS:   CategoryMeals,
	helpdeskv1.ExpenseCategory_EXPENSE_CATEGORY_OTHER:   CategoryOther,
}

var reportStates = map[ReportState]helpdeskv1.ExpenseReportState{
	ReportDraft:     helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_DRAFT,
	ReportSubmitted: helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_SUBMITTED,
	ReportApproved:  helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_APPROVED,
}

var refundStatuses = map[RefundStatus]helpdeskv1.RefundStatus{
	RefundAccepted: helpdeskv1.RefundStatus_REFUND_STATUS_ACCEPTED,
	RefundSettled:  helpdeskv1.RefundStatus_REFUND_STATUS_SETTLED,
}

func moneyFromProto(m *helpdeskv1.Money) Money {
	return Money{Currency: m.GetCurrencyCode(), Minor: m.GetAmountMinor()}
}

// moneyToProto returns nil for zero Money, so an absent amount stays absent on the wire.
func moneyToProto(m Money) *helpdeskv1.Money {
	if m.IsZero() || m.Minor == 0 {
		return nil
	}
	return &helpdeskv1.Money{CurrencyCode: m.Currency, AmountMinor: m.Minor}
}

func timeToProto(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func searchFromProto(req *helpdeskv1.SearchTicketsRequest) searchInput {
	f := TicketFilter{Query: req.GetQuery(), CustomerEmail: req.GetCustomerEmail(), Tags: req.GetTags()}
	for _, s := range req.GetStatuses() {
		if d, ok := ticketStatuses[s]; ok {
			f.Statuses = append(f.Statuses, d)
		}
	}
	if req.GetCreatedAfter() != nil {
		f.CreatedAfter = req.GetCreatedAfter().AsTime()
	}
	return searchInput{Filter: f, PageSize: int(req.GetPageSize()), PageToken: req.GetPageToken()}
}

func ticketToProto(t Ticket) *helpdeskv1.Ticket {
	out := &helpdeskv1.Ticket{
		TicketId:       t.ID,
		Subject:        t.Subject,
		CustomerEmail:  t.CustomerEmail,
		AmountPaid:     moneyToProto(t.Paid),
		AmountRefunded: moneyToProto(t.Refunded),
		Tags:           t.Tags,
		CreatedAt:      timeToProto(t.CreatedAt),
	}
	for w, d := range ticketStatuses {
		if d == t.Status {
			out.Status = w
		}
	}
	return out
}

func refundToProto(r Refund) *helpdeskv1.Refund {
	return &helpdeskv1.Refund{
		RefundId: r.ID,
		TicketId: r.TicketID,
		Amount:   moneyToProto(r.Amount),
		Status:   refundStatuses[r.Status],
		IssuedAt: timeToProto(r.IssuedAt),
	}
}

func createFromProto(req *helpdeskv1.CreateExpenseReportRequest) createReportInput {
	in := createReportInput{
		Title:            req.GetTitle(),
		Labels:           req.GetLabels(),
		PayrollID:        req.GetPayrollId(),
		BankAccountAlias: req.GetBankAccountAlias(),
	}
	if len(in.Labels) == 0 {
		in.Labels = nil
	}
	for _, l := range req.GetLines() {
		line := Line{Description: l.GetDescription(), Amount: moneyFromProto(l.GetAmount()), Category: categories[l.GetCategory()]}
		if l.DistanceKm != nil {
			d := l.GetDistanceKm()
			line.DistanceKm = &d
		}
		in.Lines = append(in.Lines, line)
	}
	return in
}

func reportToProto(r ExpenseReport) *helpdeskv1.ExpenseReport {
	total, _ := r.Total() // lines were checked to share one currency when the report was created
	out := &helpdeskv1.ExpenseReport{
		ReportId:    r.ID,
		Title:       r.Title,
		State:       reportStates[r.State],
		Owner:       r.Owner,
		SubmittedBy: r.SubmittedBy,
		ApprovedBy:  r.ApprovedBy,
		Total:       moneyToProto(total),
		Labels:      r.Labels,
		CreatedAt:   timeToProto(r.CreatedAt),
		SubmittedAt: timeToProto(r.SubmittedAt),
		ApprovedAt:  timeToProto(r.ApprovedAt),
	}
	for _, l := range r.Lines {
		line := &helpdeskv1.ExpenseLine{Description: l.Description, Amount: moneyToProto(l.Amount)}
		for w, d := range categories {
			if d == l.Category {
				line.Category = w
			}
		}
		if l.DistanceKm != nil {
			d := *l.DistanceKm
			line.DistanceKm = &d
		}
		out.Lines = append(out.Lines, line)
	}
	return out
}

func erasureToProto(e Erasure) *helpdeskv1.CustomerErasure {
	return &helpdeskv1.CustomerErasure{
		ErasureId:     e.ID,
		TicketsErased: int32(min(e.TicketsErased, math.MaxInt32)), //nolint:gosec // G115: clamped to int32 above
		ErasedAt:      timeToProto(e.ErasedAt),
	}
}
