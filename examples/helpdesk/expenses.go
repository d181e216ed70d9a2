package helpdesk

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	"google.golang.org/grpc/codes"

	"github.com/mandate-dev/mandate/pkg/backend"
)

// createReportInput is a new expense report. Its JSON encoding is the request digest of the
// idempotency key.
type createReportInput struct {
	Title            string            `json:"title"`
	Lines            []Line            `json:"lines"`
	Labels           map[string]string `json:"labels,omitempty"`
	PayrollID        string            `json:"payroll_id,omitempty"`
	BankAccountAlias string            `json:"bank_account_alias,omitempty"`
}

func (in createReportInput) check() error {
	if len(in.Lines) == 0 {
		return invalidInput("/lines", "a report needs at least one line")
	}
	if (in.PayrollID == "") == (in.BankAccountAlias == "") {
		return invalidInput("/payout", "exactly one of payroll_id and bank_account_alias is required")
	}
	for i, l := range in.Lines {
		ptr := "/lines/" + strconv.Itoa(i)
		switch {
		case l.Amount.Minor <= 0 || l.Amount.Currency == "":
			return invalidInput(ptr+"/amount", "a line needs a positive amount with a currency")
		case !l.Category.Valid():
			return invalidInput(ptr+"/category", "unknown category")
		case l.DistanceKm != nil && (math.IsNaN(*l.DistanceKm) || math.IsInf(*l.DistanceKm, 0) || *l.DistanceKm < 0):
			return invalidInput(ptr+"/distance_km", "distance must be a finite, non-negative number")
		}
	}
	return nil
}

// createReport creates a draft owned by the caller, in tx. With an idempotency key, repeating
// the same request as the same user returns the report the first request created.
func (d *desk) createReport(ctx context.Context, tx Tx, p backend.Caller, in createReportInput) (ExpenseReport, error) {
	if err := in.check(); err != nil {
		return ExpenseReport{}, err
	}
	if _, err := Total(in.Lines); err != nil {
		if errors.Is(err, ErrMixedCurrencies) {
			return ExpenseReport{}, refuse(StagePreInvariant, CodeExpenseCurrencyMismatch, codes.FailedPrecondition,
				"every line of a report must be in the same currency")
		}
		return ExpenseReport{}, invalidInput("/lines", "the total of the lines is too large")
	}
	key := IdempotencyKey{Tenant: p.Tenant, UserID: p.UserID, Command: cmdCreateReport, Key: p.IdempotencyKey}
	if key.Key != "" {
		prior, found, err := replay(ctx, tx, key, digestOf(in))
		if err != nil {
			return ExpenseReport{}, err
		}
		if found {
			return tx.Report(ctx, p.Tenant, prior)
		}
	}
	n, err := tx.NextID(ctx, p.Tenant, SeqReport, reportFloor)
	if err != nil {
		return ExpenseReport{}, err
	}
	r := ExpenseReport{
		Tenant: p.Tenant, ID: fmt.Sprintf("ER-%d", n), Owner: p.UserID, OwnerOrg: p.Org,
		Title: in.Title, State: ReportDraft, Lines: in.Lines, Labels: in.Labels,
		PayrollID: in.PayrollID, BankAccountAlias: in.BankAccountAlias, CreatedAt: d.clock(),
	}
	if err := tx.InsertReport(ctx, r); err != nil {
		return ExpenseReport{}, err
	}
	if key.Key != "" {
		if err := tx.CompleteKey(ctx, key, r.ID); err != nil {
			return ExpenseReport{}, err
		}
	}
	return r, nil
}

// transition locks a report of the caller's tenant in tx, lets change check and modify it,
// and stores the result.
func (d *desk) transition(ctx context.Context, tx Tx, p backend.Caller, id string, change func(r *ExpenseReport) error) (ExpenseReport, error) {
	r, err := tx.ReportForUpdate(ctx, p.Tenant, id)
	if errors.Is(err, ErrNotFound) {
		return ExpenseReport{}, notFound("expense report", id)
	}
	if err != nil {
		return ExpenseReport{}, err
	}
	if err := change(&r); err != nil {
		return ExpenseReport{}, err
	}
	if err := tx.UpdateReport(ctx, r); err != nil {
		return ExpenseReport{}, err
	}
	return r, nil
}

