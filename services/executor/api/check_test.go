package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/services/audit"
)

// check calls ExecutorService/Check with a JSON input.
func (e *env) check(t *testing.T, ctx context.Context, code, input string, opts ...func(*mandatev1.ExecuteRequest)) *mandatev1.CheckResponse {
	t.Helper()
	req := &mandatev1.ExecuteRequest{Code: code}
	if input != "" {
		var m map[string]any
		if err := json.Unmarshal([]byte(input), &m); err != nil {
			t.Fatal(err)
		}
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		req.Input = s
	}
	for _, o := range opts {
		o(req)
	}
	resp, err := mandatev1.NewExecutorServiceClient(e.conn).Check(ctx, req)
	if err != nil {
		t.Fatalf("Check(%s): %v", code, err)
	}
	return resp
}

// checkOutcome is the outcome a check row records for a verdict.
func checkOutcome(v mandatev1.Verdict) audit.Outcome {
	switch v {
	case mandatev1.Verdict_VERDICT_ALLOWED:
		return audit.OutcomeAllowed
	case mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED:
		return audit.OutcomeApprovalRequired
	}
	return audit.OutcomeRefused
}

// wantCheckRow asserts the check left exactly one row, phase check, whose
// outcome is its verdict.
func (e *env) wantCheckRow(t *testing.T, tenant string, resp *mandatev1.CheckResponse) {
	t.Helper()
	// The row is written after the answer, as a dispatched call's outcome.
	var rows []audit.Stored
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		rows, err = e.audit.Get(context.Background(), tenant, resp.GetCheckId())
		if err == nil || !errors.Is(err, audit.ErrNotFound) || time.Now().After(deadline) {
			break
		}
	}
	if len(rows) != 1 {
		t.Fatalf("the check %s left %d audit rows, want 1", resp.GetCheckId(), len(rows))
	}
	r := rows[0]
	if r.Phase != audit.PhaseCheck || r.Outcome != checkOutcome(resp.GetVerdict()) ||
		r.Stage != resp.GetReason().GetStage() || r.Code != resp.GetReason().GetCode() {
		t.Fatalf("the check's row: phase %s outcome %s %s/%s, want check %s %s/%s", r.Phase, r.Outcome, r.Stage, r.Code,
			checkOutcome(resp.GetVerdict()), resp.GetReason().GetStage(), resp.GetReason().GetCode())
	}
	if strings.Contains(string(r.Arguments), "CH4242424242") {
		t.Fatal("the sensitive cardholder reference reached the audit trail")
	}
}

// TestCheckAgreesWithTheCall: for every stage that decides before the
// backend, and for the backend's own guards through its preview, Check
// gives the verdict the call itself then meets — the same stage and code
// for a refusal, confirmation.required where a human must approve,
// success where it runs — and leaves one audit row of its own and no
// effect: no refund, no challenge, no key held, no intent.
func TestCheckAgreesWithTheCall(t *testing.T) { eachStore(t, testCheckAgreesWithTheCall) }

