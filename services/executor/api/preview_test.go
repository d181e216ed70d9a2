package api_test

import (
	"context"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/executor"
)

// The helpdesk's previews (examples/helpdesk/preview.go) over the executor's preflight
// (services/executor/preview.go): a refund the backend would refuse never reaches a human.

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// refusedAtOnce asserts that err is the backend's refusal at stage with code and gRPC code c,
// given before anyone was asked: one outcome row (refused, that stage and code, no intent),
// no challenge for carol, no money moved.
func (e *env) refusedAtOnce(t *testing.T, err error, c codes.Code, stage, code string, pendingBefore int) {
	t.Helper()
	ce := refusal(err)
	if status.Code(err) != c || ce.GetStage() != stage || ce.GetCode() != code || ce.GetChallengeId() != "" {
		t.Fatalf("refused with %v %s/%s (challenge %q), want %v %s/%s and no challenge", status.Code(err), ce.GetStage(), ce.GetCode(), ce.GetChallengeId(), c, stage, code)
	}
	rows := e.rows(t, "acme", ce.GetInvocationId(), 1)
	if len(rows) != 1 || rows[0].Phase != audit.PhaseOutcome || rows[0].Outcome != audit.OutcomeRefused ||
		rows[0].Stage != stage || rows[0].Code != code {
		t.Fatalf("the trail of the refused call: %+v", rows)
	}
	if n := e.pendingFor(t); n != pendingBefore {
		t.Fatalf("carol has %d pending challenges, want %d: a human was asked about a call the backend refuses", n, pendingBefore)
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("the gateway counted %d refunds", n)
	}
}

// TestPreviewRefusesAMissingTicket: a refund of a ticket that does not exist is refused at
// once with the backend's state_check / state.not_found (NotFound), audited as one refused
// row, and carol is not asked.
func TestPreviewRefusesAMissingTicket(t *testing.T) { eachStore(t, testPreviewRefusesAMissingTicket) }

func testPreviewRefusesAMissingTicket(t *testing.T, st stores) {
	e := start(t, st)
	bot := as(token(t, "acme", "carol", "finance-bot"))
	_, err := e.execute(t, bot, "ticket.refund", strings.Replace(refundInput, "T-1001", "T-9999", 1))
	e.refusedAtOnce(t, err, codes.NotFound, "state_check", "state.not_found", 0)
}

// TestPreviewRefusesARefundBeyondWhatIsLeft: a refund larger than what is left is refused
// with pre_invariant / refund.exceeds_paid before any human is asked — a client error on
// every channel (FailedPrecondition over gRPC, 422 over REST), the same again with the same
// key (nothing was reserved for it), and no money moved.
func TestPreviewRefusesARefundBeyondWhatIsLeft(t *testing.T) {
	eachStore(t, testPreviewRefusesARefundBeyondWhatIsLeft)
}

func testPreviewRefusesARefundBeyondWhatIsLeft(t *testing.T, st stores) {
	e := start(t, st)
	bot := as(token(t, "acme", "carol", "finance-bot"))
	tooMuch := strings.Replace(refundInput, `"2500"`, `"999999"`, 1)
	_, err := e.execute(t, bot, "ticket.refund", tooMuch, withKey("too-much-1"))
	e.refusedAtOnce(t, err, codes.FailedPrecondition, "pre_invariant", "refund.exceeds_paid", 0)
	if !strings.Contains(refusal(err).GetMessage(), "49.90 EUR") {
		t.Fatalf("the refusal does not say what is left: %q", refusal(err).GetMessage())
	}
	_, err = e.execute(t, bot, "ticket.refund", tooMuch, withKey("too-much-1"))
	e.refusedAtOnce(t, err, codes.FailedPrecondition, "pre_invariant", "refund.exceeds_paid", 0)
	code, body := e.restPost(t, "/v1/commands/ticket.refund:execute", token(t, "acme", "carol", "finance-bot"), `{"input":`+tooMuch+`}`, "Idempotency-Key", "too-much-1")
	if code != http.StatusUnprocessableEntity || body["code"] != "refund.exceeds_paid" || body["stage"] != "pre_invariant" {
		t.Fatalf("over REST: %d %v", code, body)
	}
	if n := e.pendingFor(t); n != 0 {
		t.Fatalf("carol has %d pending challenges", n)
	}
}

// TestPreviewShownInTheChallenge: a refund the backend would run opens a challenge whose
// prompt carries the backend's effect line and the digest of the preview.
func TestPreviewShownInTheChallenge(t *testing.T) { eachStore(t, testPreviewShownInTheChallenge) }

func testPreviewShownInTheChallenge(t *testing.T, st stores) {
	e := start(t, st)
	bot := as(token(t, "acme", "carol", "finance-bot"))
	_, err := e.execute(t, bot, "ticket.refund", refundInput)
	id := refusal(err).GetChallengeId()
	if refusal(err).GetCode() != "confirmation.required" || id == "" {
		t.Fatalf("the refund opened no challenge: %v", err)
	}
	c, err := e.confirm.Get(context.Background(), carol, id)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"refund 25.00 EUR of 49.90 EUR paid; 0.00 EUR refunded so far"}
	if !slices.Equal(c.Prompt.Effects, want) || !hex64.MatchString(c.Prompt.PreviewDigest) {
		t.Fatalf("the prompt's effects %q, digest %q; want %q and a digest", c.Prompt.Effects, c.Prompt.PreviewDigest, want)
	}
}

