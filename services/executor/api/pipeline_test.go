package api_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/dynamicpb"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/executor"
)

const (
	refundInput = `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"2500"},"reason":"Customer was charged twice","cardholder_reference":"CH4242424242"}`
	createInput = `{"title":"Customer visit Lyon","lines":[{"description":"Train Paris-Lyon","amount":{"currency_code":"EUR","amount_minor":8900},"category":"EXPENSE_CATEGORY_TRAVEL"}],"payroll_id":"P-0042"}`
)

var (
	carol     = identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "carol"}
	carolsBot = identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "carol", AgentID: "finance-bot"}
)

// TestEveryStageRefuses: each stage refuses the case it exists for, with
// its code; a refusal before dispatch writes one outcome row, a dispatched
// call an intent and an outcome row; no money moves.
func TestEveryStageRefuses(t *testing.T) { eachStore(t, testEveryStageRefuses) }

func testEveryStageRefuses(t *testing.T, st stores) {
	e := start(t, st)
	alice := token(t, "acme", "alice", "")
	lena := token(t, "acme", "lena", "")

	// Separation of duties: lena creates and submits a report of her own.
	created, err := e.execute(t, as(lena), "expense.report.create", createInput)
	if err != nil {
		t.Fatal(err)
	}
	lenasReport := created.GetResult().GetFields()["report_id"].GetStringValue()
	if _, err := e.execute(t, as(lena), "expense.report.submit", fmt.Sprintf(`{"report_id":%q}`, lenasReport)); err != nil {
		t.Fatal(err)
	}
	// Idempotency: a key used once for one input.
	if _, err := e.execute(t, as(alice), "expense.report.create", createInput, withKey("key-1")); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name        string
		ctx         context.Context
		code, input string
		opts        []func(*mandatev1.ExecuteRequest)
		wantStage   string
		wantCode    string
		wantGRPC    codes.Code
		dispatched  bool
	}{
		{"inactive principal", as(token(t, "acme", "alice", "rogue-bot")), "ticket.search", `{}`, nil,
			"authenticate", "authorization.principal_inactive", codes.PermissionDenied, false},
		{"unknown command", as(alice), "ticket.delete", `{}`, nil,
			"load_definition", "command.not_found", codes.NotFound, false},
		{"tenant lacks the feature", as(token(t, "globex", "dave", "")), "expense.report.create", createInput, nil,
			"entitlement_check", "entitlement.missing", codes.PermissionDenied, false},
		{"agent lacks the permission", as(token(t, "acme", "alice", "support-bot")), "ticket.refund", refundInput, nil,
			"permission_check", "authorization.permission_denied", codes.PermissionDenied, false},
		{"authorisation before parsing", as(token(t, "acme", "alice", "support-bot")), "ticket.refund", `{"bogus":1}`, nil,
			"permission_check", "authorization.permission_denied", codes.PermissionDenied, false},
		{"invalid arguments", as(token(t, "acme", "carol", "")), "ticket.refund", strings.Replace(refundInput, `"2500"`, `"0"`, 1), nil,
			"schema_validate", "schema.invalid", codes.InvalidArgument, false},
		{"another tenant named", as(alice, "x-mandate-tenant", "globex"), "ticket.search", `{}`, nil,
			"scope_check", "scope.tenant_mismatch", codes.PermissionDenied, false},
		{"key reused with other input", as(alice), "expense.report.create", strings.Replace(createInput, "Lyon", "Nice", 1), []func(*mandatev1.ExecuteRequest){withKey("key-1")},
			"idempotency_check", "idempotency.key_reused", codes.FailedPrecondition, false},
		{"same user submitted", as(lena), "expense.report.approve", fmt.Sprintf(`{"report_id":%q}`, lenasReport), nil,
			"sod_check", "sod.conflict", codes.PermissionDenied, false},
		{"refund needs a human", as(token(t, "acme", "carol", "finance-bot")), "ticket.refund", refundInput, nil,
			"confirmation_check", "confirmation.required", codes.FailedPrecondition, false},
		{"backend state guard", as(alice), "expense.report.submit", `{"report_id":"ER-2002"}`, nil,
			"state_check", "state.not_draft", codes.FailedPrecondition, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.execute(t, tc.ctx, tc.code, tc.input, tc.opts...)
			ce := refusal(err)
			if ce == nil || ce.GetStage() != tc.wantStage || ce.GetCode() != tc.wantCode || status.Code(err) != tc.wantGRPC || reason(err) != tc.wantCode {
				t.Fatalf("err = %v (%v), want %s/%s %v", err, ce, tc.wantStage, tc.wantCode, tc.wantGRPC)
			}
			if ce.GetInvocationId() == "" {
				t.Fatal("refusal without invocation id")
			}
			tenant := "acme"
			if strings.Contains(tc.name, "feature") {
				tenant = "globex"
			}
			want := 1
			if tc.dispatched {
				want = 2
			}
			rows := e.rows(t, tenant, ce.GetInvocationId(), want)
			if len(rows) != want {
				t.Fatalf("%d audit rows, want %d", len(rows), want)
			}
			last := rows[len(rows)-1]
			if last.Phase != audit.PhaseOutcome || last.Outcome != audit.OutcomeRefused || last.Stage != tc.wantStage || last.Code != tc.wantCode {
				t.Fatalf("outcome row %+v", last.Record)
			}
			if tc.dispatched && rows[0].Phase != audit.PhaseIntent {
				t.Fatalf("first row %+v, want the intent", rows[0].Record)
			}
			if strings.Contains(string(last.Arguments), "CH4242424242") {
				t.Fatal("the sensitive cardholder reference reached the audit trail")
			}
		})
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("the payment gateway counted %d refunds, want 0", n)
	}
	if v := refusal(errOf(e.execute(t, as(token(t, "acme", "alice", "support-bot")), "ticket.refund", refundInput))); len(v.GetViolations()) != 0 {
		t.Fatal("a caller without permission learned about the schema")
	}
	// The permission refusal opened no challenge: carol has nothing to decide.
	pending, err := e.confirm.Pending(context.Background(), carol, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 1 { // only the "refund needs a human" case opened one
		t.Fatalf("%d pending challenges, want 1", len(pending))
	}
}

