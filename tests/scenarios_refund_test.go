package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// elicitationCounter is an MCP client elicitation handler that counts the
// prompts it was shown and declines them; a client with it declares the
// elicitation capability, so a bridge that wanted to ask would ask it.
type elicitationCounter struct{ n atomic.Int32 }

func (c *elicitationCounter) handler(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	c.n.Add(1)
	return &mcp.ElicitResult{Action: "decline"}, nil
}

// approveForm is an MCP client elicitation handler that answers a
// confirmation form with accept, as a human clicking "approve" in
// the client would; it records the messages it was shown.
type approveForm struct{ shown []string }

func (a *approveForm) handler(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	a.shown = append(a.shown, req.Params.Message)
	return &mcp.ElicitResult{Action: "accept"}, nil
}

// TestScenarioSearchAsAgent: support-bot, acting for alice, searches
// tickets over MCP. The read runs without any prompt, and its audit rows
// name the agent, its model and the conversation from `_meta`.
func TestScenarioSearchAsAgent(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	var prompts elicitationCounter
	cs := tp.mcpSession(tp.token("acme", "alice", "support-bot"), &mcp.ClientOptions{ElicitationHandler: prompts.handler})

	res := callTool(t, cs, "ticket.search", `{"query":"charged twice"}`, mcp.Meta{"mandate.dev/conversation": "conv-search-1"})
	if res.IsError {
		t.Fatalf("search refused: %s", jsonOf(res.Content))
	}
	got := jsonOf(structured(t, res))
	if !strings.Contains(got, `"ticket_id":"T-1001"`) || !strings.Contains(got, "Customer charged twice for order 4471") {
		t.Fatalf("search results: %s", got)
	}
	if strings.Contains(got, "Shipment arrived damaged") {
		t.Fatalf("search returned globex's ticket: %s", got)
	}
	if n := prompts.n.Load(); n != 0 {
		t.Fatalf("the client was asked to confirm %d times for a read", n)
	}
	if n := tp.challenges("acme"); n != 0 {
		t.Fatalf("%d challenges opened for a read", n)
	}
	inv, _ := res.Meta["mandate.dev/invocation_id"].(string)
	if inv == "" {
		t.Fatalf("no invocation id in the result's _meta: %v", res.Meta)
	}

	rows := tp.invocationRows(inv, 2)
	out := outcome(t, rows, "executed", "", "")
	for _, r := range rows {
		if r.GetCommand() != "ticket.search" || r.GetChannel() != "mcp" || r.GetTenant() != "acme" ||
			r.GetUserId() != "alice" || r.GetActorKind() != "agent" || r.GetAgentId() != "support-bot" ||
			r.GetModel() != scenarioModel || r.GetModelVersion() != scenarioModelVersion ||
			r.GetConversationId() != "conv-search-1" || r.GetMcpSessionId() != cs.ID() || r.GetRisk() != "L0" {
			t.Fatalf("audit row %v", r)
		}
	}
	if out.GetApproval() != nil || out.GetResultDigest() == "" {
		t.Fatalf("outcome row %v", out)
	}
	// The trail answers "which conversation" with the same row.
	if byConv := tp.query(&mandatev1.QueryRequest{ConversationId: "conv-search-1", Phase: "outcome"}); len(byConv) != 1 || byConv[0].GetInvocationId() != inv {
		t.Fatalf("query by conversation: %v", byConv)
	}
	tp.wantRefunds(0, 0)
}

