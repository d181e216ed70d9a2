package helpdesk_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	"github.com/mandate-dev/mandate/examples/helpdesk/memory"
	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/pkg/backend"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

var notFound = refusal{codes.NotFound, helpdesk.StageStateCheck, helpdesk.CodeNotFound}

func TestTrust(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		t.Run("any Mandate service", func(t *testing.T) { testTrust(t, start(t, newStore), false) })
		t.Run("trusted services only", func(t *testing.T) { testTrust(t, start(t, newStore, trusting("executor")), true) })
	})
}

func testTrust(t *testing.T, e *env, onlyExecutor bool) {
	svcToken, err := identity.MintService(serviceSecret, issuer, audience, "executor", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	notVia := refusal{codes.PermissionDenied, helpdesk.StageScopeCheck, backend.CodeScopeNotViaExecutor}
	refund := &helpdeskv1.IssueRefundRequest{TicketId: "T-1001", Amount: eur(100), Reason: "Goodwill", CardholderReference: "CH4242424242"}
	tests := []struct {
		name string
		call func() error
		want *refusal
	}{
		{"user through the executor", func() error {
			_, err := e.exec.GetTicket(as(t, user("alice")), &helpdeskv1.GetTicketRequest{TicketId: "T-1001"})
			return err
		}, nil},
		{"agent through the executor", func() error {
			_, err := e.exec.GetTicket(as(t, agent("support-bot", "alice")), &helpdeskv1.GetTicketRequest{TicketId: "T-1001"})
			return err
		}, nil},
		{"user calling directly", func() error {
			_, err := e.direct.GetTicket(bearer(t, token(t, user("alice"))), &helpdeskv1.GetTicketRequest{TicketId: "T-1001"})
			return err
		}, &notVia},
		{"agent calling directly", func() error {
			_, err := e.direct.SearchTickets(bearer(t, token(t, agent("support-bot", "alice"))), &helpdeskv1.SearchTicketsRequest{})
			return err
		}, &notVia},
		{"refund by a user calling directly", func() error {
			_, err := e.direct.IssueRefund(bearer(t, token(t, user("carol"))), refund)
			return err
		}, &notVia},
		{"relayed by another Mandate service", func() error {
			_, err := e.service("mcpbridge").IssueRefund(as(t, user("carol")), refund)
			return err
		}, map[bool]*refusal{true: &notVia, false: nil}[onlyExecutor]},
		{"service token without a user", func() error {
			_, err := e.direct.GetTicket(bearer(t, svcToken), &helpdeskv1.GetTicketRequest{TicketId: "T-1001"})
			return err
			// A service token alone authenticates (the executor asks for receipts with it),
			// but a command is served only for the user a service relays.
		}, &refusal{codes.Unauthenticated, identity.Stage, backend.CodeAuthenticationMissingCredentials}},
		{"no token", func() error {
			_, err := e.direct.GetTicket(testCtx(t), &helpdeskv1.GetTicketRequest{TicketId: "T-1001"})
			return err
		}, &refusal{codes.Unauthenticated, identity.Stage, backend.CodeAuthenticationMissingCredentials}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if tt.want == nil {
				mustOK(t, err)
				return
			}
			checkRefusal(t, err, *tt.want)
		})
	}
	wantRefunds := map[bool]int{true: 0, false: 1}[onlyExecutor] // only the relayed refund
	if e.gw.Refunds() != wantRefunds {
		t.Errorf("gateway counted %d refunds, want %d: refused callers moved money", e.gw.Refunds(), wantRefunds)
	}
	if tk, _ := e.store.Ticket(testCtx(t), "acme", "T-1001"); tk.Refunded.Minor != int64(wantRefunds)*100 {
		t.Errorf("booked %+v, want %d refunds of 1.00 EUR", tk.Refunded, wantRefunds)
	}
}

func TestInvocationIDInRefusals(t *testing.T) {
	e := start(t, memoryStore)
	ctx := withCall(t, identity.WithRawToken(testCtx(t), token(t, user("alice"))), call{invocationID: "inv-quote-me"})
	_, err := e.exec.GetTicket(ctx, &helpdeskv1.GetTicketRequest{TicketId: "T-9999"})
	if ce := checkRefusal(t, err, notFound); ce.GetInvocationId() != "inv-quote-me" {
		t.Errorf("invocation id = %q, want the one the executor sent", ce.GetInvocationId())
	}
}