// TestPreviewStateMovedBeforeDispatch: carol approves a refund of 25.00 EUR on T-1001 (49.90
// EUR paid, nothing refunded: the preview allowed it), then a second refund of 30.00 EUR is
// approved and runs first. The first call, made with its approval, is dispatched and refused
// by the backend — which checks again — with pre_invariant / refund.exceeds_paid, a client
// error with its intent and outcome rows, replayed as such for its key: the gateway moved
// 30.00 EUR once and never more than was paid.
func TestPreviewStateMovedBeforeDispatch(t *testing.T) {
	eachStore(t, testPreviewStateMovedBeforeDispatch)
}

func testPreviewStateMovedBeforeDispatch(t *testing.T, st stores) {
	e := start(t, st)
	ctx := context.Background()
	bot := as(token(t, "acme", "carol", "finance-bot"))
	approved := func(input, key string) string {
		t.Helper()
		_, err := e.execute(t, bot, "ticket.refund", input, withKey(key))
		id := refusal(err).GetChallengeId()
		if id == "" {
			t.Fatalf("no challenge for %s: %v", input, err)
		}
		if _, err := e.confirm.Decide(ctx, carol, id, true, "api"); err != nil {
			t.Fatal(err)
		}
		return id
	}
	first := approved(refundInput, "first")
	second := strings.Replace(refundInput, `"2500"`, `"3000"`, 1)
	secondGrant := approved(second, "second")
	if _, err := e.execute(t, bot, "ticket.refund", second, withKey("second"), withGrant(secondGrant)); err != nil {
		t.Fatalf("the second refund: %v (%v)", err, refusal(err))
	}

	_, err := e.execute(t, bot, "ticket.refund", refundInput, withKey("first"), withGrant(first))
	ce := refusal(err)
	if status.Code(err) != codes.FailedPrecondition || ce.GetStage() != "pre_invariant" || ce.GetCode() != "refund.exceeds_paid" {
		t.Fatalf("the approved refund after the state moved: %v %+v", status.Code(err), ce)
	}
	rows := e.rows(t, "acme", ce.GetInvocationId(), 2)
	if len(rows) != 2 || rows[0].Phase != audit.PhaseIntent || rows[1].Outcome != audit.OutcomeRefused || rows[1].Code != "refund.exceeds_paid" {
		t.Fatalf("the trail of the dispatched refusal: %+v", rows)
	}
	_, err = e.execute(t, bot, "ticket.refund", refundInput, withKey("first"), withGrant(first))
	if status.Code(err) != codes.FailedPrecondition || refusal(err).GetCode() != "refund.exceeds_paid" {
		t.Fatalf("the replay: %v %+v", status.Code(err), refusal(err))
	}
	if n := e.gateway.Refunds(); n != 1 {
		t.Fatalf("the gateway counted %d refunds, want 1", n)
	}
	tk, err := e.helpdesk.Ticket(ctx, "acme", "T-1001")
	if err != nil {
		t.Fatal(err)
	}
	if tk.Refunded.Minor != 3000 || tk.Refunded.Minor > tk.Paid.Minor {
		t.Fatalf("T-1001 refunded %d of %d", tk.Refunded.Minor, tk.Paid.Minor)
	}
}

// withoutPreview is the executor's dispatcher with only Dispatch: a backend that offers no
// preview, as every backend before mandate.v1.PreviewService.
type withoutPreview struct{ d executor.Dispatcher }

func (w withoutPreview) Dispatch(ctx context.Context, d executor.Dispatch) (executor.Reply, error) {
	return w.d.Dispatch(ctx, d)
}

// TestNoPreviewAsBefore: without a preview the executor asks as it always did — a refund of
// a missing ticket opens a challenge with no effect lines, and only the dispatch of the
// approved call meets the backend's state.not_found.
func TestNoPreviewAsBefore(t *testing.T) { eachStore(t, testNoPreviewAsBefore) }

func testNoPreviewAsBefore(t *testing.T, st stores) {
	e := start(t, st, func(c *executor.Config) { c.Dispatcher = withoutPreview{c.Dispatcher} })
	ctx := context.Background()
	bot := as(token(t, "acme", "carol", "finance-bot"))
	missing := strings.Replace(refundInput, "T-1001", "T-9999", 1)
	_, err := e.execute(t, bot, "ticket.refund", missing)
	id := refusal(err).GetChallengeId()
	if refusal(err).GetCode() != "confirmation.required" || id == "" {
		t.Fatalf("without a preview: %v", err)
	}
	c, err := e.confirm.Get(ctx, carol, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Prompt.Effects) != 0 || c.Prompt.PreviewDigest != "" {
		t.Fatalf("a prompt without a preview shows effects %q, digest %q", c.Prompt.Effects, c.Prompt.PreviewDigest)
	}
	if _, err := e.confirm.Decide(ctx, carol, id, true, "api"); err != nil {
		t.Fatal(err)
	}
	_, err = e.execute(t, bot, "ticket.refund", missing, withGrant(id))
	if ce := refusal(err); status.Code(err) != codes.NotFound || ce.GetStage() != "state_check" || ce.GetCode() != "state.not_found" {
		t.Fatalf("the approved call: %v %+v", status.Code(err), ce)
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("the gateway counted %d refunds", n)
	}
}