// TestScenarioRefundBySupportBotRefused: support-bot (alice lacks
// payment.refund) asks for a refund over MCP. It is refused at
// permission_check before anyone is asked; no money moves; one audit row.
func TestScenarioRefundBySupportBotRefused(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	var prompts elicitationCounter
	cs := tp.mcpSession(tp.token("acme", "alice", "support-bot"), &mcp.ClientOptions{ElicitationHandler: prompts.handler})

	// The tool is not listed for support-bot …
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if tool.Name == "ticket.refund" {
			t.Fatal("ticket.refund is listed for support-bot")
		}
	}
	// … and calling it anyway is refused by the pipeline, not the list.
	res := callTool(t, cs, "ticket.refund", refundInput, mcp.Meta{"mandate.dev/conversation": "conv-refund-1"})
	m := wantToolRefusal(t, res, "permission_check", "authorization.permission_denied")

	if n := prompts.n.Load(); n != 0 {
		t.Fatalf("the client was asked to confirm a call that is refused (%d prompts)", n)
	}
	if n := tp.challenges("acme"); n != 0 {
		t.Fatalf("%d challenges opened for a refused call", n)
	}
	tp.wantRefunds(0, 0)
	rows := tp.invocationRows(m["invocation_id"].(string), 1)
	out := outcome(t, rows, "refused", "permission_check", "authorization.permission_denied")
	if out.GetCommand() != "ticket.refund" || out.GetAgentId() != "support-bot" || out.GetUserId() != "alice" ||
		out.GetChannel() != "mcp" || out.GetConversationId() != "conv-refund-1" || out.GetSubject() != "" {
		t.Fatalf("refusal row %v", out)
	}
	// Authorisation comes before parsing: nothing of the arguments is kept.
	if strings.Contains(out.GetArgumentsJson(), "T-1001") {
		t.Fatalf("a call refused at permission_check recorded its arguments: %v", out)
	}
	if all := tp.query(&mandatev1.QueryRequest{Command: "ticket.refund"}); len(all) != 1 {
		t.Fatalf("%d ticket.refund rows in the trail, want 1: %v", len(all), all)
	}
}

// financeBotAsks has finance-bot (acting for carol) ask for the refund over
// MCP from a client without elicitation: the call is refused with
// confirmation.required, a challenge and an approval URL on the confirm
// service's pages.
func financeBotAsks(t *testing.T, tp *topology, cs *mcp.ClientSession) (challenge, invocation string) {
	t.Helper()
	res := callTool(t, cs, "ticket.refund", refundInput, mcp.Meta{"mandate.dev/conversation": "conv-finance-1"})
	m := wantToolRefusal(t, res, "confirmation_check", "confirmation.required")
	challenge, _ = m["challenge_id"].(string)
	url, _ := m["approval_url"].(string)
	if challenge == "" || !strings.HasPrefix(url, "http://"+tp.addr["confirm"].http+"/approve/") {
		t.Fatalf("confirmation.required without a challenge or an approval page: %v", m)
	}
	if n := tp.challenges("acme"); n != 1 {
		t.Fatalf("%d challenges opened, want 1", n)
	}
	tp.wantRefunds(0, 0)
	rows := tp.invocationRows(m["invocation_id"].(string), 1)
	outcome(t, rows, "refused", "confirmation_check", "confirmation.required")
	return challenge, m["invocation_id"].(string)
}

// decide records a decision on a challenge through ConfirmService.Decide.
func (tp *topology) decide(tok, challenge string, d mandatev1.Decision) (*mandatev1.Challenge, error) {
	return mandatev1.NewConfirmServiceClient(tp.conn("confirm")).Decide(tp.as(tok),
		&mandatev1.DecideRequest{ChallengeId: challenge, Decision: d})
}

// TestScenarioRefundByFinanceBotDeclined: carol declines finance-bot's
// refund — on the approval page's API, and again in the confirmation form
// of her MCP client — and the call is refused with confirmation.refused;
// no money moves.
func TestScenarioRefundByFinanceBotDeclined(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	bot := tp.token("acme", "carol", "finance-bot")
	cs := tp.mcpSession(bot, nil)
	challenge, _ := financeBotAsks(t, tp, cs)

	// The agent cannot answer for its user.
	if _, err := tp.decide(bot, challenge, mandatev1.Decision_DECISION_APPROVE); err == nil {
		t.Fatal("finance-bot approved its own call")
	} else {
		wantGRPCError(t, err, codes.PermissionDenied, "confirmation_check", "confirmation.approver_not_allowed")
	}
	ch, err := tp.decide(tp.token("acme", "carol", ""), challenge, mandatev1.Decision_DECISION_DECLINE)
	if err != nil || ch.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_DECLINED || ch.GetDecidedBy() != "carol" {
		t.Fatalf("carol declining: %v %v", ch, err)
	}

	res := callTool(t, cs, "ticket.refund", refundInput, mcp.Meta{"mandate.dev/approval": challenge})
	m := wantToolRefusal(t, res, "confirmation_check", "confirmation.refused")
	tp.wantRefunds(0, 0)
	outcome(t, tp.invocationRows(m["invocation_id"].(string), 1), "refused", "confirmation_check", "confirmation.refused")

	// The same refusal when carol declines inside the call, through the
	// confirmation form her MCP client shows (elicitation).
	var prompts elicitationCounter
	withForm := tp.mcpSession(bot, &mcp.ClientOptions{ElicitationHandler: prompts.handler})
	res = callTool(t, withForm, "ticket.refund", refundInput, nil)
	m = wantToolRefusal(t, res, "confirmation_check", "confirmation.refused")
	if n := prompts.n.Load(); n != 1 {
		t.Fatalf("the client was asked %d times, want once", n)
	}
	var state, decidedBy, channel string
	if n := tp.challenges("acme"); n != 2 {
		t.Fatalf("%d challenges, want 2", n)
	}
	if err := tp.db.QueryRow(t.Context(), `SELECT state, decided_by, decision_channel FROM confirm.challenges WHERE id <> $1`,
		challenge).Scan(&state, &decidedBy, &channel); err != nil || state != "DECLINED" || decidedBy != "carol" || channel != "mcp_elicitation" {
		t.Fatalf("the elicited challenge: %s by %s over %s (%v)", state, decidedBy, channel, err)
	}
	outcome(t, tp.invocationRows(m["invocation_id"].(string), 1), "refused", "confirmation_check", "confirmation.refused")

	tp.wantRefunds(0, 0)
	if executed := tp.query(&mandatev1.QueryRequest{Command: "ticket.refund", Outcomes: []string{"executed"}}); len(executed) != 0 {
		t.Fatalf("executed refunds in the trail: %v", executed)
	}
	if intents := tp.query(&mandatev1.QueryRequest{Command: "ticket.refund", Phase: "intent"}); len(intents) != 0 {
		t.Fatalf("declined refunds reached dispatch: %v", intents)
	}
}

