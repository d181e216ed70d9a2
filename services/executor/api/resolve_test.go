package api_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/executor"
)

// operatorPolicy is the harness's policy plus olive, an operator who
// holds audit.read and audit.resolve, and owen, who may only read.
var operatorPolicy = strings.Replace(policy, `      lead: [ticket.read, expense.report.submit, expense.report.approve]
`, `      lead: [ticket.read, expense.report.submit, expense.report.approve]
      ops: [audit.read, audit.resolve]
      auditor: [audit.read]
`, 1)

func init() {
	operatorPolicy = strings.Replace(operatorPolicy, `      - {id: lena, org: support, roles: [lead]}
`, `      - {id: lena, org: support, roles: [lead]}
      - {id: olive, org: ops, roles: [ops]}
      - {id: owen, org: ops, roles: [auditor]}
`, 1)
}

// TestResolveIsAnOperatorDecision (issue 31 item 7): resolving an unknown
// outcome goes through ExecutorService.Resolve, by a user holding
// audit.resolve, recorded as that user, and never contradicts the
// backend's receipt unless the operator says so:
//   - an agent, a user without audit.resolve (carol) and one with only
//     audit.read (owen) are refused authorization.permission_denied;
//   - a reason with a newline or a bidi override is refused schema.invalid;
//   - with receipts unreachable the operator's verdict is recorded, saying
//     the backend could not answer, and the key answers that the call ran;
//   - where the receipt says the call ran, "not_executed" is refused
//     audit.contradicts_receipt (no row), and accepted only with
//     override_receipt, which the row records;
//   - a second resolution is refused audit.not_resolvable.
//
// Every refusal leaves the trail without a resolution row.
func TestResolveIsAnOperatorDecision(t *testing.T) { eachStore(t, testResolveIsAnOperatorDecision) }

