package tests

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// lyonReport is a one-line draft expense report reimbursed through payroll.
func lyonReport() *helpdeskv1.CreateExpenseReportRequest {
	return &helpdeskv1.CreateExpenseReportRequest{
		Title:  "Customer visit Lyon",
		Payout: &helpdeskv1.CreateExpenseReportRequest_PayrollId{PayrollId: "P-0042"},
		Lines: []*helpdeskv1.ExpenseLine{{
			Description: "Train Paris-Lyon", Category: helpdeskv1.ExpenseCategory_EXPENSE_CATEGORY_TRAVEL,
			Amount: &helpdeskv1.Money{CurrencyCode: "EUR", AmountMinor: 8900},
		}},
	}
}

// helpdeskClient is the sample's generated gRPC client pointed at the
// executor: every call runs the governed pipeline.
func (tp *topology) helpdeskClient() helpdeskv1.HelpdeskServiceClient {
	return helpdeskv1.NewHelpdeskServiceClient(tp.conn("executor"))
}

// invocationHeader is a grpc.CallOption that captures the invocation id
// the governed proxy returns in the response header.
func invocationHeader() (grpc.CallOption, func() string) {
	var md metadata.MD
	return grpc.Header(&md), func() string {
		if v := md.Get("x-mandate-invocation-id"); len(v) == 1 {
			return v[0]
		}
		return ""
	}
}

// reportState reads a report's state from the helpdesk's table.
func (tp *topology) reportState(id string) string {
	tp.t.Helper()
	var state string
	if err := tp.db.QueryRow(tp.t.Context(), `SELECT state FROM helpdesk.expense_reports WHERE tenant = 'acme' AND report_id = $1`, id).Scan(&state); err != nil {
		tp.t.Fatalf("report %s: %v", id, err)
	}
	return state
}

// approveWithConfirmation has bob approve a report over REST: approval is
// irreversible with a ledger side effect, so bob confirms it himself first.
func (tp *topology) approveWithConfirmation(t *testing.T, approver, report string) restResponse {
	t.Helper()
	tok := tp.token("acme", approver, "")
	path := "/v1/expense-reports/" + report + ":approve"
	first := tp.rest("executor", http.MethodPost, path, tok, `{"comment":"OK"}`)
	wantProblem(t, first, http.StatusUnprocessableEntity, "confirmation_check", "confirmation.required")
	if _, err := tp.decide(tok, first.body["challenge_id"].(string), mandatev1.Decision_DECISION_APPROVE); err != nil {
		t.Fatal(err)
	}
	return tp.rest("executor", http.MethodPost, path, tok, `{"comment":"OK"}`, "X-Mandate-Approval-Grant", first.body["challenge_id"].(string))
}

// TestScenarioSubmitRecallSubmit: alice creates a report, submits it,
// recalls it and submits it again (draft → submitted → draft → submitted),
// through the governed gRPC proxy. The backend's state guards refuse, at
// state_check, a second submit and the recall of an approved report.
func TestScenarioSubmitRecallSubmit(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	alice := tp.token("acme", "alice", "")
	client := tp.helpdeskClient()

	type step struct {
		command, invocation string
	}
	var steps []step
	call := func(command string, fn func(opt grpc.CallOption) (*helpdeskv1.ExpenseReport, error), want helpdeskv1.ExpenseReportState) *helpdeskv1.ExpenseReport {
		t.Helper()
		opt, inv := invocationHeader()
		r, err := fn(opt)
		if err != nil || r.GetState() != want {
			t.Fatalf("%s: %v %v; want %v", command, r, err, want)
		}
		steps = append(steps, step{command, inv()})
		return r
	}
	created := call("expense.report.create", func(opt grpc.CallOption) (*helpdeskv1.ExpenseReport, error) {
		return client.CreateExpenseReport(tp.as(alice), lyonReport(), opt)
	}, helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_DRAFT)
	id := created.GetReportId()
	submit := func(opt grpc.CallOption) (*helpdeskv1.ExpenseReport, error) {
		return client.SubmitExpenseReport(tp.as(alice), &helpdeskv1.SubmitExpenseReportRequest{ReportId: id, Note: "Receipts attached"}, opt)
	}
	call("expense.report.submit", submit, helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_SUBMITTED)
	call("expense.report.recall", func(opt grpc.CallOption) (*helpdeskv1.ExpenseReport, error) {
		return client.RecallExpenseReport(tp.as(alice), &helpdeskv1.RecallExpenseReportRequest{ReportId: id, Reason: "Wrong amount"}, opt)
	}, helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_DRAFT)
	again := call("expense.report.submit", submit, helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_SUBMITTED)
	if again.GetSubmittedBy() != "alice" || tp.reportState(id) != "submitted" {
		t.Fatalf("resubmitted report %v (stored %s)", again, tp.reportState(id))
	}
	for _, s := range steps {
		out := outcome(t, tp.invocationRows(s.invocation, 2), "executed", "", "")
		if out.GetCommand() != s.command || out.GetChannel() != "grpc" || out.GetUserId() != "alice" || out.GetActorKind() != "user" {
			t.Fatalf("row %v; want %s", out, s.command)
		}
		if s.command != "expense.report.create" && out.GetSubject() != id {
			t.Fatalf("row %v; want subject %s", out, id)
		}
	}

	// Submitting a submitted report: the backend's guard, at state_check.
	_, err := submit(grpc.EmptyCallOption{})
	ce := wantGRPCRefusal(t, err, codes.FailedPrecondition, "state_check", "state.not_draft")
	outcome(t, tp.invocationRows(ce.GetInvocationId(), 2), "refused", "state_check", "state.not_draft")

	// Once bob approved it, alice can no longer recall it.
	if approved := tp.approveWithConfirmation(t, "bob", id); approved.status != http.StatusOK {
		t.Fatalf("bob approving: %d %s", approved.status, approved.raw)
	}
	recall := tp.rest("executor", http.MethodPost, "/v1/expense-reports/"+id+":recall", alice, `{"reason":"too late"}`)
	wantProblem(t, recall, http.StatusUnprocessableEntity, "state_check", "state.already_approved")
	outcome(t, tp.invocationRows(recall.body["invocation_id"].(string), 2), "refused", "state_check", "state.already_approved")
	if s := tp.reportState(id); s != "approved" {
		t.Fatalf("report %s is %s after a refused recall", id, s)
	}
}