func ticketIDs(ts []*helpdeskv1.Ticket) []string {
	out := make([]string, 0, len(ts))
	for _, tk := range ts {
		out = append(out, tk.GetTicketId())
	}
	return out
}

func TestSearchTickets(t *testing.T) {
	open := helpdeskv1.TicketStatus_TICKET_STATUS_OPEN
	closed := helpdeskv1.TicketStatus_TICKET_STATUS_CLOSED
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		tests := []struct {
			name string
			as   principal
			req  *helpdeskv1.SearchTicketsRequest
			want []string
			next bool
			err  *refusal
		}{
			{"all of acme, newest first", user("alice"), &helpdeskv1.SearchTicketsRequest{}, []string{"T-1002", "T-1001", "T-1003"}, false, nil},
			{"text", user("alice"), &helpdeskv1.SearchTicketsRequest{Query: "charged twice"}, []string{"T-1001", "T-1003"}, false, nil},
			{"text and status", user("alice"), &helpdeskv1.SearchTicketsRequest{Query: "CHARGED TWICE", Statuses: []helpdeskv1.TicketStatus{open}}, []string{"T-1001"}, false, nil},
			{"statuses", user("alice"), &helpdeskv1.SearchTicketsRequest{Statuses: []helpdeskv1.TicketStatus{closed, open}}, []string{"T-1001", "T-1003"}, false, nil},
			{"customer", user("alice"), &helpdeskv1.SearchTicketsRequest{CustomerEmail: new("jane.doe@example.com")}, []string{"T-1001", "T-1003"}, false, nil},
			{"tags", user("alice"), &helpdeskv1.SearchTicketsRequest{Tags: []string{"billing", "double-charge"}}, []string{"T-1001"}, false, nil},
			{"created after", user("alice"), &helpdeskv1.SearchTicketsRequest{CreatedAfter: timestamppb.New(helpdesk.SeedTime.AddDate(0, 0, -7))}, []string{"T-1002", "T-1001"}, false, nil},
			{"first page", user("alice"), &helpdeskv1.SearchTicketsRequest{PageSize: new(int32(2))}, []string{"T-1002", "T-1001"}, true, nil},
			{"globex sees only its own", user("dave"), &helpdeskv1.SearchTicketsRequest{Query: "charged twice"}, []string{"T-2001"}, false, nil},
			{"an agent sees its user's tenant", agent("support-bot", "alice"), &helpdeskv1.SearchTicketsRequest{Tags: []string{"billing"}}, []string{"T-1001", "T-1003"}, false, nil},
			{"malformed page token", user("alice"), &helpdeskv1.SearchTicketsRequest{PageToken: "not-a-token"}, nil, false,
				&refusal{codes.InvalidArgument, helpdesk.StageSchemaValidate, backend.CodeSchemaInvalidPageToken}},
			{"status outside the enum is refused by validation", user("alice"), &helpdeskv1.SearchTicketsRequest{Statuses: []helpdeskv1.TicketStatus{0}}, nil, false,
				&refusal{codes.InvalidArgument, "schema_validate", "schema.invalid"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				resp, err := e.exec.SearchTickets(as(t, tt.as), tt.req)
				if tt.err != nil {
					checkRefusal(t, err, *tt.err)
					return
				}
				mustOK(t, err)
				if got := ticketIDs(resp.GetTickets()); !slices.Equal(got, tt.want) {
					t.Errorf("tickets = %v, want %v", got, tt.want)
				}
				if (resp.GetNextPageToken() != "") != tt.next {
					t.Errorf("next_page_token = %q, want one: %v", resp.GetNextPageToken(), tt.next)
				}
			})
		}

		t.Run("pages", func(t *testing.T) {
			var got []string
			req := &helpdeskv1.SearchTicketsRequest{PageSize: new(int32(1))}
			for range 10 {
				resp, err := e.exec.SearchTickets(as(t, user("alice")), req)
				mustOK(t, err)
				got = append(got, ticketIDs(resp.GetTickets())...)
				if resp.GetNextPageToken() == "" {
					break
				}
				req.PageToken = resp.GetNextPageToken()
			}
			if want := []string{"T-1002", "T-1001", "T-1003"}; !slices.Equal(got, want) {
				t.Errorf("pages = %v, want %v", got, want)
			}
		})
		t.Run("a page token is bound to its search", func(t *testing.T) {
			resp, err := e.exec.SearchTickets(as(t, user("alice")), &helpdeskv1.SearchTicketsRequest{PageSize: new(int32(1))})
			mustOK(t, err)
			_, err = e.exec.SearchTickets(as(t, user("alice")), &helpdeskv1.SearchTicketsRequest{PageSize: new(int32(1)), Query: "charged", PageToken: resp.GetNextPageToken()})
			checkRefusal(t, err, refusal{codes.InvalidArgument, helpdesk.StageSchemaValidate, backend.CodeSchemaInvalidPageToken})
			_, err = e.exec.SearchTickets(as(t, user("dave")), &helpdeskv1.SearchTicketsRequest{PageSize: new(int32(1)), PageToken: resp.GetNextPageToken()})
			checkRefusal(t, err, refusal{codes.InvalidArgument, helpdesk.StageSchemaValidate, backend.CodeSchemaInvalidPageToken})
		})
	})
}