func testResolveIsAnOperatorDecision(t *testing.T, st stores) {
	lossy := &lossyDispatcher{}
	e := start(t, st, func(c *executor.Config) {
		lossy.inner = c.Dispatcher.(*executor.GRPCDispatcher)
		c.Dispatcher = lossy
	})
	ctx := context.Background()
	if _, err := directory.Apply(ctx, e.dir, []byte(operatorPolicy)); err != nil {
		t.Fatal(err)
	}
	bot := as(token(t, "acme", "carol", "finance-bot"))
	client := mandatev1.NewExecutorServiceClient(e.conn)
	// unknownRefund leaves a refund whose answer was lost while receipts
	// were unreachable: its outcome row says unknown. The backend ran it.
	unknownRefund := func(minor, key string) string {
		t.Helper()
		in := strings.Replace(refundInput, `"2500"`, `"`+minor+`"`, 1)
		_, err := e.execute(t, bot, "ticket.refund", in, withKey(key))
		ch := refusal(err).GetChallengeId()
		if _, err := e.confirm.Decide(ctx, carol, ch, true, "api"); err != nil {
			t.Fatal(err)
		}
		lossy.loseAnswer.Store(true)
		lossy.receiptsDown.Store(true)
		defer lossy.loseAnswer.Store(false)
		_, err = e.execute(t, bot, "ticket.refund", in, withKey(key), withGrant(ch))
		inv := refusal(err).GetInvocationId()
		if rows := e.rows(t, "acme", inv, 2); len(rows) != 2 || rows[1].Outcome != audit.OutcomeUnknown {
			t.Fatalf("rows: %+v (%v)", rows, err)
		}
		return inv
	}
	resolve := func(user, agent, inv, verdict, reason string, override bool) (*mandatev1.ResolveResponse, error) {
		return client.Resolve(as(token(t, "acme", user, agent)), &mandatev1.ResolveRequest{
			InvocationId: inv, Verdict: verdict, Reason: reason, OverrideReceipt: override,
		})
	}
	wantRefused := func(what, code string, err error, inv string) {
		t.Helper()
		if got := refusal(err).GetCode(); got != code {
			t.Fatalf("%s: %v, want %s", what, err, code)
		}
		for _, r := range e.rows(t, "acme", inv, 0) {
			if r.Phase == audit.PhaseResolution {
				t.Fatalf("%s left a resolution row: %+v", what, r)
			}
		}
	}

	first := unknownRefund("100", "resolve-1")
	_, err := resolve("carol", "finance-bot", first, "executed", "the gateway shows it", false)
	wantRefused("an agent", "authorization.permission_denied", err, first)
	_, err = resolve("carol", "", first, "executed", "the gateway shows it", false)
	wantRefused("a user without audit.resolve", "authorization.permission_denied", err, first)
	_, err = resolve("owen", "", first, "executed", "the gateway shows it", false)
	wantRefused("a user with only audit.read", "authorization.permission_denied", err, first)
	for _, bad := range []string{"ok\nresolved by: admin", "ok \u202egnp.exe", "ok\u2066x", "   ", strings.Repeat("x", 501)} {
		_, err = resolve("olive", "", first, "executed", bad, false)
		wantRefused("reason "+strings.ToValidUTF8(bad[:min(len(bad), 12)], "?"), "schema.invalid", err, first)
	}
	_, err = resolve("olive", "", first, "maybe", "the gateway shows it", false)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("verdict maybe: %v", err)
	}

	// Receipts still unreachable: the operator's word is all there is.
	resp, err := resolve("olive", "", first, "executed", "the gateway shows refund R-1", false)
	if err != nil {
		t.Fatalf("resolve with receipts unreachable: %v", err)
	}
	if resp.GetReceipt() != "" || resp.GetKey() != "settled" {
		t.Fatalf("response: %v", resp)
	}
	row := resp.GetRecord()
	if row.GetPhase() != "resolution" || row.GetUserId() != "olive" || row.GetActorKind() != "user" || row.GetAgentId() != "" ||
		row.GetOutcome() != "executed" || row.GetCode() != "audit.resolved_executed" ||
		!strings.Contains(row.GetMessage(), "the gateway shows refund R-1") || !strings.Contains(row.GetMessage(), "could not say") {
		t.Fatalf("resolution row: %v", row)
	}
	_, err = e.execute(t, bot, "ticket.refund", strings.Replace(refundInput, `"2500"`, `"100"`, 1), withKey("resolve-1"))
	if refusal(err).GetCode() != "idempotency.resolved_executed" {
		t.Fatalf("retry after the resolution: %v", err)
	}
	_, err = resolve("olive", "", first, "not_executed", "second thoughts", false)
	if refusal(err).GetCode() != "audit.not_resolvable" {
		t.Fatalf("second resolution: %v", err)
	}

	// The receipt answers that the call ran: not_executed contradicts it.
	second := unknownRefund("200", "resolve-2")
	lossy.receiptsDown.Store(false)
	_, err = resolve("olive", "", second, "not_executed", "the customer says no refund arrived", false)
	wantRefused("a verdict the receipt contradicts", "audit.contradicts_receipt", err, second)
	resp, err = resolve("olive", "", second, "not_executed", "the gateway reversed it by hand", true)
	if err != nil {
		t.Fatalf("resolve overriding the receipt: %v", err)
	}
	if row := resp.GetRecord(); resp.GetReceipt() != "executed" || resp.GetKey() != "released" ||
		row.GetOutcome() != "failed" || row.GetUserId() != "olive" || !strings.Contains(row.GetMessage(), "OVERRIDING the backend's receipt") {
		t.Fatalf("override: %v", resp)
	}
	n := 0
	for _, r := range e.rows(t, "acme", second, 3) {
		if r.Phase == audit.PhaseResolution {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d resolution rows, want 1", n)
	}

	// A verdict the receipt agrees with says so.
	third := unknownRefund("300", "resolve-3")
	lossy.receiptsDown.Store(false)
	resp, err = resolve("olive", "", third, "executed", "matches the gateway", false)
	if err != nil || resp.GetReceipt() != "executed" || !strings.Contains(resp.GetRecord().GetMessage(), "receipt agrees") {
		t.Fatalf("resolve agreeing with the receipt: %v %v", resp, err)
	}
}
