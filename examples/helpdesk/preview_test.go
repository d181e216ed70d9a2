package helpdesk_test

import (
	"fmt"
	"regexp"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

var digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// preview asks the backend's PreviewService, as the executor does, about a call of method.
func (e *env) preview(t *testing.T, p principal, method string, req proto.Message) (*mandatev1.PreviewResponse, error) {
	t.Helper()
	wire, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	// The invocation id travels in the metadata, as on every call the executor makes, and in
	// the request.
	id := fmt.Sprintf("inv-preview-%d", invocations.Add(1))
	return mandatev1.NewPreviewServiceClient(e.execConn).Preview(redeliver(t, p, id), &mandatev1.PreviewRequest{
		Method: method, Request: wire, InvocationId: id,
	})
}

// TestPreviewAgreesWithTheRefund: on each store, the preview of every refund of
// TestIssueRefund's kinds refuses exactly what the refund then refuses — the same stage, code
// and gRPC code — and allows what it runs, describing it; the preview itself moves no money
// and changes no ticket.
func TestPreviewAgreesWithTheRefund(t *testing.T) {
	req := func(id string, amount *helpdeskv1.Money) *helpdeskv1.IssueRefundRequest {
		return &helpdeskv1.IssueRefundRequest{TicketId: id, Amount: amount, Reason: "Customer was charged twice", CardholderReference: "CH4242424242"}
	}
	tests := []struct {
		name   string
		as     principal
		req    *helpdeskv1.IssueRefundRequest
		effect string // the effect line of an allowed refund
	}{
		{"part of what was paid", user("carol"), req("T-1001", eur(2500)), "refund 25.00 EUR of 49.90 EUR paid; 0.00 EUR refunded so far"},
		{"all of what was paid", user("carol"), req("T-1001", eur(4990)), "refund 49.90 EUR of 49.90 EUR paid; 0.00 EUR refunded so far"},
		{"more than was paid", user("carol"), req("T-1001", eur(4991)), ""},
		{"another currency", user("carol"), req("T-1001", usd(100)), ""},
		{"a closed ticket", user("carol"), req("T-1003", eur(100)), ""},
		{"a ticket nothing was paid on", user("carol"), req("T-1002", eur(100)), ""},
		{"an unknown ticket", user("carol"), req("T-9999", eur(100)), ""},
		{"a ticket of another tenant", user("dave"), req("T-1002", eur(100)), ""},
		{"globex's own T-1001", user("dave"), req("T-1001", usd(5000)), "refund 50.00 USD of 125.00 USD paid; 0.00 USD refunded so far"},
	}
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				e := start(t, newStore)
				pv, err := e.preview(t, tt.as, helpdeskv1.HelpdeskService_IssueRefund_FullMethodName, tt.req)
				mustOK(t, err)
				if n := e.gw.Refunds(); n != 0 {
					t.Fatalf("the preview moved money: %d refunds", n)
				}
				_, callErr := e.exec.IssueRefund(as(t, tt.as), tt.req)
				if r := pv.GetRefusal(); r != nil {
					st := status.Convert(callErr)
					ce := checkRefusal(t, callErr, refusal{codes.Code(r.GetGrpcCode()), r.GetError().GetStage(), r.GetError().GetCode()})
					if st.Message() != r.GetError().GetMessage() || ce.GetMessage() != r.GetError().GetMessage() {
						t.Errorf("the preview said %q, the refund %q", r.GetError().GetMessage(), st.Message())
					}
					if tt.effect != "" {
						t.Errorf("refused %s/%s, want allowed: %q", r.GetError().GetStage(), r.GetError().GetCode(), tt.effect)
					}
					return
				}
				mustOK(t, callErr)
				effects := pv.GetAllowed().GetEffects()
				if len(effects) != 1 || effects[0].GetText() != tt.effect || effects[0].GetKind() != "refund" || !digestRE.MatchString(pv.GetAllowed().GetDigest()) {
					t.Fatalf("effects %v, digest %q; want %q", effects, pv.GetAllowed().GetDigest(), tt.effect)
				}
				amounts := effects[0].GetAmounts()
				if len(amounts) != 3 || amounts[0].GetLabel() != "refund" || amounts[0].GetAmountMinor() != tt.req.GetAmount().GetAmountMinor() ||
					amounts[0].GetCurrencyCode() != tt.req.GetAmount().GetCurrencyCode() {
					t.Errorf("amounts %v", amounts)
				}
			})
		}
	})
}