func TestGetTicket(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		tests := []struct {
			name    string
			as      principal
			id      string
			subject string
			paid    *helpdeskv1.Money
			err     *refusal
		}{
			{"acme's T-1001", user("alice"), "T-1001", "Customer charged twice for order 4471", eur(4990), nil},
			{"globex's T-1001 has the same id and other content", user("dave"), "T-1001", "Shipment arrived damaged", usd(12500), nil},
			{"a ticket of another tenant does not exist", user("dave"), "T-1002", "", nil, &notFound},
			{"nor the other way round", user("alice"), "T-2001", "", nil, &notFound},
			{"unknown id", user("alice"), "T-9999", "", nil, &notFound},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				got, err := e.exec.GetTicket(as(t, tt.as), &helpdeskv1.GetTicketRequest{TicketId: tt.id})
				if tt.err != nil {
					checkRefusal(t, err, *tt.err)
					return
				}
				mustOK(t, err)
				if got.GetSubject() != tt.subject || got.GetAmountPaid().GetAmountMinor() != tt.paid.GetAmountMinor() ||
					got.GetAmountPaid().GetCurrencyCode() != tt.paid.GetCurrencyCode() || got.GetAmountRefunded() != nil {
					t.Errorf("ticket = %v", got)
				}
			})
		}
	})
}