func testCheckAgreesWithTheCall(t *testing.T, st stores) {
	e := start(t, st)
	alice := token(t, "acme", "alice", "")
	lena := token(t, "acme", "lena", "")
	bot := as(token(t, "acme", "carol", "finance-bot"))

	created, err := e.execute(t, as(lena), "expense.report.create", createInput)
	if err != nil {
		t.Fatal(err)
	}
	lenasReport := created.GetResult().GetFields()["report_id"].GetStringValue()
	if _, err := e.execute(t, as(lena), "expense.report.submit", fmt.Sprintf(`{"report_id":%q}`, lenasReport)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.execute(t, as(alice), "expense.report.create", createInput, withKey("key-1")); err != nil {
		t.Fatal(err)
	}

	const allowed, approval, refused = mandatev1.Verdict_VERDICT_ALLOWED, mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED, mandatev1.Verdict_VERDICT_REFUSED
	cases := []struct {
		name        string
		ctx         context.Context
		tenant      string
		code, input string
		opts        []func(*mandatev1.ExecuteRequest)
		verdict     mandatev1.Verdict
		stage, want string
	}{
		{"inactive principal", as(token(t, "acme", "alice", "rogue-bot")), "acme", "ticket.search", `{}`, nil,
			refused, "authenticate", "authorization.principal_inactive"},
		{"malformed trace context", as(alice, "traceparent", "00-zz"), "acme", "ticket.search", `{}`, nil,
			refused, "request_check", ""},
		{"unknown command", as(alice), "acme", "ticket.delete", `{}`, nil,
			refused, "load_definition", "command.not_found"},
		{"tenant lacks the feature", as(token(t, "globex", "dave", "")), "globex", "expense.report.create", createInput, nil,
			refused, "entitlement_check", "entitlement.missing"},
		{"agent lacks the permission", as(token(t, "acme", "alice", "support-bot")), "acme", "ticket.refund", `{"bogus":1}`, nil,
			refused, "permission_check", "authorization.permission_denied"},
		{"invalid arguments", as(token(t, "acme", "carol", "")), "acme", "ticket.refund", strings.Replace(refundInput, `"2500"`, `"0"`, 1), nil,
			refused, "schema_validate", "schema.invalid"},
		{"another tenant named", as(alice, "x-mandate-tenant", "globex"), "acme", "ticket.search", `{}`, nil,
			refused, "scope_check", "scope.tenant_mismatch"},
		{"malformed key", as(alice), "acme", "expense.report.create", createInput, []func(*mandatev1.ExecuteRequest){withKey("bad key\x00")},
			refused, "idempotency_check", ""},
		{"key reused with other input", as(alice), "acme", "expense.report.create", strings.Replace(createInput, "Lyon", "Nice", 1), []func(*mandatev1.ExecuteRequest){withKey("key-1")},
			refused, "idempotency_check", "idempotency.key_reused"},
		{"same user submitted", as(lena), "acme", "expense.report.approve", fmt.Sprintf(`{"report_id":%q}`, lenasReport), nil,
			refused, "sod_check", "sod.conflict"},
		{"refund needs a human", bot, "acme", "ticket.refund", refundInput, nil,
			approval, "confirmation_check", "confirmation.required"},
		// The backend's own guards, through its preview (mandate.v1.PreviewService):
		// a refund it would refuse is refused before a human is asked, and a
		// command without confirmation is checked against them too.
		{"a refund of a missing ticket", bot, "acme", "ticket.refund", strings.Replace(refundInput, "T-1001", "T-9999", 1), nil,
			refused, "state_check", "state.not_found"},
		{"a refund beyond what was paid", bot, "acme", "ticket.refund", strings.Replace(refundInput, `"2500"`, `"999999"`, 1), nil,
			refused, "pre_invariant", "refund.exceeds_paid"},
		{"a backend guard", as(alice), "acme", "expense.report.submit", `{"report_id":"ER-2002"}`, nil,
			refused, "state_check", "state.not_draft"},
		{"a read runs", as(alice), "acme", "ticket.search", `{"query":"charged twice"}`, nil,
			allowed, "", ""},
		{"a new key runs, once", as(alice), "acme", "expense.report.create", createInput, []func(*mandatev1.ExecuteRequest){withKey("key-2")},
			allowed, "", ""},
		{"a finished key replays", as(alice), "acme", "expense.report.create", createInput, []func(*mandatev1.ExecuteRequest){withKey("key-1")},
			allowed, "", ""},
	}
	pendingBefore := e.pendingFor(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.check(t, tc.ctx, tc.code, tc.input, tc.opts...)
			if resp.GetVerdict() != tc.verdict || resp.GetReason().GetStage() != tc.stage || (tc.want != "" && resp.GetReason().GetCode() != tc.want) {
				t.Fatalf("Check = %v %s/%s, want %v %s/%s", resp.GetVerdict(), resp.GetReason().GetStage(), resp.GetReason().GetCode(), tc.verdict, tc.stage, tc.want)
			}
			if resp.GetCheckId() == "" || (resp.GetReason() != nil && resp.GetReason().GetInvocationId() != resp.GetCheckId()) {
				t.Fatalf("the verdict names check %q and reason invocation %q", resp.GetCheckId(), resp.GetReason().GetInvocationId())
			}
			e.wantCheckRow(t, tc.tenant, resp)
			if n := e.pendingFor(t); n != pendingBefore {
				t.Fatalf("the check opened a challenge: %d pending, want %d", n, pendingBefore)
			}

			// The call itself meets what the check said.
			_, err := e.execute(t, tc.ctx, tc.code, tc.input, tc.opts...)
			ce := refusal(err)
			switch tc.verdict {
			case allowed:
				if err != nil {
					t.Fatalf("checked allowed, the call: %v (%v)", err, ce)
				}
			default:
				if ce.GetStage() != resp.GetReason().GetStage() || ce.GetCode() != resp.GetReason().GetCode() {
					t.Fatalf("checked %s/%s, the call: %s/%s", resp.GetReason().GetStage(), resp.GetReason().GetCode(), ce.GetStage(), ce.GetCode())
				}
			}
			if tc.verdict == approval {
				pendingBefore++ // the call, not the check, opened it
			}
		})
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("the payment gateway counted %d refunds, want 0", n)
	}
}

