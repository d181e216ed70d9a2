package helpdesk

import (
	"context"
	"errors"
	"fmt"
	"strings"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/pkg/backend"
)

// previews is the helpdesk's mandate.v1.PreviewService (pkg/backend's Previews): before a human
// is asked to approve a refund, a submit, an approval or an erasure — and when a call is
// checked (Check) — Mandate's executor asks what the call would do.
// Each preview reads in a transaction of its own and changes nothing — no lock kept, no
// receipt, no idempotency key claimed, no money moved — and applies the very checks the
// command applies (checkRefund, checkSubmit, checkRecall, checkApprove), so that it refuses what
// the command would refuse.
// The command checks again when it runs: a state that moved since the preview (another refund
// in between) is refused there with the same code.
func (b *Backend) previews() *backend.Previews {
	p := backend.NewPreviews(b.caller)
	backend.HandlePreview(p, helpdeskv1.HelpdeskService_IssueRefund_FullMethodName, b.previewRefund)
	backend.HandlePreview(p, helpdeskv1.HelpdeskService_SubmitExpenseReport_FullMethodName, b.previewSubmit)
	backend.HandlePreview(p, helpdeskv1.HelpdeskService_EraseCustomer_FullMethodName, b.previewErase)
	backend.HandlePreview(p, helpdeskv1.HelpdeskService_RecallExpenseReport_FullMethodName, b.previewRecall)
	backend.HandlePreview(p, helpdeskv1.HelpdeskService_ApproveExpenseReport_FullMethodName, b.previewApprove)
	return p
}

// previewRecall is the preview of RecallExpenseReport: the recall rules
// (checkRecall) on the report as it is now.
func (b *Backend) previewRecall(ctx context.Context, p backend.Caller, req *helpdeskv1.RecallExpenseReportRequest) ([]backend.Effect, error) {
	effects, err := b.desk.previewReport(ctx, p, req.GetReportId(), checkRecall, "recall", func(r ExpenseReport, total Money) string {
		return fmt.Sprintf("take expense report %s (%s) back to draft, before anyone approves it", r.ID, total)
	})
	if err != nil {
		return nil, b.fail(ctx, "PreviewRecallExpenseReport", p, err)
	}
	return effects, nil
}

// previewApprove is the preview of ApproveExpenseReport: the approval
// rules (checkApprove) on the report as it is now.
func (b *Backend) previewApprove(ctx context.Context, p backend.Caller, req *helpdeskv1.ApproveExpenseReportRequest) ([]backend.Effect, error) {
	effects, err := b.desk.previewReport(ctx, p, req.GetReportId(), checkApprove, "approve", func(r ExpenseReport, total Money) string {
		return fmt.Sprintf("approve expense report %s of %s (%s) for payroll", r.ID, r.Owner, total)
	})
	if err != nil {
		return nil, b.fail(ctx, "PreviewApproveExpenseReport", p, err)
	}
	return effects, nil
}

// previewReport reads the report, applies check as the command would, and
// describes the call with the report's total: an effect of kind whose text
// is text's.
func (d *desk) previewReport(ctx context.Context, p backend.Caller, reportID string, check func(backend.Caller, ExpenseReport) error,
	kind string, text func(r ExpenseReport, total Money) string) ([]backend.Effect, error) {
	var r ExpenseReport
	err := d.store.InTx(ctx, func(tx Tx) error {
		var err error
		r, err = tx.Report(ctx, p.Tenant, reportID)
		return err
	})
	if errors.Is(err, ErrNotFound) {
		return nil, notFound("expense report", reportID)
	}
	if err != nil {
		return nil, err
	}
	if err := check(p, r); err != nil {
		return nil, err
	}
	total, err := Total(r.Lines)
	if err != nil {
		// A stored report's lines share a currency (createReport checked it).
		return nil, err
	}
	return []backend.Effect{{Kind: kind, Text: text(r, total),
		Amounts: []backend.Amount{{Label: "total", Currency: total.Currency, Minor: total.Minor}}}}, nil
}

// previewErase is the preview of EraseCustomer.
func (b *Backend) previewErase(ctx context.Context, p backend.Caller, req *helpdeskv1.EraseCustomerRequest) ([]backend.Effect, error) {
	effects, err := b.desk.previewErase(ctx, p, req.GetCustomerEmail())
	if err != nil {
		return nil, b.fail(ctx, "PreviewEraseCustomer", p, err)
	}
	return effects, nil
}

// maxPreviewTickets bounds the tickets an erasure's preview counts.
const maxPreviewTickets = 1000

