package helpdesk_test

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/internal/manifest"
)

const helpdeskService = "examples.helpdesk.v1.HelpdeskService"

// exampleRuns says who runs each command's declared examples and what must hold afterwards.
// A command of the helpdesk service without an entry fails the test, so a new command cannot
// ship examples nobody ran.
var exampleRuns = map[string]struct {
	as    principal
	check func(t *testing.T, e *env, resp proto.Message)
}{
	"customer.erase": {user("carol"), func(t *testing.T, e *env, resp proto.Message) {
		got := resp.(*helpdeskv1.CustomerErasure)
		if got.GetErasureId() != "CE-4001" || got.GetTicketsErased() != 1 || got.GetErasedAt() == nil {
			t.Errorf("erasure = %v, want CE-4001 erasing li.wei's one ticket", got)
		}
		if tk, err := e.store.Ticket(testCtx(t), "acme", "T-1002"); err != nil || tk.CustomerEmail != "erased:CE-4001" {
			t.Errorf("T-1002 after the erasure: %q %v", tk.CustomerEmail, err)
		}
	}},
	"ticket.search": {user("alice"), func(t *testing.T, _ *env, resp proto.Message) {
		got := resp.(*helpdeskv1.SearchTicketsResponse)
		if len(got.GetTickets()) != 1 || got.GetTickets()[0].GetTicketId() != "T-1001" {
			t.Errorf("tickets = %v, want the open double charge T-1001", got.GetTickets())
		}
	}},
	"ticket.get": {user("alice"), func(t *testing.T, _ *env, resp proto.Message) {
		got := resp.(*helpdeskv1.Ticket)
		if got.GetTicketId() != "T-1001" || got.GetAmountPaid().GetAmountMinor() != 4990 {
			t.Errorf("ticket = %v", got)
		}
	}},
	"ticket.refund": {user("carol"), func(t *testing.T, e *env, resp proto.Message) {
		got := resp.(*helpdeskv1.Refund)
		if got.GetStatus() != helpdeskv1.RefundStatus_REFUND_STATUS_ACCEPTED || got.GetAmount().GetAmountMinor() != 2500 {
			t.Errorf("refund = %v", got)
		}
		if e.gw.Refunds() != 1 || e.gw.Moved()["EUR"] != 2500 {
			t.Errorf("gateway: %d refunds, moved %v; want 1 refund of 2500 EUR", e.gw.Refunds(), e.gw.Moved())
		}
	}},
	"expense.report.create": {user("alice"), func(t *testing.T, _ *env, resp proto.Message) {
		got := resp.(*helpdeskv1.ExpenseReport)
		if got.GetState() != helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_DRAFT || got.GetOwner() != "alice" || got.GetTotal().GetAmountMinor() != 8900 {
			t.Errorf("report = %v", got)
		}
	}},
	"expense.report.submit": {user("alice"), func(t *testing.T, _ *env, resp proto.Message) {
		got := resp.(*helpdeskv1.ExpenseReport)
		if got.GetState() != helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_SUBMITTED || got.GetSubmittedBy() != "alice" {
			t.Errorf("report = %v", got)
		}
	}},
	"expense.report.recall": {user("alice"), func(t *testing.T, _ *env, resp proto.Message) {
		if got := resp.(*helpdeskv1.ExpenseReport); got.GetState() != helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_DRAFT {
			t.Errorf("report = %v", got)
		}
	}},
	"expense.report.approve": {user("bob"), func(t *testing.T, _ *env, resp proto.Message) {
		got := resp.(*helpdeskv1.ExpenseReport)
		if got.GetState() != helpdeskv1.ExpenseReportState_EXPENSE_REPORT_STATE_APPROVED || got.GetApprovedBy() != "bob" {
			t.Errorf("report = %v", got)
		}
	}},
}

// TestManifestExamples runs every example the manifest declares for the helpdesk, exactly as
// written, through the executor's path, against freshly seeded data.
func TestManifestExamples(t *testing.T) {
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	var cmds []*manifest.Command
	for _, cmd := range set.Commands() {
		if cmd.RPC.Service != helpdeskService {
			continue
		}
		if _, ok := exampleRuns[cmd.Code]; !ok {
			t.Errorf("command %s has no entry in exampleRuns", cmd.Code)
			continue
		}
		if len(cmd.Examples) == 0 {
			t.Errorf("command %s declares no example", cmd.Code)
		}
		cmds = append(cmds, cmd)
	}
	if len(cmds) != len(exampleRuns) {
		t.Errorf("the manifest has %d helpdesk commands, exampleRuns %d", len(cmds), len(exampleRuns))
	}
	forEachStore(t, func(t *testing.T, newStore func(*testing.T) helpdesk.Store) {
		for _, cmd := range cmds {
			run := exampleRuns[cmd.Code]
			for _, ex := range cmd.Examples {
				t.Run(cmd.Code+"/"+ex.Description, func(t *testing.T) {
					e := start(t, newStore)
					req := newMessage(t, cmd.RPC.InputType)
					if err := protojson.Unmarshal(ex.Input, req); err != nil {
						t.Fatalf("example input does not decode: %v", err)
					}
					resp := newMessage(t, cmd.RPC.OutputType)
					mustOK(t, e.execConn.Invoke(as(t, run.as), cmd.RPC.FullMethod, req, resp))
					run.check(t, e, resp)
				})
			}
		}
	})
}

func newMessage(t *testing.T, name string) proto.Message {
	t.Helper()
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		t.Fatalf("message %s: %v", name, err)
	}
	return mt.New().Interface()
}