func errOf(_ any, err error) error { return err }

// TestConfirmationFlow: a human confirms, the approved call executes
// exactly once, and no grant is reusable.
func TestConfirmationFlow(t *testing.T) { eachStore(t, testConfirmationFlow) }

func testConfirmationFlow(t *testing.T, st stores) {
	e := start(t, st)
	bot := as(token(t, "acme", "carol", "finance-bot"))
	ctx := context.Background()

	_, err := e.execute(t, bot, "ticket.refund", refundInput)
	ce := refusal(err)
	if ce.GetCode() != "confirmation.required" || ce.GetChallengeId() == "" || !strings.HasPrefix(ce.GetApprovalUrl(), "http://approve.test/approve/") {
		t.Fatalf("first call: %v %v", err, ce)
	}
	challenge := ce.GetChallengeId()
	ch, err := e.confirm.Get(ctx, carol, challenge)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ch.Prompt.ArgumentsJSON, "CH4242424242") || !strings.Contains(strings.Join(ch.Prompt.WithheldFields, ","), "/cardholder_reference") {
		t.Fatalf("prompt shows the sensitive value or does not say it was withheld: %+v", ch.Prompt)
	}
	// The agent cannot approve for its user.
	if _, err := e.confirm.Decide(ctx, carolsBot, challenge, true, "api"); !isCode(err, "confirmation.approver_not_allowed") {
		t.Fatalf("agent deciding: %v", err)
	}
	// Redeeming before anyone decided is refused and moves nothing.
	if _, err := e.execute(t, bot, "ticket.refund", refundInput, withGrant(challenge)); refusal(err).GetCode() != "confirmation.pending" {
		t.Fatalf("pending grant: %v", err)
	}
	if _, err := e.confirm.Decide(ctx, carol, challenge, true, "api"); err != nil {
		t.Fatal(err)
	}
	// Changed arguments with the approved grant are refused.
	changed := strings.Replace(refundInput, `"2500"`, `"4900"`, 1)
	if _, err := e.execute(t, bot, "ticket.refund", changed, withGrant(challenge)); refusal(err).GetCode() != "confirmation.grant_mismatch" {
		t.Fatalf("changed arguments: %v", err)
	}
	resp, err := e.execute(t, bot, "ticket.refund", refundInput, withGrant(challenge))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetResult().GetFields()["status"].GetStringValue(); got != "REFUND_STATUS_ACCEPTED" {
		t.Fatalf("result %v", resp.GetResult())
	}
	rows := e.rows(t, "acme", resp.GetInvocationId(), 2)
	if len(rows) != 2 || rows[1].Outcome != audit.OutcomeExecuted || rows[1].Approval == nil || rows[1].Approval.Approver != "carol" ||
		rows[1].AgentID != "finance-bot" || rows[1].ActorKind != audit.ActorAgent || rows[1].Model != "test-model" {
		t.Fatalf("rows %+v", rows)
	}
	for _, r := range rows {
		if !strings.Contains(string(r.Arguments), `"cardholder_reference":"[withheld]"`) {
			t.Fatalf("arguments in the trail: %s", r.Arguments)
		}
	}
	// The grant is single use.
	if _, err := e.execute(t, bot, "ticket.refund", refundInput, withGrant(challenge)); refusal(err).GetCode() != "confirmation.already_redeemed" {
		t.Fatalf("replayed grant: %v", err)
	}
	if n, moved := e.gateway.Refunds(), e.gateway.Moved()["EUR"]; n != 1 || moved != 2500 {
		t.Fatalf("gateway counted %d refunds moving %d, want exactly one of 2500", n, moved)
	}

	// Declining refuses the call.
	_, err = e.execute(t, bot, "ticket.refund", strings.Replace(refundInput, `"2500"`, `"100"`, 1))
	second := refusal(err).GetChallengeId()
	if _, err := e.confirm.Decide(ctx, carol, second, false, "api"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.execute(t, bot, "ticket.refund", strings.Replace(refundInput, `"2500"`, `"100"`, 1), withGrant(second)); refusal(err).GetCode() != "confirmation.refused" {
		t.Fatalf("declined: %v", err)
	}
	if n := e.gateway.Refunds(); n != 1 {
		t.Fatalf("gateway counted %d refunds after a decline, want 1", n)
	}
}