// TestScenarioRefundByFinanceBotApproved: carol approves finance-bot's
// refund; the retry with the grant moves the money once, and the audit
// rows name carol as the approver. The grant is single-use.
func TestScenarioRefundByFinanceBotApproved(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	bot := tp.token("acme", "carol", "finance-bot")
	cs := tp.mcpSession(bot, nil)
	challenge, _ := financeBotAsks(t, tp, cs)

	ch, err := tp.decide(tp.token("acme", "carol", ""), challenge, mandatev1.Decision_DECISION_APPROVE)
	if err != nil || ch.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_APPROVED || ch.GetDecidedBy() != "carol" {
		t.Fatalf("carol approving: %v %v", ch, err)
	}
	res := callTool(t, cs, "ticket.refund", refundInput, mcp.Meta{"mandate.dev/approval": challenge, "mandate.dev/conversation": "conv-finance-1"})
	if res.IsError {
		t.Fatalf("approved refund refused: %s", jsonOf(res.Content))
	}
	refund := structured(t, res)
	if refund["ticket_id"] != "T-1001" || refund["status"] != "REFUND_STATUS_ACCEPTED" || !strings.HasPrefix(fmt.Sprint(refund["refund_id"]), "RF-") {
		t.Fatalf("refund result %v", refund)
	}
	tp.wantRefunds(1, 2500)

	inv, _ := res.Meta["mandate.dev/invocation_id"].(string)
	rows := tp.invocationRows(inv, 2)
	outcome(t, rows, "executed", "", "")
	for _, r := range rows {
		a := r.GetApproval()
		if a.GetApprover() != "carol" || a.GetChallengeId() != challenge || a.GetChannel() == "" || a.GetDecidedAt() == nil {
			t.Fatalf("audit row without carol's approval: %v", r)
		}
		if r.GetAgentId() != "finance-bot" || r.GetUserId() != "carol" || r.GetModel() != scenarioModel ||
			r.GetSubject() != "T-1001" || r.GetRisk() != "L3" || r.GetConversationId() != "conv-finance-1" ||
			strings.Join(r.GetSideEffects(), ",") != "ledger,payment-gateway" {
			t.Fatalf("audit row %v", r)
		}
	}
	if byApprover := tp.query(&mandatev1.QueryRequest{Approver: "carol", Phase: "outcome"}); len(byApprover) != 1 || byApprover[0].GetInvocationId() != inv {
		t.Fatalf("query by approver: %v", byApprover)
	}

	// The grant was spent: calling again with it moves nothing.
	again := callTool(t, cs, "ticket.refund", refundInput, mcp.Meta{"mandate.dev/approval": challenge})
	m := wantToolRefusal(t, again, "confirmation_check", "confirmation.already_redeemed")
	outcome(t, tp.invocationRows(m["invocation_id"].(string), 1), "refused", "confirmation_check", "confirmation.already_redeemed")
	tp.wantRefunds(1, 2500)
}