// TestCheckOfAReplayedRefusal: a keyed call whose first response was the
// backend's refusal is answered with that refusal again (a replay), so
// its check is refused with the same stage and code — not allowed because
// the key would answer it without reaching the backend.
func TestCheckOfAReplayedRefusal(t *testing.T) { eachStore(t, testCheckOfAReplayedRefusal) }

func testCheckOfAReplayedRefusal(t *testing.T, st stores) {
	e := start(t, st)
	ctx := as(token(t, "acme", "alice", ""))
	const input = `{"report_id": "ER-2001"}`
	// The first submission (if ER-2001 is still a draft) makes the second one
	// refused by the backend: not a draft any more.
	_, _ = e.execute(t, ctx, "expense.report.submit", input, withKey("submit-1"))
	_, err := e.execute(t, ctx, "expense.report.submit", input, withKey("submit-2"))
	first := refusal(err)
	if first.GetStage() != "state_check" || first.GetCode() != "state.not_draft" {
		t.Fatalf("the second submission: %v (%s/%s); want the backend's state_check/state.not_draft", err, first.GetStage(), first.GetCode())
	}
	v := e.check(t, ctx, "expense.report.submit", input, withKey("submit-2"))
	if v.GetVerdict() != mandatev1.Verdict_VERDICT_REFUSED || v.GetReason().GetStage() != "state_check" || v.GetReason().GetCode() != "state.not_draft" {
		t.Fatalf("check of the replay = %v %s/%s; want refused state_check/state.not_draft", v.GetVerdict(), v.GetReason().GetStage(), v.GetReason().GetCode())
	}
	_, err = e.execute(t, ctx, "expense.report.submit", input, withKey("submit-2"))
	if again := refusal(err); again.GetStage() != "state_check" || again.GetCode() != "state.not_draft" {
		t.Fatalf("the replay: %v (%s/%s); want the first refusal again", err, again.GetStage(), again.GetCode())
	}
}

// TestCheckReadsTheGrant: a check of a call that carries a grant reads
// the challenge and redeems nothing — pending still needs the approval,
// approved lets the call through (twice: the check spent nothing), the
// redeemed and the declined grant are the call's refusals.
func TestCheckReadsTheGrant(t *testing.T) { eachStore(t, testCheckReadsTheGrant) }

