package helpdesk_test

import (
	"context"
	"reflect"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/pkg/backend"
)

const (
	draft     = helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_DRAFT
	submitted = helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_SUBMITTED
	approved  = helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_APPROVED
)

func createReq(title string, lines ...*helpdeskv1.ExpenseLine) *helpdeskv1.CreateExpenseReportRequest {
	return &helpdeskv1.CreateExpenseReportRequest{
		Title: title, Lines: lines, Labels: map[string]string{"project": "atlas"},
		Payout: &helpdeskv1.CreateExpenseReportRequest_PayrollId{PayrollId: "P-0042"},
	}
}

func line(desc string, amount *helpdeskv1.Money, cat helpdeskv1.ExpenseCategory) *helpdeskv1.ExpenseLine {
	return &helpdeskv1.ExpenseLine{Description: desc, Amount: amount, Category: cat}
}

const (
	travel  = helpdeskv1.ExpenseCategory_EXPENSE_CATEGORY_TRAVEL
	lodging = helpdeskv1.ExpenseCategory_EXPENSE_CATEGORY_LODGING
)

// TestExpenseReportCommands runs each command once against freshly seeded data and checks the
// report it returns, or the refusal and that the stored report did not change.
func TestExpenseReportCommands(t *testing.T) {
	submit := func(id string) func(context.Context, helpdeskv1.HelpdeskServiceClient) (*helpdeskv1.ExpenseReport, error) {
		return func(ctx context.Context, c helpdeskv1.HelpdeskServiceClient) (*helpdeskv1.ExpenseReport, error) {
			return c.SubmitExpenseReport(ctx, &helpdeskv1.SubmitExpenseReportRequest{ReportId: id, Note: "Receipts attached"})
		}
	}
	recall := func(id string) func(context.Context, helpdeskv1.HelpdeskServiceClient) (*helpdeskv1.ExpenseReport, error) {
		return func(ctx context.Context, c helpdeskv1.HelpdeskServiceClient) (*helpdeskv1.ExpenseReport, error) {
			return c.RecallExpenseReport(ctx, &helpdeskv1.RecallExpenseReportRequest{ReportId: id, Reason: "Wrong amount"})
		}
	}
	approve := func(id string) func(context.Context, helpdeskv1.HelpdeskServiceClient) (*helpdeskv1.ExpenseReport, error) {
		return func(ctx context.Context, c helpdeskv1.HelpdeskServiceClient) (*helpdeskv1.ExpenseReport, error) {
			return c.ApproveExpenseReport(ctx, &helpdeskv1.ApproveExpenseReportRequest{ReportId: id, Comment: "OK"})
		}
	}
	create := func(req *helpdeskv1.CreateExpenseReportRequest) func(context.Context, helpdeskv1.HelpdeskServiceClient) (*helpdeskv1.ExpenseReport, error) {
		return func(ctx context.Context, c helpdeskv1.HelpdeskServiceClient) (*helpdeskv1.ExpenseReport, error) {
			return c.CreateExpenseReport(ctx, req)
		}
	}
	scopeDenied := &refusal{codes.PermissionDenied, helpdesk.StageScopeCheck, backend.CodeScopeDenied}
	notDraft := &refusal{codes.FailedPrecondition, helpdesk.StageStateCheck, helpdesk.CodeNotDraft}
	notSubmitted := &refusal{codes.FailedPrecondition, helpdesk.StageStateCheck, helpdesk.CodeNotSubmitted}
	selfApproval := &refusal{codes.FailedPrecondition, helpdesk.StagePreInvariant, helpdesk.CodeSelfApproval}

	tests := []struct {
		name  string
		as    principal
		call  func(context.Context, helpdeskv1.HelpdeskServiceClient) (*helpdeskv1.ExpenseReport, error)
		err   *refusal
		id    string // the report acted on, or created
		state helpdeskv1.ExpenseReportState
		by    string // submitted_by after submit, approved_by after approve
	}{
		{"create", user("alice"), create(createReq("Lyon", line("Train", eur(8900), travel), line("Hotel", eur(12000), lodging))), nil, "ER-2004", draft, ""},
		{"create by an agent belongs to its user", agent("support-bot", "alice"), create(createReq("Lyon", line("Train", eur(8900), travel))), nil, "ER-2004", draft, ""},
		{"create in two currencies", user("alice"), create(createReq("Lyon", line("Train", eur(8900), travel), line("Hotel", usd(12000), lodging))),
			&refusal{codes.FailedPrecondition, helpdesk.StagePreInvariant, helpdesk.CodeExpenseCurrencyMismatch}, "", 0, ""},
		{"create without lines is refused by validation", user("alice"), create(createReq("Lyon")), &refusal{codes.InvalidArgument, "schema_validate", "schema.invalid"}, "", 0, ""},

		{"submit a draft", user("alice"), submit("ER-2001"), nil, "ER-2001", submitted, "alice"},
		{"submit someone else's draft", user("bob"), submit("ER-2001"), scopeDenied, "ER-2001", draft, ""},
		{"submit a submitted report", user("alice"), submit("ER-2002"), notDraft, "ER-2002", submitted, ""},
		{"submit an unknown report", user("alice"), submit("ER-9999"), &notFound, "", 0, ""},
		{"submit another tenant's report", user("dave"), submit("ER-2001"), &notFound, "ER-2001", draft, ""},

		{"recall a submitted report", user("alice"), recall("ER-2002"), nil, "ER-2002", draft, ""},
		{"recall by an agent for the owner", agent("support-bot", "alice"), recall("ER-2002"), nil, "ER-2002", draft, ""},
		{"recall a draft", user("alice"), recall("ER-2001"), notSubmitted, "ER-2001", draft, ""},
		{"recall someone else's report", user("bob"), recall("ER-2002"), scopeDenied, "ER-2002", submitted, ""},
		{"recall another tenant's report", user("dave"), recall("ER-2002"), &notFound, "ER-2002", submitted, ""},

		{"approve as the manager", user("bob"), approve("ER-2003"), nil, "ER-2003", approved, "bob"},
		{"approve from another org", user("carol"), approve("ER-2003"), scopeDenied, "ER-2003", submitted, ""},
		{"approve your own report", user("alice"), approve("ER-2003"), selfApproval, "ER-2003", submitted, ""},
		{"approve your own report through an agent", agent("support-bot", "alice"), approve("ER-2003"), selfApproval, "ER-2003", submitted, ""},
		{"approve a draft", user("bob"), approve("ER-2001"), notSubmitted, "ER-2001", draft, ""},
		{"approve another tenant's report", user("dave"), approve("ER-2003"), &notFound, "ER-2003", submitted, ""},
	}
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				e := start(t, newStore)
				var before helpdesk.ExpenseReport
				if tt.id != "" && tt.err != nil {
					before, _ = e.store.Report(testCtx(t), "acme", tt.id)
				}
				got, err := tt.call(as(t, tt.as), e.exec)
				if tt.err != nil {
					checkRefusal(t, err, *tt.err)
					if tt.id != "" {
						after, _ := e.store.Report(testCtx(t), "acme", tt.id)
						if !reflect.DeepEqual(before, after) {
							t.Errorf("a refused call changed the report:\n before %+v\n after  %+v", before, after)
						}
						if string(after.State) != stateName(tt.state) {
							t.Errorf("state = %s, want %s", after.State, tt.state)
						}
					}
					return
				}
				mustOK(t, err)
				if got.GetReportId() != tt.id || got.GetState() != tt.state {
					t.Errorf("report %s is %v, want %s %v", got.GetReportId(), got.GetState(), tt.id, tt.state)
				}
				switch tt.state {
				case submitted:
					if got.GetSubmittedBy() != tt.by || got.GetSubmittedAt() == nil {
						t.Errorf("submitted_by %q at %v, want %q", got.GetSubmittedBy(), got.GetSubmittedAt(), tt.by)
					}
				case approved:
					if got.GetApprovedBy() != tt.by || got.GetApprovedAt() == nil {
						t.Errorf("approved_by %q at %v, want %q", got.GetApprovedBy(), got.GetApprovedAt(), tt.by)
					}
				}
				stored, err := e.store.Report(testCtx(t), "acme", tt.id)
				if err != nil {
					t.Fatal(err)
				}
				if string(stored.State) != stateName(tt.state) {
					t.Errorf("stored state = %s, want %v", stored.State, tt.state)
				}
			})
		}
	})
}