// TestScenarioRefundOverRESTSameCode: support-bot's token over REST — the
// executor's route and the sample's own route — and over gRPC gets the
// refusal it gets over MCP: the same code and stage (403 problem+json,
// PermissionDenied). No money moves; each attempt leaves one row.
func TestScenarioRefundOverRESTSameCode(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	bot := tp.token("acme", "alice", "support-bot")
	const stage, code = "permission_check", "authorization.permission_denied"

	res := callTool(t, tp.mcpSession(bot, nil), "ticket.refund", refundInput, nil)
	mcpRefusal := wantToolRefusal(t, res, stage, code)

	viaExecutor := tp.rest("executor", http.MethodPost, "/v1/commands/ticket.refund:execute", bot, `{"input":`+refundInput+`}`)
	wantProblem(t, viaExecutor, http.StatusForbidden, stage, code)
	viaSample := tp.rest("executor", http.MethodPost, "/v1/tickets/T-1001:refund", bot,
		`{"amount":{"currency_code":"EUR","amount_minor":"2500"},"reason":"Customer was charged twice","cardholder_reference":"CH4242424242"}`)
	wantProblem(t, viaSample, http.StatusForbidden, stage, code)

	_, err := helpdeskv1.NewHelpdeskServiceClient(tp.conn("executor")).IssueRefund(tp.as(bot), &helpdeskv1.IssueRefundRequest{
		TicketId: "T-1001", Amount: &helpdeskv1.Money{CurrencyCode: "EUR", AmountMinor: 2500},
		Reason: "Customer was charged twice", CardholderReference: "CH4242424242",
	})
	viaGRPC := wantGRPCRefusal(t, err, codes.PermissionDenied, stage, code)

	tp.wantRefunds(0, 0)
	if n := tp.challenges("acme"); n != 0 {
		t.Fatalf("%d challenges opened", n)
	}
	channels := map[string]string{
		mcpRefusal["invocation_id"].(string):       "mcp",
		viaExecutor.body["invocation_id"].(string): "rest",
		viaSample.body["invocation_id"].(string):   "rest",
		viaGRPC.GetInvocationId():                  "grpc",
	}
	if len(channels) != 4 {
		t.Fatalf("invocation ids are not distinct: %v", channels)
	}
	for inv, channel := range channels {
		out := outcome(t, tp.invocationRows(inv, 1), "refused", stage, code)
		if out.GetChannel() != channel || out.GetAgentId() != "support-bot" || out.GetCommand() != "ticket.refund" {
			t.Fatalf("row %v; want channel %s", out, channel)
		}
	}
}