// TestPreviewReadsTheStateAsItIs: after a refund, the preview counts it (what was refunded so
// far, and what is left), on each store; a preview records no receipt, so the invocation it
// named still runs.
func TestPreviewReadsTheStateAsItIs(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		carol := user("carol")
		refund := func(minor int64) *helpdeskv1.IssueRefundRequest {
			return &helpdeskv1.IssueRefundRequest{TicketId: "T-1001", Amount: eur(minor), Reason: "Customer was charged twice", CardholderReference: "CH4242424242"}
		}
		pv, err := e.preview(t, carol, helpdeskv1.HelpdeskService_IssueRefund_FullMethodName, refund(2500))
		mustOK(t, err)
		before := pv.GetAllowed().GetDigest()
		// The invocation the preview named runs: the preview fenced nothing.
		named := fmt.Sprintf("inv-preview-%d", invocations.Load())
		_, err = e.exec.IssueRefund(redeliver(t, carol, named), refund(3000))
		mustOK(t, err)
		pv, err = e.preview(t, carol, helpdeskv1.HelpdeskService_IssueRefund_FullMethodName, refund(1000))
		mustOK(t, err)
		if got := pv.GetAllowed().GetEffects(); len(got) != 1 || got[0].GetText() != "refund 10.00 EUR of 49.90 EUR paid; 30.00 EUR refunded so far" {
			t.Fatalf("after 30.00 EUR refunded: %v", got)
		}
		pv, err = e.preview(t, carol, helpdeskv1.HelpdeskService_IssueRefund_FullMethodName, refund(2500))
		mustOK(t, err)
		r := pv.GetRefusal()
		if r.GetError().GetStage() != helpdesk.StagePreInvariant || r.GetError().GetCode() != helpdesk.CodeRefundExceedsPaid ||
			codes.Code(r.GetGrpcCode()) != codes.FailedPrecondition || r.GetError().GetMessage() != "at most 19.90 EUR of ticket T-1001 can still be refunded" {
			t.Fatalf("25.00 EUR of the 19.90 EUR left: %v (the first preview's digest was %s)", pv, before)
		}
		if r.GetError().GetInvocationId() != fmt.Sprintf("inv-preview-%d", invocations.Load()) {
			t.Errorf("the refusal names invocation %q", r.GetError().GetInvocationId())
		}
	})
}

// TestPreviewSubmit: the submit's preview refuses what the submit refuses (not the owner, not
// a draft, no such report) and describes the submit of alice's draft.
func TestPreviewSubmit(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		for _, tc := range []struct {
			as          principal
			report      string
			stage, code string
		}{
			{user("bob"), "ER-2001", helpdesk.StageScopeCheck, "scope.denied"},
			{user("alice"), "ER-2002", helpdesk.StageStateCheck, helpdesk.CodeNotDraft},
			{user("alice"), "ER-2999", helpdesk.StageStateCheck, helpdesk.CodeNotFound},
		} {
			req := &helpdeskv1.SubmitExpenseReportRequest{ReportId: tc.report}
			pv, err := e.preview(t, tc.as, helpdeskv1.HelpdeskService_SubmitExpenseReport_FullMethodName, req)
			mustOK(t, err)
			if r := pv.GetRefusal(); r.GetError().GetStage() != tc.stage || r.GetError().GetCode() != tc.code {
				t.Fatalf("%s submitting %s: %v", tc.as, tc.report, pv)
			}
			_, err = e.exec.SubmitExpenseReport(as(t, tc.as), req)
			checkRefusal(t, err, refusal{codes.Code(pv.GetRefusal().GetGrpcCode()), tc.stage, tc.code})
		}
		pv, err := e.preview(t, user("alice"), helpdeskv1.HelpdeskService_SubmitExpenseReport_FullMethodName, &helpdeskv1.SubmitExpenseReportRequest{ReportId: "ER-2001"})
		mustOK(t, err)
		got := pv.GetAllowed().GetEffects()
		if len(got) != 1 || got[0].GetKind() != "submit" || !regexp.MustCompile(`^submit expense report ER-2001 \(\d+ lines?, \d+\.\d\d EUR\) to the manager for approval$`).MatchString(got[0].GetText()) {
			t.Fatalf("the submit's effects: %v", got)
		}
		r, err := e.store.Report(testCtx(t), "acme", "ER-2001")
		if err != nil || r.State != helpdesk.ReportDraft {
			t.Fatalf("the preview changed the report: %v %v", r.State, err)
		}
	})
}