func stateName(s helpdeskv1.ExpenseReportState) string {
	switch s {
	case draft:
		return string(helpdesk.ReportDraft)
	case submitted:
		return string(helpdesk.ReportSubmitted)
	case approved:
		return string(helpdesk.ReportApproved)
	}
	return ""
}

func TestCreateExpenseReport(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		km := 412.5
		req := createReq("Customer visit Lyon", line("Train Paris-Lyon", eur(8900), travel), line("Hotel", eur(12050), lodging))
		req.Lines = append(req.Lines, &helpdeskv1.ExpenseLine{Description: "Car", Amount: eur(15000), Category: travel, DistanceKm: &km})
		got, err := e.exec.CreateExpenseReport(as(t, user("alice")), req)
		mustOK(t, err)
		if got.GetOwner() != "alice" || got.GetTotal().GetAmountMinor() != 35950 || got.GetTotal().GetCurrencyCode() != "EUR" ||
			len(got.GetLines()) != 3 || got.GetLines()[2].GetDistanceKm() != km || got.GetLabels()["project"] != "atlas" ||
			got.GetCreatedAt() == nil || got.GetSubmittedBy() != "" {
			t.Errorf("report = %v", got)
		}
		stored, err := e.store.Report(testCtx(t), "acme", got.GetReportId())
		if err != nil {
			t.Fatal(err)
		}
		if stored.OwnerOrg != "support" || stored.PayrollID != "P-0042" || stored.State != helpdesk.ReportDraft {
			t.Errorf("stored = %+v", stored)
		}
		// globex numbers its own reports.
		g, err := e.exec.CreateExpenseReport(as(t, user("dave")), req)
		mustOK(t, err)
		if g.GetReportId() != "ER-2001" {
			t.Errorf("globex's first report is %s, want ER-2001", g.GetReportId())
		}
		if r, _ := e.store.Report(testCtx(t), "acme", "ER-2001"); r.Title != "Team offsite Paris" {
			t.Errorf("acme's ER-2001 changed: %+v", r)
		}
	})
}