// TestScenarioIdempotencyReplay: an approved refund sent twice with the
// same idempotency key runs once — the second answer is the first one
// replayed — and the key used with another amount is refused; over REST
// (carol), MCP (finance-bot, key in `_meta`) and, for an expense report,
// gRPC (alice, idempotency-key metadata).
func TestScenarioIdempotencyReplay(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	carol := tp.token("acme", "carol", "")
	const path = "/v1/commands/ticket.refund:execute"
	body := func(input, grant string) string {
		return `{"input":` + input + `,"idempotency_key":"refund-T-1001-a","approval_grant_id":"` + grant + `"}`
	}

	first := tp.rest("executor", http.MethodPost, path, carol, body(refundInput, ""))
	wantProblem(t, first, http.StatusUnprocessableEntity, "confirmation_check", "confirmation.required")
	challenge, _ := first.body["challenge_id"].(string)
	if _, err := tp.decide(carol, challenge, mandatev1.Decision_DECISION_APPROVE); err != nil {
		t.Fatal(err)
	}
	// The refusal above did not spend the key: the approved call runs.
	run := tp.rest("executor", http.MethodPost, path, carol, body(refundInput, challenge))
	if run.status != http.StatusOK || run.body["replayed"] == true {
		t.Fatalf("approved refund: %d %s", run.status, run.raw)
	}
	tp.wantRefunds(1, 2500)

	replay := tp.rest("executor", http.MethodPost, path, carol, body(refundInput, challenge))
	if replay.status != http.StatusOK || replay.body["replayed"] != true ||
		replay.body["invocation_id"] != run.body["invocation_id"] || jsonOf(replay.body["result"]) != jsonOf(run.body["result"]) {
		t.Fatalf("replay: %d %s; first answer %s", replay.status, replay.raw, run.raw)
	}
	tp.wantRefunds(1, 2500)

	reused := tp.rest("executor", http.MethodPost, path, carol, body(strings.Replace(refundInput, `"2500"`, `"2600"`, 1), challenge))
	wantProblem(t, reused, http.StatusUnprocessableEntity, "idempotency_check", "idempotency.key_reused")
	tp.wantRefunds(1, 2500)

	// One execution: one intent was written (dispatch follows only an
	// intent) and one executed outcome, with carol's approval.
	inv := run.body["invocation_id"].(string)
	outcome(t, tp.invocationRows(inv, 2), "executed", "", "")
	if intents := tp.query(&mandatev1.QueryRequest{Command: "ticket.refund", Phase: "intent"}); len(intents) != 1 || intents[0].GetInvocationId() != inv {
		t.Fatalf("intent rows: %v", intents)
	}
	if executed := tp.query(&mandatev1.QueryRequest{Command: "ticket.refund", Outcomes: []string{"executed"}}); len(executed) != 1 {
		t.Fatalf("executed rows: %v", executed)
	}
	outcome(t, tp.invocationRows(reused.body["invocation_id"].(string), 1), "refused", "idempotency_check", "idempotency.key_reused")

	// Over MCP, with the key in `_meta`: finance-bot's refund of 10.00 EUR,
	// confirmed by carol in her client's form, runs once; the same call
	// again is answered from the saved result without asking her again.
	var form approveForm
	cs := tp.mcpSession(tp.token("acme", "carol", "finance-bot"), &mcp.ClientOptions{ElicitationHandler: form.handler})
	small := strings.Replace(refundInput, `"2500"`, `"1000"`, 1)
	key := mcp.Meta{"mandate.dev/idempotency_key": "mcp-refund-T-1001"}
	once := callTool(t, cs, "ticket.refund", small, key)
	if once.IsError || len(form.shown) != 1 {
		t.Fatalf("MCP refund: %s after %d prompts", jsonOf(once.Content), len(form.shown))
	}
	tp.wantRefunds(2, 3500)
	twice := callTool(t, cs, "ticket.refund", small, key)
	if twice.IsError || jsonOf(structured(t, twice)) != jsonOf(structured(t, once)) ||
		twice.Meta["mandate.dev/invocation_id"] != once.Meta["mandate.dev/invocation_id"] || len(form.shown) != 1 {
		t.Fatalf("MCP replay: %s (first %s) after %d prompts", jsonOf(twice), jsonOf(once), len(form.shown))
	}
	tp.wantRefunds(2, 3500)
	other := callTool(t, cs, "ticket.refund", strings.Replace(refundInput, `"2500"`, `"900"`, 1), key)
	wantToolRefusal(t, other, "idempotency_check", "idempotency.key_reused")
	tp.wantRefunds(2, 3500)

	// The same over the governed gRPC proxy with the idempotency-key
	// metadata: one expense report for two calls.
	client := helpdeskv1.NewHelpdeskServiceClient(tp.conn("executor"))
	alice := tp.token("acme", "alice", "")
	req := &helpdeskv1.CreateExpenseReportRequest{
		Title: "Customer visit Lyon", Payout: &helpdeskv1.CreateExpenseReportRequest_PayrollId{PayrollId: "P-0042"},
		Lines: []*helpdeskv1.ExpenseLine{{Description: "Train Paris-Lyon", Amount: &helpdeskv1.Money{CurrencyCode: "EUR", AmountMinor: 8900}, Category: helpdeskv1.ExpenseCategory_EXPENSE_CATEGORY_TRAVEL}},
	}
	before := tp.count(`SELECT count(*) FROM helpdesk.expense_reports`)
	a, err := client.CreateExpenseReport(tp.as(alice, "idempotency-key", "create-lyon-1"), req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.CreateExpenseReport(tp.as(alice, "idempotency-key", "create-lyon-1"), req)
	if err != nil || b.GetReportId() != a.GetReportId() {
		t.Fatalf("replayed create: %v %v; first %v", b, err, a)
	}
	if after := tp.count(`SELECT count(*) FROM helpdesk.expense_reports`); after != before+1 {
		t.Fatalf("%d reports created for one key, want 1", after-before)
	}
	req.Title = "Customer visit Nice"
	_, err = client.CreateExpenseReport(tp.as(alice, "idempotency-key", "create-lyon-1"), req)
	wantGRPCRefusal(t, err, codes.FailedPrecondition, "idempotency_check", "idempotency.key_reused")
}
