package helpdesk_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/pkg/backend"
)

func erase(email string) *helpdeskv1.EraseCustomerRequest {
	return &helpdeskv1.EraseCustomerRequest{CustomerEmail: email, Reason: "Verified deletion request DR-7"}
}

// customerEmails returns the customer email of each of the tenant's seeded tickets.
func customerEmails(t *testing.T, e *env, tenant string, ids ...string) []string {
	t.Helper()
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		tk, err := e.store.Ticket(testCtx(t), tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tk.CustomerEmail)
	}
	return out
}

func TestEraseCustomer(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		before := time.Now().Add(-time.Second)
		got, err := e.exec.EraseCustomer(as(t, agent("finance-bot", "carol")), erase("Jane.Doe@EXAMPLE.com"))
		mustOK(t, err)
		if got.GetErasureId() != "CE-4001" || got.GetTicketsErased() != 2 || got.GetErasedAt().AsTime().Before(before) {
			t.Errorf("erasure = %v, want CE-4001 erasing jane's 2 tickets just now", got)
		}
		// Both of jane's tickets, closed or not, carry the tombstone; li.wei's and globex's
		// tickets are untouched.
		if got := customerEmails(t, e, "acme", "T-1001", "T-1002", "T-1003"); strings.Join(got, ",") != "erased:CE-4001,li.wei@example.com,erased:CE-4001" {
			t.Errorf("acme's customers after the erasure: %v", got)
		}
		if got := customerEmails(t, e, "globex", "T-1001", "T-2001"); strings.Join(got, ",") != "purchasing@initech.example,accounts@initech.example" {
			t.Errorf("globex's customers after acme's erasure: %v", got)
		}
		search, err := e.exec.SearchTickets(as(t, user("alice")), &helpdeskv1.SearchTicketsRequest{CustomerEmail: proto.String("jane.doe@example.com")})
		mustOK(t, err)
		if len(search.GetTickets()) != 0 {
			t.Errorf("the erased email still finds %v", ticketIDs(search.GetTickets()))
		}
		// The receipt is recorded under the invocation, for the user the agent acted for,
		// and never holds the email.
		receipt, err := e.store.Erasure(testCtx(t), "acme", "CE-4001")
		if err != nil {
			t.Fatal(err)
		}
		if receipt.RequestedBy != "carol" || receipt.AgentID != "finance-bot" || !strings.HasPrefix(receipt.InvocationID, "inv-") ||
			receipt.TicketsErased != 2 || receipt.Reason != "Verified deletion request DR-7" {
			t.Errorf("receipt = %+v", receipt)
		}
		if strings.Contains(strings.ToLower(receipt.Reason+receipt.Tenant+receipt.ID), "jane") {
			t.Errorf("the receipt keeps the erased email: %+v", receipt)
		}

		// Erasing again succeeds with nothing left to erase.
		again, err := e.exec.EraseCustomer(as(t, user("carol")), erase("jane.doe@example.com"))
		mustOK(t, err)
		if again.GetErasureId() != "CE-4002" || again.GetTicketsErased() != 0 {
			t.Errorf("repeated erasure = %v, want CE-4002 erasing nothing", again)
		}
		if got := customerEmails(t, e, "acme", "T-1001"); got[0] != "erased:CE-4001" {
			t.Errorf("a repeated erasure rewrote the tombstone: %v", got)
		}
		// A customer the tenant never had: the same answer, which tells nothing about them.
		none, err := e.exec.EraseCustomer(as(t, user("carol")), erase("nobody@example.com"))
		mustOK(t, err)
		if none.GetTicketsErased() != 0 {
			t.Errorf("erasing an unknown customer = %v", none)
		}
		// Tenants share nothing: globex has its own customers and its own erasure ids.
		if got, err := e.exec.EraseCustomer(as(t, user("dave")), erase("accounts@initech.example")); err != nil || got.GetTicketsErased() != 1 || got.GetErasureId() != "CE-4001" {
			t.Errorf("globex erasure = %v, %v; want its own CE-4001 erasing one ticket", got, err)
		}
	})
}

func TestEraseCustomerIdempotencyKey(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		e := start(t, newStore)
		first, err := e.exec.EraseCustomer(as(t, user("carol"), "erase-1"), erase("jane.doe@example.com"))
		mustOK(t, err)
		again, err := e.exec.EraseCustomer(as(t, user("carol"), "erase-1"), erase("JANE.DOE@example.com"))
		mustOK(t, err)
		if !proto.Equal(again, first) || first.GetTicketsErased() != 2 {
			t.Errorf("retry with the same key = %v, want the first receipt %v", again, first)
		}
		_, err = e.exec.EraseCustomer(as(t, user("carol"), "erase-1"), erase("li.wei@example.com"))
		checkRefusal(t, err, refusal{codes.FailedPrecondition, helpdesk.StageIdempotencyCheck, backend.CodeIdempotencyKeyReused})
		if got := customerEmails(t, e, "acme", "T-1002"); got[0] != "li.wei@example.com" {
			t.Errorf("a refused key erased li.wei: %v", got)
		}
	})
}

func TestEraseCustomerRefusals(t *testing.T) {
	e := start(t, memoryStore)
	notVia := refusal{codes.PermissionDenied, helpdesk.StageScopeCheck, backend.CodeScopeNotViaExecutor}
	tests := []struct {
		name string
		call func() error
		want refusal
	}{
		{"user calling directly", func() error {
			_, err := e.direct.EraseCustomer(bearer(t, token(t, user("carol"))), erase("jane.doe@example.com"))
			return err
		}, notVia},
		{"agent calling directly", func() error {
			_, err := e.direct.EraseCustomer(bearer(t, token(t, agent("finance-bot", "carol"))), erase("jane.doe@example.com"))
			return err
		}, notVia},
		{"not an email", func() error {
			_, err := e.exec.EraseCustomer(as(t, user("carol")), erase("jane.doe"))
			return err
		}, refusal{codes.InvalidArgument, "schema_validate", "schema.invalid"}},
		{"reason too short", func() error {
			_, err := e.exec.EraseCustomer(as(t, user("carol")), &helpdeskv1.EraseCustomerRequest{CustomerEmail: "jane.doe@example.com", Reason: "x"})
			return err
		}, refusal{codes.InvalidArgument, "schema_validate", "schema.invalid"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkRefusal(t, tt.call(), tt.want) })
	}
	if got := customerEmails(t, e, "acme", "T-1001", "T-1003"); strings.Join(got, ",") != "jane.doe@example.com,jane.doe@example.com" {
		t.Errorf("refused erasures changed tickets: %v", got)
	}
}

// TestEraseCustomerStoreDown: an erasure the store cannot make is a retriable refusal that
// changed nothing.
func TestEraseCustomerStoreDown(t *testing.T) {
	st := &flakyStore{Store: memoryStore(t)}
	e := start(t, func(*testing.T) helpdesk.Store { return st })
	st.fail(helpdesk.ErrUnavailable)
	_, err := e.exec.EraseCustomer(as(t, user("carol")), erase("jane.doe@example.com"))
	if ce := checkRefusal(t, err, refusal{codes.Unavailable, helpdesk.StageDispatch, helpdesk.CodeUnavailable}); !ce.GetRetriable() {
		t.Errorf("store outage not retriable: %v", ce)
	}
	st.fail(nil)
	if got := customerEmails(t, e, "acme", "T-1001"); got[0] != "jane.doe@example.com" {
		t.Errorf("a failed erasure changed T-1001: %v", got)
	}
}