func testCheckReadsTheGrant(t *testing.T, st stores) {
	e := start(t, st)
	ctx := context.Background()
	bot := as(token(t, "acme", "carol", "finance-bot"))
	_, err := e.execute(t, bot, "ticket.refund", refundInput)
	challenge := refusal(err).GetChallengeId()
	if challenge == "" {
		t.Fatalf("the refund opened no challenge: %v", err)
	}
	grant := withGrant(challenge)

	resp := e.check(t, bot, "ticket.refund", refundInput, grant)
	if resp.GetVerdict() != mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED || resp.GetReason().GetCode() != "confirmation.pending" ||
		resp.GetReason().GetChallengeId() != challenge || resp.GetReason().GetGrantIn() == "" {
		t.Fatalf("undecided: %v %v", resp.GetVerdict(), resp.GetReason())
	}
	e.wantCheckRow(t, "acme", resp)
	if resp := e.check(t, bot, "ticket.refund", strings.Replace(refundInput, "2500", "2400", 1), grant); resp.GetReason().GetCode() != "confirmation.grant_mismatch" {
		t.Fatalf("the grant for other arguments: %v %v", resp.GetVerdict(), resp.GetReason())
	}

	if _, err := e.confirm.Decide(ctx, carol, challenge, true, "api"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if resp := e.check(t, bot, "ticket.refund", refundInput, grant); resp.GetVerdict() != mandatev1.Verdict_VERDICT_ALLOWED {
			t.Fatalf("approved: %v %v", resp.GetVerdict(), resp.GetReason())
		}
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("after the checks the payment gateway counted %d refunds, want 0", n)
	}
	if _, err := e.execute(t, bot, "ticket.refund", refundInput, grant); err != nil {
		t.Fatalf("the approved call after two checks: %v (%v)", err, refusal(err))
	}
	if n := e.gateway.Refunds(); n != 1 {
		t.Fatalf("the payment gateway counted %d refunds, want 1", n)
	}
	resp = e.check(t, bot, "ticket.refund", refundInput, grant)
	_, err = e.execute(t, bot, "ticket.refund", refundInput, grant)
	if resp.GetVerdict() != mandatev1.Verdict_VERDICT_REFUSED || resp.GetReason().GetCode() != refusal(err).GetCode() {
		t.Fatalf("the spent grant: checked %v %s, the call %s", resp.GetVerdict(), resp.GetReason().GetCode(), refusal(err).GetCode())
	}

	_, err = e.execute(t, bot, "ticket.refund", strings.Replace(refundInput, "2500", "1000", 1))
	declined := refusal(err).GetChallengeId()
	if _, err := e.confirm.Decide(ctx, carol, declined, false, "api"); err != nil {
		t.Fatal(err)
	}
	resp = e.check(t, bot, "ticket.refund", strings.Replace(refundInput, "2500", "1000", 1), withGrant(declined))
	_, err = e.execute(t, bot, "ticket.refund", strings.Replace(refundInput, "2500", "1000", 1), withGrant(declined))
	if resp.GetReason().GetCode() != "confirmation.refused" || refusal(err).GetCode() != "confirmation.refused" {
		t.Fatalf("the declined grant: checked %s, the call %s", resp.GetReason().GetCode(), refusal(err).GetCode())
	}
	if n := e.gateway.Refunds(); n != 1 {
		t.Fatalf("the payment gateway counted %d refunds, want 1", n)
	}
}

// TestCheckOverREST: the check has its REST route, and a refusal is the
// verdict of a 200, not an error status.
func TestCheckOverREST(t *testing.T) {
	e := start(t, memoryStores)
	code, body := e.restPost(t, "/v1/commands/ticket.refund:check", token(t, "acme", "alice", "support-bot"), `{"input":`+refundInput+`}`)
	reason, _ := body["reason"].(map[string]any)
	if code != 200 || body["verdict"] != "VERDICT_REFUSED" || reason["code"] != "authorization.permission_denied" || reason["stage"] != "permission_check" {
		t.Fatalf("POST :check = %d %v", code, body)
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("the payment gateway counted %d refunds, want 0", n)
	}
}

// pendingFor counts the challenges waiting for carol.
func (e *env) pendingFor(t *testing.T) int {
	t.Helper()
	pending, err := e.confirm.Pending(context.Background(), carol, 100)
	if err != nil {
		t.Fatal(err)
	}
	return len(pending)
}