func TestIssueRefund(t *testing.T) {
	req := func(id string, amount *helpdeskv1.Money) *helpdeskv1.IssueRefundRequest {
		return &helpdeskv1.IssueRefundRequest{TicketId: id, Amount: amount, Reason: "Customer was charged twice", CardholderReference: "CH4242424242"}
	}
	tests := []struct {
		name     string
		as       principal
		req      *helpdeskv1.IssueRefundRequest
		err      *refusal
		moved    map[string]int64 // what the gateway moved; empty for a refusal
		tenant   string
		refunded int64 // the ticket's amount_refunded afterwards
	}{
		{"part of what was paid", user("carol"), req("T-1001", eur(2500)), nil, map[string]int64{"EUR": 2500}, "acme", 2500},
		{"all of what was paid", user("carol"), req("T-1001", eur(4990)), nil, map[string]int64{"EUR": 4990}, "acme", 4990},
		{"by an agent for carol", agent("finance-bot", "carol"), req("T-1001", eur(100)), nil, map[string]int64{"EUR": 100}, "acme", 100},
		{"more than was paid", user("carol"), req("T-1001", eur(4991)), &refusal{codes.FailedPrecondition, helpdesk.StagePreInvariant, helpdesk.CodeRefundExceedsPaid}, nil, "acme", 0},
		{"another currency", user("carol"), req("T-1001", usd(100)), &refusal{codes.FailedPrecondition, helpdesk.StagePreInvariant, helpdesk.CodeRefundCurrencyMismatch}, nil, "acme", 0},
		{"a closed ticket", user("carol"), req("T-1003", eur(100)), &refusal{codes.FailedPrecondition, helpdesk.StageStateCheck, helpdesk.CodeTicketClosed}, nil, "acme", 1990},
		{"a ticket nothing was paid on", user("carol"), req("T-1002", eur(100)), &refusal{codes.FailedPrecondition, helpdesk.StagePreInvariant, helpdesk.CodeRefundExceedsPaid}, nil, "acme", 0},
		{"an unknown ticket", user("carol"), req("T-9999", eur(100)), &notFound, nil, "", 0},
		{"a ticket of another tenant", user("dave"), req("T-1002", eur(100)), &notFound, nil, "", 0},
		{"globex's own T-1001", user("dave"), req("T-1001", usd(5000)), nil, map[string]int64{"USD": 5000}, "globex", 5000},
		{"a zero amount is refused by validation", user("carol"), req("T-1001", eur(0)), &refusal{codes.InvalidArgument, "schema_validate", "schema.invalid"}, nil, "acme", 0},
	}
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				e := start(t, newStore)
				got, err := e.exec.IssueRefund(as(t, tt.as), tt.req)
				if tt.err != nil {
					checkRefusal(t, err, *tt.err)
				} else {
					mustOK(t, err)
					if got.GetRefundId() != "RF-3001" || got.GetStatus() != helpdeskv1.RefundStatus_REFUND_STATUS_ACCEPTED ||
						got.GetAmount().GetAmountMinor() != tt.req.GetAmount().GetAmountMinor() || got.GetIssuedAt() == nil {
						t.Errorf("refund = %v", got)
					}
				}
				wantRefunds := 0
				if len(tt.moved) > 0 {
					wantRefunds = 1
				}
				if e.gw.Refunds() != wantRefunds || !equalMoved(e.gw.Moved(), tt.moved) {
					t.Errorf("gateway: %d refunds moving %v; want %d moving %v", e.gw.Refunds(), e.gw.Moved(), wantRefunds, tt.moved)
				}
				if tt.tenant != "" {
					tk, err := e.store.Ticket(testCtx(t), tt.tenant, tt.req.GetTicketId())
					if err != nil {
						t.Fatal(err)
					}
					if tk.Refunded.Minor != tt.refunded {
						t.Errorf("%s %s refunded = %v, want %d", tt.tenant, tk.ID, tk.Refunded, tt.refunded)
					}
					rows, _ := e.store.Refunds(testCtx(t), tt.tenant, tt.req.GetTicketId())
					if len(rows) != wantRefunds {
						t.Errorf("%d refund rows, want %d", len(rows), wantRefunds)
					}
					if len(rows) == 1 && (rows[0].RequestedBy != tt.as.user || rows[0].AgentID != tt.as.agent || !strings.HasPrefix(rows[0].InvocationID, "inv-")) {
						t.Errorf("refund row = %+v, want it to name %s and the invocation", rows[0], tt.as)
					}
				}
				if tt.tenant == "globex" {
					// The same id in acme is untouched.
					if tk, _ := e.store.Ticket(testCtx(t), "acme", "T-1001"); !tk.Refunded.IsZero() {
						t.Errorf("acme's T-1001 refunded %v by a globex refund", tk.Refunded)
					}
				}
			})
		}
	})
}

func equalMoved(got, want map[string]int64) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

func TestRefundsAddUp(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		req := &helpdeskv1.IssueRefundRequest{TicketId: "T-1001", Amount: eur(2500), Reason: "First half", CardholderReference: "CH4242424242"}
		_, err := e.exec.IssueRefund(as(t, user("carol")), req)
		mustOK(t, err)
		// 49.90 paid, 25.00 refunded: another 25.00 is 0.10 too much.
		_, err = e.exec.IssueRefund(as(t, user("carol")), req)
		ce := checkRefusal(t, err, refusal{codes.FailedPrecondition, helpdesk.StagePreInvariant, helpdesk.CodeRefundExceedsPaid})
		if !strings.Contains(ce.GetMessage(), "24.90 EUR") {
			t.Errorf("message %q does not say what is left", ce.GetMessage())
		}
		req.Amount = eur(2490)
		_, err = e.exec.IssueRefund(as(t, user("carol")), req)
		mustOK(t, err)
		got, err := e.exec.GetTicket(as(t, user("alice")), &helpdeskv1.GetTicketRequest{TicketId: "T-1001"})
		mustOK(t, err)
		if got.GetAmountRefunded().GetAmountMinor() != 4990 || got.GetAmountRefunded().GetCurrencyCode() != "EUR" {
			t.Errorf("amount_refunded = %v, want 49.90 EUR", got.GetAmountRefunded())
		}
		if e.gw.Refunds() != 2 || e.gw.Moved()["EUR"] != 4990 {
			t.Errorf("gateway: %d refunds moving %v; want 2 moving 4990 EUR", e.gw.Refunds(), e.gw.Moved())
		}
	})
}

