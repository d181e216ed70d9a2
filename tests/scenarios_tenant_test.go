package tests

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// TestScenarioCrossTenant: dave (globex) reaching for acme's records. A
// call naming acme (x-mandate-tenant) is refused at scope_check with
// scope.tenant_mismatch (docs/architecture/pipeline.md), a refund before anyone is asked; a token that claims dave is in acme is
// refused at authenticate; an id that exists only in acme is not found in
// globex; and the same id in both tenants reads globex's record. Nothing of
// acme leaks, no money moves, nobody is asked, and every attempt is in the
// trail of the tenant the caller claimed.
func TestScenarioCrossTenant(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	dave := tp.token("globex", "dave", "")
	client := tp.helpdeskClient()
	invocations := map[string]string{} // invocation → what it was

	_, err := client.GetTicket(tp.as(dave, "x-mandate-tenant", "acme"), &helpdeskv1.GetTicketRequest{TicketId: "T-1001"})
	ce := wantGRPCRefusal(t, err, codes.PermissionDenied, "scope_check", "scope.tenant_mismatch")
	invocations[ce.GetInvocationId()] = "scope_check/scope.tenant_mismatch"

	_, err = client.IssueRefund(tp.as(dave, "x-mandate-tenant", "acme"), &helpdeskv1.IssueRefundRequest{
		TicketId: "T-1001", Amount: &helpdeskv1.Money{CurrencyCode: "EUR", AmountMinor: 2500},
		Reason: "Customer was charged twice", CardholderReference: cardholderReference,
	})
	ce = wantGRPCRefusal(t, err, codes.PermissionDenied, "scope_check", "scope.tenant_mismatch")
	invocations[ce.GetInvocationId()] = "scope_check/scope.tenant_mismatch"

	// T-1002 exists in acme only: over REST (which names no tenant but the
	// token's) it is not found.
	notFound := tp.rest("executor", http.MethodGet, "/v1/tickets/T-1002", dave, "")
	wantProblem(t, notFound, http.StatusNotFound, "state_check", "state.not_found")
	invocations[notFound.body["invocation_id"].(string)] = "state_check/state.not_found"
	_, err = client.GetTicket(tp.as(dave), &helpdeskv1.GetTicketRequest{TicketId: "T-1002"})
	ce = wantGRPCRefusal(t, err, codes.NotFound, "state_check", "state.not_found")
	invocations[ce.GetInvocationId()] = "state_check/state.not_found"

	// T-1001 exists in both: dave reads globex's.
	ticket, err := client.GetTicket(tp.as(dave), &helpdeskv1.GetTicketRequest{TicketId: "T-1001"})
	if err != nil || ticket.GetSubject() != "Shipment arrived damaged" || ticket.GetAmountPaid().GetCurrencyCode() != "USD" {
		t.Fatalf("dave's T-1001: %v %v", ticket, err)
	}
	found, err := client.SearchTickets(tp.as(dave), &helpdeskv1.SearchTicketsRequest{Query: "charged twice"})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(found.GetTickets()); !strings.Contains(got, "Charged twice for invoice 88") || strings.Contains(got, "order 4471") {
		t.Fatalf("dave's search: %s", got)
	}

	// A token claiming dave belongs to acme: acme's directory has no dave.
	claimed := tp.rest("executor", http.MethodPost, "/v1/commands/ticket.get:execute", tp.token("acme", "dave", ""), `{"input":{"ticket_id":"T-1001"}}`)
	wantProblem(t, claimed, http.StatusForbidden, "authenticate", "authorization.principal_inactive")

	tp.wantRefunds(0, 0)
	if n := tp.challenges("acme") + tp.challenges("globex"); n != 0 {
		t.Fatalf("%d challenges opened", n)
	}

	// globex's trail holds dave's refused attempts with their stage and code.
	var rows []map[string]any
	for inv := range invocations {
		// Refused before dispatch: one row; refused by the backend: the
		// intent and the outcome.
		want := map[string]int{"scope_check/scope.tenant_mismatch": 1, "state_check/state.not_found": 2}[invocations[inv]]
		rows = append(rows, waitRows(t, tp, "globex", inv, want)...)
	}
	for _, r := range rows {
		if r["Phase"] != "outcome" {
			continue
		}
		if r["Tenant"] != "globex" || r["UserID"] != "dave" || r["Outcome"] != "refused" || fmt.Sprint(r["Stage"], "/", r["Code"]) != invocations[r["InvocationID"].(string)] {
			t.Fatalf("globex row %v", r)
		}
	}
	// acme's trail has dave only where his token claimed acme, refused.
	var daves []*mandatev1.AuditRecord
	for _, r := range tp.query(&mandatev1.QueryRequest{}) {
		if r.GetUserId() == "dave" {
			daves = append(daves, r)
		}
	}
	if len(daves) != 1 || daves[0].GetInvocationId() != claimed.body["invocation_id"] || daves[0].GetStage() != "authenticate" || daves[0].GetOutcome() != "refused" {
		t.Fatalf("dave in acme's trail: %v", daves)
	}
}

// waitRows reads an invocation's rows from a tenant's trail with the
// operator tool until want rows are there, and fails unless exactly want are.
func waitRows(t *testing.T, tp *topology, tenant, invocation string, want int) []map[string]any {
	t.Helper()
	var rows []map[string]any
	for range 100 {
		rows = rows[:0]
		for _, r := range tp.otherTenantRows(tenant) {
			if r["InvocationID"] == invocation {
				rows = append(rows, r)
			}
		}
		if len(rows) >= want {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(rows) != want {
		t.Fatalf("%s invocation %s has %d rows, want %d: %v", tenant, invocation, len(rows), want, rows)
	}
	return rows
}