func isCode(err error, code string) bool {
	return err != nil && strings.Contains(err.Error(), code)
}

// TestConcurrentSameKey: 64 concurrent calls with one idempotency key give
// exactly one backend effect; every answer is that effect or in_flight.
func TestConcurrentSameKey(t *testing.T) { eachStore(t, testConcurrentSameKey) }

func testConcurrentSameKey(t *testing.T, st stores) {
	e := start(t, st)
	alice := as(token(t, "acme", "alice", ""))
	var wg sync.WaitGroup
	var mu sync.Mutex
	reports := map[string]int{}
	inFlight := 0
	for range 64 {
		wg.Go(func() {
			resp, err := e.execute(t, alice, "expense.report.create", createInput, withKey("same-key"))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				reports[resp.GetResult().GetFields()["report_id"].GetStringValue()]++
			case refusal(err).GetCode() == "idempotency.in_flight":
				inFlight++
			default:
				t.Errorf("unexpected: %v", err)
			}
		})
	}
	wg.Wait()
	if len(reports) != 1 {
		t.Fatalf("reports created: %v (in flight: %d), want exactly one", reports, inFlight)
	}
	// The outcome row lands just after the reply.
	var executed int
	for deadline := time.Now().Add(5 * time.Second); ; {
		page, err := e.audit.Query(context.Background(), audit.Filter{Tenant: "acme", Command: "expense.report.create", Outcomes: []audit.Outcome{audit.OutcomeExecuted}})
		if err != nil {
			t.Fatal(err)
		}
		executed = len(page.Records)
		if executed >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if executed != 1 {
		t.Fatalf("%d executed creates in the trail, want 1", executed)
	}
	// After the first finished, the same key replays its response.
	resp, err := e.execute(t, alice, "expense.report.create", createInput, withKey("same-key"))
	if err != nil || !resp.GetReplayed() {
		t.Fatalf("replay: %v %v", resp, err)
	}
	// Replays are attempts too: every call answered with the first call's
	// response (the concurrent ones that came after it, and this one) left
	// a replayed row naming it, and there is still one executed row.
	var want int
	for _, n := range reports {
		want = n // n-1 concurrent replays, plus the one above
	}
	var replayed []audit.Stored
	for deadline := time.Now().Add(5 * time.Second); ; {
		page, err := e.audit.Query(context.Background(), audit.Filter{Tenant: "acme", Command: "expense.report.create", Outcomes: []audit.Outcome{audit.OutcomeReplayed}, PageSize: 200})
		if err != nil {
			t.Fatal(err)
		}
		replayed = page.Records
		if len(replayed) >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(replayed) != want {
		t.Fatalf("%d replayed rows, want %d", len(replayed), want)
	}
	for _, r := range replayed {
		if r.Stage != "idempotency_check" || r.Code != "idempotency.replayed" || r.InvocationID == resp.GetInvocationId() ||
			!strings.Contains(r.Message, resp.GetInvocationId()) {
			t.Fatalf("replayed row %+v (first invocation %s)", r.Record, resp.GetInvocationId())
		}
	}
	page, err := e.audit.Query(context.Background(), audit.Filter{Tenant: "acme", Command: "expense.report.create", Outcomes: []audit.Outcome{audit.OutcomeExecuted}})
	if err != nil || len(page.Records) != 1 {
		t.Fatalf("executed rows after the replay: %v %v", page, err)
	}
}

// TestAuditUnavailableFailsClosed: without a durable intent row nothing is
// dispatched. The intent is made durable in the executor's own store (its
// outbox of audit rows), so it is that store refusing the row that refuses
// the call — audit.unavailable, retriable — and the grant is not spent.
func TestAuditUnavailableFailsClosed(t *testing.T) { eachStore(t, testAuditUnavailableFailsClosed) }

func testAuditUnavailableFailsClosed(t *testing.T, st stores) {
	outbox := &spoolDown{}
	e := start(t, st, func(c *executor.Config) {
		outbox.Store = c.Store
		c.Store = outbox
	})
	bot := as(token(t, "acme", "carol", "finance-bot"))
	_, err := e.execute(t, bot, "ticket.refund", refundInput)
	challenge := refusal(err).GetChallengeId()
	if _, err := e.confirm.Decide(context.Background(), carol, challenge, true, "api"); err != nil {
		t.Fatal(err)
	}
	outbox.down.Store(true) // the executor's store takes no audit row
	_, err = e.execute(t, bot, "ticket.refund", refundInput, withGrant(challenge))
	ce := refusal(err)
	if ce.GetStage() != "audit" || ce.GetCode() != "audit.unavailable" || !ce.GetRetriable() || status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v %v", err, ce)
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("the payment gateway counted %d refunds without a durable intent, want 0", n)
	}
	// The refusal's own row reaches the trail (held in memory, since the
	// store will not take it, and appended by the relay).
	rows := e.rows(t, "acme", ce.GetInvocationId(), 1)
	if len(rows) != 1 || rows[0].Phase != audit.PhaseOutcome || rows[0].Code != "audit.unavailable" {
		t.Fatalf("rows of the refused call: %+v, want its one outcome row", rows)
	}
	// The call never ran, so carol's approval is not spent: the grant is
	// approved again, for the same invocation digest, once.
	ch, err := e.confirm.Get(context.Background(), carol, challenge)
	if err != nil || ch.State != confirm.StateApproved {
		t.Fatalf("the grant after a call that did not run: %s %v", ch.State, err)
	}
	relay := carolsBot
	relay.Via = "executor"
	if _, err := e.confirm.Redeem(context.Background(), relay, challenge, ch.InvocationDigest, ""); err != nil {
		t.Fatalf("the retry of the same invocation cannot redeem the grant: %v", err)
	}
	if _, err := e.confirm.Redeem(context.Background(), relay, challenge, ch.InvocationDigest, ""); !errors.Is(err, confirm.ErrAlreadyRedeemed) {
		t.Fatalf("a released grant redeemed twice: %v", err)
	}
}