// submitReport sends the owner's draft for approval.
func (d *desk) submitReport(ctx context.Context, tx Tx, p backend.Caller, id, note string) (ExpenseReport, error) {
	return d.transition(ctx, tx, p, id, func(r *ExpenseReport) error {
		if err := checkSubmit(p, *r); err != nil {
			return err
		}
		r.State, r.SubmittedBy, r.SubmittedAt, r.SubmitNote = ReportSubmitted, p.UserID, d.clock(), note
		return nil
	})
}

// checkSubmit applies the submit rules to a report: the caller owns it and it is a draft. The
// submit and its preview share it, so that the preview refuses what the submit would.
func checkSubmit(p backend.Caller, r ExpenseReport) error {
	if r.Owner != p.UserID {
		return refuse(StageScopeCheck, backend.CodeScopeDenied, codes.PermissionDenied,
			"only the owner of expense report "+r.ID+" may submit it")
	}
	if r.State != ReportDraft {
		return refuse(StageStateCheck, CodeNotDraft, codes.FailedPrecondition,
			"expense report "+r.ID+" is "+string(r.State)+"; only a draft can be submitted")
	}
	return nil
}

// recallReport takes the owner's submitted report back to draft, before approval.
func (d *desk) recallReport(ctx context.Context, tx Tx, p backend.Caller, id, reason string) (ExpenseReport, error) {
	return d.transition(ctx, tx, p, id, func(r *ExpenseReport) error {
		if err := checkRecall(p, *r); err != nil {
			return err
		}
		r.State, r.RecallReason = ReportDraft, reason
		return nil
	})
}

// checkRecall applies the recall rules to a report: the caller owns it and
// it is submitted, not yet approved. The recall and its preview share it.
func checkRecall(p backend.Caller, r ExpenseReport) error {
	if r.Owner != p.UserID {
		return refuse(StageScopeCheck, backend.CodeScopeDenied, codes.PermissionDenied,
			"only the owner of expense report "+r.ID+" may recall it")
	}
	switch r.State {
	case ReportApproved:
		return refuse(StageStateCheck, CodeAlreadyApproved, codes.FailedPrecondition,
			"expense report "+r.ID+" is already approved and can no longer be recalled")
	case ReportSubmitted:
		return nil
	default:
		return refuse(StageStateCheck, CodeNotSubmitted, codes.FailedPrecondition,
			"expense report "+r.ID+" is "+string(r.State)+"; only a submitted report can be recalled")
	}
}

// approveReport approves a submitted report of the approver's org.
func (d *desk) approveReport(ctx context.Context, tx Tx, p backend.Caller, id, comment string) (ExpenseReport, error) {
	return d.transition(ctx, tx, p, id, func(r *ExpenseReport) error {
		if err := checkApprove(p, *r); err != nil {
			return err
		}
		r.State, r.ApprovedBy, r.ApprovedAt, r.ApprovalComment = ReportApproved, p.UserID, d.clock(), comment
		return nil
	})
}

// checkApprove applies the approval rules to a report: the approver is of
// its organisation, neither its owner nor its submitter, and it is
// submitted. The approval and its preview share it.
func checkApprove(p backend.Caller, r ExpenseReport) error {
	if r.OwnerOrg == "" || p.Org != r.OwnerOrg {
		return refuse(StageScopeCheck, backend.CodeScopeDenied, codes.PermissionDenied,
			"expense report "+r.ID+" belongs to another organisation; only its own organisation approves it")
	}
	if p.UserID == r.Owner || p.UserID == r.SubmittedBy {
		return refuse(StagePreInvariant, CodeSelfApproval, codes.FailedPrecondition,
			"the owner or submitter of expense report "+r.ID+" may not approve it")
	}
	switch r.State {
	case ReportApproved:
		return refuse(StageStateCheck, CodeAlreadyApproved, codes.FailedPrecondition,
			"expense report "+r.ID+" is already approved")
	case ReportSubmitted:
		return nil
	default:
		return refuse(StageStateCheck, CodeNotSubmitted, codes.FailedPrecondition,
			"expense report "+r.ID+" is "+string(r.State)+"; only a submitted report can be approved")
	}
}