// TestConcurrentRefunds fires more refunds than were paid at once: the ticket's lock makes
// exactly as many succeed as fit, and the gateway moves exactly that.
func TestConcurrentRefunds(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		const n = 10
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				_, errs[i] = e.exec.IssueRefund(as(t, user("carol")), &helpdeskv1.IssueRefundRequest{
					TicketId: "T-1001", Amount: eur(1000), Reason: "Partial refund", CardholderReference: "CH4242424242",
				})
			})
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			if err == nil {
				ok++
				continue
			}
			checkRefusal(t, err, refusal{codes.FailedPrecondition, helpdesk.StagePreInvariant, helpdesk.CodeRefundExceedsPaid})
		}
		if ok != 4 || e.gw.Refunds() != 4 || e.gw.Moved()["EUR"] != 4000 {
			t.Errorf("%d refunds succeeded, gateway counted %d moving %v; want 4 moving 4000 EUR", ok, e.gw.Refunds(), e.gw.Moved())
		}
		tk, _ := e.store.Ticket(testCtx(t), "acme", "T-1001")
		rows, _ := e.store.Refunds(testCtx(t), "acme", "T-1001")
		if tk.Refunded.Minor != 4000 || len(rows) != 4 {
			t.Errorf("booked %v in %d rows, want 4000 in 4", tk.Refunded, len(rows))
		}
	})
}

func TestGatewayDown(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		e.gw.Fail(errors.New("connection reset by gateway.example"))
		req := &helpdeskv1.IssueRefundRequest{TicketId: "T-1001", Amount: eur(1000), Reason: "Goodwill", CardholderReference: "CH4242424242"}
		_, err := e.exec.IssueRefund(as(t, user("carol")), req)
		ce := checkRefusal(t, err, refusal{codes.Unavailable, helpdesk.StageDispatch, helpdesk.CodeGatewayUnavailable})
		if !ce.GetRetriable() || strings.Contains(ce.GetMessage(), "gateway.example") {
			t.Errorf("refusal = %v, want retriable and without the gateway's error text", ce)
		}
		tk, _ := e.store.Ticket(testCtx(t), "acme", "T-1001")
		rows, _ := e.store.Refunds(testCtx(t), "acme", "T-1001")
		if !tk.Refunded.IsZero() || len(rows) != 0 || e.gw.Refunds() != 0 {
			t.Fatalf("a failed gateway call booked %v in %d rows", tk.Refunded, len(rows))
		}
		e.gw.Fail(nil)
		got, err := e.exec.IssueRefund(as(t, user("carol")), req)
		mustOK(t, err)
		if got.GetRefundId() != "RF-3001" {
			t.Errorf("retry got %s; the failed attempt should not have used up RF-3001", got.GetRefundId())
		}
	})
}

func TestRefundIdempotencyKey(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		req := func(minor int64) *helpdeskv1.IssueRefundRequest {
			return &helpdeskv1.IssueRefundRequest{TicketId: "T-1001", Amount: eur(minor), Reason: "Goodwill", CardholderReference: "CH4242424242"}
		}
		first, err := e.exec.IssueRefund(as(t, user("carol"), "key-1"), req(1000))
		mustOK(t, err)
		again, err := e.exec.IssueRefund(as(t, user("carol"), "key-1"), req(1000))
		mustOK(t, err)
		if again.GetRefundId() != first.GetRefundId() || e.gw.Refunds() != 1 {
			t.Errorf("retry with the same key: %s after %s, %d gateway refunds; want the same refund and 1", again.GetRefundId(), first.GetRefundId(), e.gw.Refunds())
		}
		_, err = e.exec.IssueRefund(as(t, user("carol"), "key-1"), req(2000))
		checkRefusal(t, err, refusal{codes.FailedPrecondition, helpdesk.StageIdempotencyCheck, backend.CodeIdempotencyKeyReused})
		other, err := e.exec.IssueRefund(as(t, user("carol"), "key-2"), req(1000))
		mustOK(t, err)
		if other.GetRefundId() == first.GetRefundId() || e.gw.Refunds() != 2 || e.gw.Moved()["EUR"] != 2000 {
			t.Errorf("a new key: refund %s, gateway %d moving %v; want a second refund", other.GetRefundId(), e.gw.Refunds(), e.gw.Moved())
		}
		_, err = e.exec.IssueRefund(as(t, user("carol"), strings.Repeat("k", receipt.MaxIdempotencyKeyLen+1)), req(1000))
		checkRefusal(t, err, refusal{codes.InvalidArgument, helpdesk.StageIdempotencyCheck, backend.CodeInvalidKey})
		if e.gw.Refunds() != 2 {
			t.Errorf("refused calls moved money: %d refunds", e.gw.Refunds())
		}
	})
}