// TestAnAuditOutageDoesNotStopTheCall: the call's path never waits for the
// audit service — its intent is durable in the executor's outbox — so with
// the audit trail down an approved refund still runs, and its rows, intent
// then outcome, reach the trail once it is back (in memory, where the
// trail can be plugged back in; on Postgres, whose trail's pool is closed
// for good, they wait in the executor's outbox).
func TestAnAuditOutageDoesNotStopTheCall(t *testing.T) {
	eachStore(t, testAnAuditOutageDoesNotStopTheCall)
}

func testAnAuditOutageDoesNotStopTheCall(t *testing.T, st stores) {
	e := start(t, st)
	bot := as(token(t, "acme", "carol", "finance-bot"))
	_, err := e.execute(t, bot, "ticket.refund", refundInput)
	challenge := refusal(err).GetChallengeId()
	if _, err := e.confirm.Decide(context.Background(), carol, challenge, true, "api"); err != nil {
		t.Fatal(err)
	}
	e.takeAuditAway()
	resp, err := e.execute(t, bot, "ticket.refund", refundInput, withGrant(challenge))
	if err != nil {
		t.Fatalf("an approved refund with the audit trail down: %v", err)
	}
	if n := e.gateway.Refunds(); n != 1 {
		t.Fatalf("the payment gateway counted %d refunds, want 1", n)
	}
	inv := resp.GetInvocationId()
	if resp.GetAuditId() != "" {
		t.Errorf("audit id %q: the intent's place in the chain is not known when the call answers", resp.GetAuditId())
	}
	// Both rows wait in the executor's outbox for the trail.
	deadline := time.Now().Add(5 * time.Second)
	for {
		waiting, err := e.execStore.Spooling(context.Background(), "acme", []string{inv})
		if err != nil {
			t.Fatal(err)
		}
		rows, err := e.execStore.Spooled(context.Background(), 100)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range rows {
			if r.InvocationID == inv {
				n++
			}
		}
		if len(waiting) == 1 && n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows of %s in the outbox, want its intent and its outcome", n, inv)
		}
		time.Sleep(10 * time.Millisecond)
	}
	u, ok := e.audit.(*unplugged)
	if !ok {
		return // Postgres: the trail's pool is closed for good
	}
	u.down.Store(false)
	rows := e.rows(t, "acme", inv, 2)
	if len(rows) != 2 || rows[0].Phase != audit.PhaseIntent || rows[1].Phase != audit.PhaseOutcome || rows[1].Outcome != audit.OutcomeExecuted ||
		rows[0].Seq >= rows[1].Seq {
		t.Fatalf("rows once the trail is back: %+v, want the intent, then the executed outcome", rows)
	}
	if v, err := e.audit.Verify(context.Background(), "acme"); err != nil || !v.OK {
		t.Fatalf("verify: %+v %v", v, err)
	}
}