func TestCreateExpenseReportIdempotent(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		req := createReq("Customer visit Lyon", line("Train Paris-Lyon", eur(8900), travel))
		first, err := e.exec.CreateExpenseReport(as(t, user("alice"), "create-1"), req)
		mustOK(t, err)
		again, err := e.exec.CreateExpenseReport(as(t, user("alice"), "create-1"), req)
		mustOK(t, err)
		if again.GetReportId() != first.GetReportId() {
			t.Errorf("same key, same request: %s then %s", first.GetReportId(), again.GetReportId())
		}

		// The same key from several callers at once still creates one report.
		var wg sync.WaitGroup
		ids := make([]string, 8)
		for i := range ids {
			wg.Go(func() {
				r, err := e.exec.CreateExpenseReport(as(t, user("alice"), "create-2"), req)
				if err != nil {
					t.Error(err)
					return
				}
				ids[i] = r.GetReportId()
			})
		}
		wg.Wait()
		for _, id := range ids {
			if id != ids[0] {
				t.Fatalf("concurrent retries created %v", ids)
			}
		}

		changed := createReq("Customer visit Lille", line("Train Paris-Lille", eur(5900), travel))
		_, err = e.exec.CreateExpenseReport(as(t, user("alice"), "create-1"), changed)
		checkRefusal(t, err, refusal{codes.FailedPrecondition, helpdesk.StageIdempotencyCheck, backend.CodeIdempotencyKeyReused})

		bobs, err := e.exec.CreateExpenseReport(as(t, user("bob"), "create-1"), req)
		mustOK(t, err)
		if bobs.GetReportId() == first.GetReportId() || bobs.GetOwner() != "bob" {
			t.Errorf("bob's create with alice's key returned %s owned by %s", bobs.GetReportId(), bobs.GetOwner())
		}
		noKey, err := e.exec.CreateExpenseReport(as(t, user("alice")), req)
		mustOK(t, err)
		// ER-2004 (create-1), ER-2005 (create-2), ER-2006 (bob): nothing else was created.
		if first.GetReportId() != "ER-2004" || ids[0] != "ER-2005" || bobs.GetReportId() != "ER-2006" || noKey.GetReportId() != "ER-2007" {
			t.Errorf("ids %s, %s, %s, %s; want ER-2004…ER-2007", first.GetReportId(), ids[0], bobs.GetReportId(), noKey.GetReportId())
		}
	})
}