// TestScenarioApproveBySubmitter: separation of duties. In the demo
// directory nobody holds both expense permissions, so alice approving her
// own report is refused at permission_check. A team lead who holds both
// (sam, added to acme for this test) submits a report and is refused at
// sod_check with sod.conflict when approving it — before anyone is asked to
// confirm — while bob may approve it.
func TestScenarioApproveBySubmitter(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	client := tp.helpdeskClient()

	alice := tp.token("acme", "alice", "")
	mine, err := client.CreateExpenseReport(tp.as(alice), lyonReport())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.SubmitExpenseReport(tp.as(alice), &helpdeskv1.SubmitExpenseReportRequest{ReportId: mine.GetReportId()}); err != nil {
		t.Fatal(err)
	}
	_, err = client.ApproveExpenseReport(tp.as(alice), &helpdeskv1.ApproveExpenseReportRequest{ReportId: mine.GetReportId()})
	wantGRPCRefusal(t, err, codes.PermissionDenied, "permission_check", "authorization.permission_denied")

	// A lead of the support org who may submit and approve.
	demo, err := os.ReadFile(filepath.Join(tp.root, "examples", "policy", "demo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const olive = "      - {id: olive, org: ops, roles: [ops]}\n"
	if !strings.Contains(string(demo), olive) {
		t.Fatalf("examples/policy/demo.yaml no longer lists olive as %q", olive)
	}
	withLead := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(withLead, []byte(strings.Replace(string(demo), olive, olive+"      - {id: sam, org: support, roles: [support, manager]}\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	tp.run("policy", "apply", "-f", withLead)

	sam := tp.token("acme", "sam", "")
	report, err := client.CreateExpenseReport(tp.as(sam), lyonReport())
	if err != nil {
		t.Fatal(err)
	}
	id := report.GetReportId()
	if _, err := client.SubmitExpenseReport(tp.as(sam), &helpdeskv1.SubmitExpenseReportRequest{ReportId: id}); err != nil {
		t.Fatal(err)
	}
	before := tp.challenges("acme")

	overREST := tp.rest("executor", http.MethodPost, "/v1/expense-reports/"+id+":approve", sam, `{"comment":"looks fine to me"}`)
	wantProblem(t, overREST, http.StatusForbidden, "sod_check", "sod.conflict")
	_, err = client.ApproveExpenseReport(tp.as(sam), &helpdeskv1.ApproveExpenseReportRequest{ReportId: id})
	overGRPC := wantGRPCRefusal(t, err, codes.PermissionDenied, "sod_check", "sod.conflict")

	if n := tp.challenges("acme"); n != before {
		t.Fatalf("%d challenges opened for a call SoD refuses", n-before)
	}
	if s := tp.reportState(id); s != "submitted" {
		t.Fatalf("report %s is %s after refused approvals", id, s)
	}
	for _, inv := range []string{overREST.body["invocation_id"].(string), overGRPC.GetInvocationId()} {
		out := outcome(t, tp.invocationRows(inv, 1), "refused", "sod_check", "sod.conflict")
		if out.GetUserId() != "sam" || out.GetCommand() != "expense.report.approve" || out.GetSubject() != id {
			t.Fatalf("SoD refusal row %v", out)
		}
	}

	// Another manager of the org approves it.
	if approved := tp.approveWithConfirmation(t, "bob", id); approved.status != http.StatusOK || tp.reportState(id) != "approved" {
		t.Fatalf("bob approving sam's report: %d %s", approved.status, approved.raw)
	}
}