// TestGovernedProxy: a service points its generated helpdesk client at the
// executor and gets the same pipeline.
func TestGovernedProxy(t *testing.T) { eachStore(t, testGovernedProxy) }

func testGovernedProxy(t *testing.T, st stores) {
	e := start(t, st)
	client := helpdeskv1.NewHelpdeskServiceClient(e.conn)
	res, err := client.SearchTickets(as(token(t, "acme", "alice", "support-bot")), &helpdeskv1.SearchTicketsRequest{Query: "charged twice"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.GetTickets()) == 0 || res.GetTickets()[0].GetTicketId() != "T-1001" {
		t.Fatalf("tickets %v", res.GetTickets())
	}
	_, err = client.IssueRefund(as(token(t, "acme", "alice", "support-bot")), &helpdeskv1.IssueRefundRequest{
		TicketId: "T-1001", Amount: &helpdeskv1.Money{CurrencyCode: "EUR", AmountMinor: 2500}, Reason: "dup", CardholderReference: "CH4242424242",
	})
	if ce := refusal(err); ce.GetStage() != "permission_check" || ce.GetCode() != "authorization.permission_denied" {
		t.Fatalf("refund through the proxy: %v", err)
	}
	rows := e.rows(t, "acme", refusal(err).GetInvocationId(), 1)
	if len(rows) != 1 || rows[0].Channel != audit.ChannelGRPC {
		t.Fatalf("rows %+v", rows)
	}
	// An RPC that is not a published command is refused, never forwarded.
	md := (&helpdeskv1.Ticket{}).ProtoReflect().Descriptor()
	err = e.conn.Invoke(as(token(t, "acme", "alice", "")), "/examples.helpdesk.v1.HelpdeskService/DeleteEverything",
		dynamicpb.NewMessage(md), dynamicpb.NewMessage(md))
	if ce := refusal(err); ce.GetCode() != "command.not_found" || status.Code(err) != codes.NotFound {
		t.Fatalf("unknown RPC: %v", err)
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("gateway counted %d refunds", n)
	}
}

// TestREST: the same pipeline over REST, errors as problem+json.
func TestREST(t *testing.T) { eachStore(t, testREST) }

func testREST(t *testing.T, st stores) {
	e := start(t, st)
	post := func(path, tok, body string, hdr ...string) (int, map[string]any, string) {
		t.Helper()
		return e.restPostCT(t, path, tok, body, hdr...)
	}
	alice := token(t, "acme", "alice", "")
	code, body, _ := post("/v1/commands/ticket.search:execute", alice, `{"input":{"query":"charged twice"}}`, "Idempotency-Key", "rest-1")
	if code != 200 || body["invocation_id"] == "" || body["replayed"] == true {
		t.Fatalf("search: %d %v", code, body)
	}
	first := body["invocation_id"]
	code, body, _ = post("/v1/commands/ticket.search:execute", alice, `{"input":{"query":"charged twice"}}`, "Idempotency-Key", "rest-1")
	if code != 200 || body["replayed"] != true || body["invocation_id"] != first {
		t.Fatalf("replay: %d %v", code, body)
	}
	rows := e.rows(t, "acme", first.(string), 2)
	if len(rows) != 2 || rows[0].Channel != audit.ChannelREST {
		t.Fatalf("rows %+v", rows)
	}
	code, body, ct := post("/v1/commands/ticket.refund:execute", token(t, "acme", "alice", "support-bot"), `{"input":`+refundInput+`}`)
	if code != 403 || ct != "application/problem+json" || body["code"] != "authorization.permission_denied" || body["stage"] != "permission_check" {
		t.Fatalf("refused refund: %d %s %v", code, ct, body)
	}
	code, body, _ = post("/v1/commands/ticket.refund:execute", token(t, "acme", "carol", ""), `{"input":{"ticket_id":"T-1"}}`)
	if code != 400 || body["code"] != "schema.invalid" || !strings.Contains(fmt.Sprint(body["errors"]), "/ticket_id") {
		t.Fatalf("invalid refund: %d %v", code, body)
	}
	if strings.Contains(fmt.Sprint(body), "CH4242424242") {
		t.Fatal("problem body leaks a sensitive value")
	}
}