// previewErase counts the tickets whose email the erasure would replace,
// as eraseCustomer would match them, and says that it cannot be undone.
// An erasure that would change nothing is not refused (a deletion request
// for someone without tickets is still answered), but the approver reads
// that it changes nothing.
func (d *desk) previewErase(ctx context.Context, p backend.Caller, email string) ([]backend.Effect, error) {
	email = strings.ToLower(strings.TrimSpace(email))
	if email == "" || !strings.Contains(email, "@") {
		return nil, invalidInput("/customer_email", "customer_email must be an email address")
	}
	var n int
	err := d.store.InTx(ctx, func(tx Tx) error {
		var after *TicketCursor
		for n < maxPreviewTickets {
			page, err := tx.SearchTickets(ctx, p.Tenant, TicketFilter{CustomerEmail: email}, after, 100)
			if err != nil {
				return err
			}
			n += len(page)
			if len(page) < 100 {
				return nil
			}
			last := page[len(page)-1]
			after = &TicketCursor{CreatedAt: last.CreatedAt, ID: last.ID}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var text string
	switch {
	case n == 0:
		text = "erase nothing: no ticket of this tenant has this customer's email"
	case n >= maxPreviewTickets:
		text = fmt.Sprintf("replace this customer's email by a tombstone on at least %d tickets; this cannot be undone", n)
	case n == 1:
		text = "replace this customer's email by a tombstone on 1 ticket; this cannot be undone"
	default:
		text = fmt.Sprintf("replace this customer's email by a tombstone on %d tickets; this cannot be undone", n)
	}
	return []backend.Effect{{Kind: "erase", Text: text}}, nil
}

// previewRefund is the preview of IssueRefund.
func (b *Backend) previewRefund(ctx context.Context, p backend.Caller, req *helpdeskv1.IssueRefundRequest) ([]backend.Effect, error) {
	effects, err := b.desk.previewRefund(ctx, p, moneyFromProto(req.GetAmount()), req.GetTicketId())
	if err != nil {
		return nil, b.fail(ctx, "PreviewIssueRefund", p, err)
	}
	return effects, nil
}

// previewSubmit is the preview of SubmitExpenseReport.
func (b *Backend) previewSubmit(ctx context.Context, p backend.Caller, req *helpdeskv1.SubmitExpenseReportRequest) ([]backend.Effect, error) {
	effects, err := b.desk.previewSubmit(ctx, p, req.GetReportId())
	if err != nil {
		return nil, b.fail(ctx, "PreviewSubmitExpenseReport", p, err)
	}
	return effects, nil
}

// previewRefund applies the refund rules to the ticket as it is now and describes the refund.
// A replay of an idempotency key the helpdesk already completed is not previewed as such: the
// executor answers such a retry from its own record before anyone is asked.
func (d *desk) previewRefund(ctx context.Context, p backend.Caller, amount Money, ticketID string) ([]backend.Effect, error) {
	if amount.Minor <= 0 || amount.Currency == "" {
		return nil, invalidInput("/amount", "a refund must be a positive amount with a currency")
	}
	var t Ticket
	err := d.store.InTx(ctx, func(tx Tx) error {
		var err error
		t, err = tx.Ticket(ctx, p.Tenant, ticketID)
		return err
	})
	if errors.Is(err, ErrNotFound) {
		return nil, notFound("ticket", ticketID)
	}
	if err != nil {
		return nil, err
	}
	if err := checkRefund(t, amount); err != nil {
		return nil, err
	}
	refunded := Money{Currency: t.Paid.Currency, Minor: t.Refunded.Minor}
	return []backend.Effect{{
		Kind: "refund",
		Text: fmt.Sprintf("refund %s of %s paid; %s refunded so far", amount, t.Paid, refunded),
		Amounts: []backend.Amount{
			{Label: "refund", Currency: amount.Currency, Minor: amount.Minor},
			{Label: "paid", Currency: t.Paid.Currency, Minor: t.Paid.Minor},
			{Label: "refunded", Currency: refunded.Currency, Minor: refunded.Minor},
		},
	}}, nil
}

// previewSubmit applies the submit rules to the report as it is now and describes the submit.
func (d *desk) previewSubmit(ctx context.Context, p backend.Caller, reportID string) ([]backend.Effect, error) {
	return d.previewReport(ctx, p, reportID, checkSubmit, "submit", func(r ExpenseReport, total Money) string {
		lines := "1 line"
		if len(r.Lines) != 1 {
			lines = fmt.Sprintf("%d lines", len(r.Lines))
		}
		return fmt.Sprintf("submit expense report %s (%s, %s) to the manager for approval", r.ID, lines, total)
	})
}