func TestGateway(t *testing.T) {
	g := helpdesk.NewGateway()
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			cur := "EUR"
			if i%2 == 1 {
				cur = "USD"
			}
			if _, err := g.Refund(ctx, helpdesk.GatewayRefund{Reference: "r", Amount: helpdesk.Money{Currency: cur, Minor: 10}, CardholderReference: "CH1"}); err != nil {
				t.Error(err)
			}
			_ = g.Moved()
		})
	}
	wg.Wait()
	if g.Refunds() != 50 || !equalMoved(g.Moved(), map[string]int64{"EUR": 250, "USD": 250}) {
		t.Fatalf("refunds %d moved %v", g.Refunds(), g.Moved())
	}
	g.Moved()["EUR"] = 0
	if g.Moved()["EUR"] != 250 {
		t.Error("Moved returned the gateway's own map")
	}
	g.Fail(errors.New("down"))
	if _, err := g.Refund(ctx, helpdesk.GatewayRefund{Amount: helpdesk.Money{Currency: "EUR", Minor: 1}, CardholderReference: "CH1"}); err == nil || g.Refunds() != 50 {
		t.Errorf("failing gateway: err %v, %d refunds", err, g.Refunds())
	}
	g.Fail(nil)
	for _, bad := range []helpdesk.GatewayRefund{
		{Amount: helpdesk.Money{Currency: "EUR"}, CardholderReference: "CH1"},
		{Amount: helpdesk.Money{Currency: "EUR", Minor: 1}},
	} {
		if _, err := g.Refund(ctx, bad); err == nil {
			t.Errorf("refund %+v accepted", bad)
		}
	}
	if g.Refunds() != 50 {
		t.Errorf("refused refunds were counted: %d", g.Refunds())
	}
}

// flakyStore fails every call with err once it is set.
type flakyStore struct {
	helpdesk.Store
	mu  sync.Mutex
	err error
}

func (f *flakyStore) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *flakyStore) failure() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func (f *flakyStore) Ticket(ctx context.Context, tenant, id string) (helpdesk.Ticket, error) {
	if err := f.failure(); err != nil {
		return helpdesk.Ticket{}, err
	}
	return f.Store.Ticket(ctx, tenant, id)
}

func (f *flakyStore) InTx(ctx context.Context, fn func(helpdesk.Tx) error) error {
	if err := f.failure(); err != nil {
		return err
	}
	return f.Store.InTx(ctx, fn)
}

// TestStoreFaults checks that store faults reach the client as a retriable
// helpdesk.unavailable or a generic internal.error, never with the driver's text.
func TestStoreFaults(t *testing.T) {
	store := &flakyStore{Store: memory.New()}
	e := start(t, func(*testing.T) helpdesk.Store { return store })
	refund := &helpdeskv1.IssueRefundRequest{TicketId: "T-1001", Amount: eur(100), Reason: "Goodwill", CardholderReference: "CH4242424242"}
	tests := []struct {
		name string
		err  error
		want refusal
	}{
		{"unavailable", fmt.Errorf("%w: dial tcp 10.0.0.5:5432: connection refused", helpdesk.ErrUnavailable),
			refusal{codes.Unavailable, helpdesk.StageDispatch, helpdesk.CodeUnavailable}},
		{"anything else", errors.New(`relation "helpdesk.secret_table" does not exist`),
			refusal{codes.Internal, helpdesk.StageDispatch, "internal.error"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store.fail(tt.err)
			defer store.fail(nil)
			_, gerr := e.exec.GetTicket(as(t, user("alice")), &helpdeskv1.GetTicketRequest{TicketId: "T-1001"})
			_, rerr := e.exec.IssueRefund(as(t, user("carol")), refund)
			for _, err := range []error{gerr, rerr} {
				ce := checkRefusal(t, err, tt.want)
				if ce.GetRetriable() != (tt.want.code == codes.Unavailable) {
					t.Errorf("retriable = %v", ce.GetRetriable())
				}
				if msg := err.Error(); strings.Contains(msg, "10.0.0.5") || strings.Contains(msg, "secret_table") {
					t.Errorf("the client sees the store's error text: %q", msg)
				}
			}
			if e.gw.Refunds() != 0 {
				t.Errorf("a refund went through a failing store: %d", e.gw.Refunds())
			}
		})
	}
}