// TestExpenseWorkflow walks one report through its life and checks every guard on the way.
func TestExpenseWorkflow(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		r, err := e.exec.CreateExpenseReport(as(t, user("alice")), createReq("Berlin", line("Flight", eur(23000), travel)))
		mustOK(t, err)
		id := r.GetReportId()
		step := func(name string, who principal, want *refusal, wantState helpdeskv1.ExpenseReportState,
			fn func(ctx context.Context) (*helpdeskv1.ExpenseReport, error)) {
			t.Helper()
			got, err := fn(as(t, who))
			if want != nil {
				checkRefusal(t, err, *want)
				return
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got.GetState() != wantState {
				t.Fatalf("%s: state %v, want %v", name, got.GetState(), wantState)
			}
		}
		sub := func(ctx context.Context) (*helpdeskv1.ExpenseReport, error) {
			return e.exec.SubmitExpenseReport(ctx, &helpdeskv1.SubmitExpenseReportRequest{ReportId: id})
		}
		rec := func(ctx context.Context) (*helpdeskv1.ExpenseReport, error) {
			return e.exec.RecallExpenseReport(ctx, &helpdeskv1.RecallExpenseReportRequest{ReportId: id})
		}
		app := func(ctx context.Context) (*helpdeskv1.ExpenseReport, error) {
			return e.exec.ApproveExpenseReport(ctx, &helpdeskv1.ApproveExpenseReportRequest{ReportId: id})
		}
		already := &refusal{codes.FailedPrecondition, helpdesk.StageStateCheck, helpdesk.CodeAlreadyApproved}
		step("approve a draft", user("bob"), &refusal{codes.FailedPrecondition, helpdesk.StageStateCheck, helpdesk.CodeNotSubmitted}, 0, app)
		step("submit", user("alice"), nil, submitted, sub)
		step("submit twice", user("alice"), &refusal{codes.FailedPrecondition, helpdesk.StageStateCheck, helpdesk.CodeNotDraft}, 0, sub)
		step("recall", user("alice"), nil, draft, rec)
		step("submit again", user("alice"), nil, submitted, sub)
		step("approve", user("bob"), nil, approved, app)
		step("recall after approval", user("alice"), already, 0, rec)
		step("approve twice", user("bob"), already, 0, app)
		step("submit after approval", user("alice"), &refusal{codes.FailedPrecondition, helpdesk.StageStateCheck, helpdesk.CodeNotDraft}, 0, sub)
		stored, _ := e.store.Report(testCtx(t), "acme", id)
		if stored.State != helpdesk.ReportApproved || stored.ApprovedBy != "bob" || stored.SubmittedBy != "alice" || stored.RecallReason != "" {
			t.Errorf("stored = %+v", stored)
		}
	})
}