// TestPreviewNotOfEveryMethod: a method without a preview is answered Unimplemented, which the
// executor reads as "no preview".
func TestPreviewNotOfEveryMethod(t *testing.T) {
	e := start(t, memoryStore)
	_, err := e.preview(t, user("carol"), helpdeskv1.HelpdeskService_GetTicket_FullMethodName, &helpdeskv1.GetTicketRequest{TicketId: "T-1001"})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("a method without a preview: %v", err)
	}
}

// TestPreviewErase (issue 27 §2: the sample's erase implements the
// preflight): on each store, the preview of an erasure counts the tickets
// whose email it would replace — matched case-insensitively, as the
// erasure matches them — says it cannot be undone, never repeats the
// email, and changes nothing; once the erasure ran, the same preview says
// it would erase nothing. A malformed email is refused as the command
// refuses it.
func TestPreviewErase(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		method := helpdeskv1.HelpdeskService_EraseCustomer_FullMethodName
		effect := func(email string) string {
			t.Helper()
			pv, err := e.preview(t, user("alice"), method, &helpdeskv1.EraseCustomerRequest{CustomerEmail: email, Reason: "DR-1"})
			mustOK(t, err)
			got := pv.GetAllowed().GetEffects()
			if len(got) != 1 || got[0].GetKind() != "erase" {
				t.Fatalf("the erasure's effects for %s: %v", email, pv)
			}
			if txt := got[0].GetText(); regexp.MustCompile(`(?i)@example`).MatchString(txt) {
				t.Fatalf("the effect repeats the email: %q", txt)
			}
			return got[0].GetText()
		}
		if got := effect("Jane.Doe@Example.com"); got != "replace this customer's email by a tombstone on 2 tickets; this cannot be undone" {
			t.Fatalf("jane's erasure: %q", got)
		}
		if got := effect("li.wei@example.com"); got != "replace this customer's email by a tombstone on 1 ticket; this cannot be undone" {
			t.Fatalf("li's erasure: %q", got)
		}
		if got := effect("nobody@example.com"); got != "erase nothing: no ticket of this tenant has this customer's email" {
			t.Fatalf("nobody's erasure: %q", got)
		}
		tk, err := e.store.Ticket(testCtx(t), "acme", "T-1001")
		if err != nil || tk.CustomerEmail != "jane.doe@example.com" {
			t.Fatalf("the preview changed the ticket: %q %v", tk.CustomerEmail, err)
		}
		if _, err := e.exec.EraseCustomer(as(t, user("alice")), &helpdeskv1.EraseCustomerRequest{CustomerEmail: "jane.doe@example.com", Reason: "DR-1"}); err != nil {
			t.Fatal(err)
		}
		if got := effect("jane.doe@example.com"); got != "erase nothing: no ticket of this tenant has this customer's email" {
			t.Fatalf("jane's erasure once erased: %q", got)
		}
		pv, err := e.preview(t, user("alice"), method, &helpdeskv1.EraseCustomerRequest{CustomerEmail: "not-an-email", Reason: "DR-1"})
		mustOK(t, err)
		r := pv.GetRefusal().GetError()
		if r.GetCode() == "" {
			t.Fatalf("a malformed email's preview: %v", pv)
		}
		_, err = e.exec.EraseCustomer(as(t, user("alice")), &helpdeskv1.EraseCustomerRequest{CustomerEmail: "not-an-email", Reason: "DR-1"})
		checkRefusal(t, err, refusal{codes.Code(pv.GetRefusal().GetGrpcCode()), r.GetStage(), r.GetCode()})
	})
}
