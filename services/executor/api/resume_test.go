package api_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/executor"
)

// metered sends an executor's metrics to a manual reader.
func metered(t *testing.T) (func(*executor.Config), *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return func(c *executor.Config) { c.MeterProvider = mp }, reader
}

// resumed is how many calls of ticket.refund resumed from their parked
// arguments (executor.MetricResumed) by the executor reader reads.
func resumed(t *testing.T, reader *sdkmetric.ManualReader) int64 {
	return counted(t, reader, executor.MetricResumed, "ticket.refund")
}

// counted sums the counter name that reader reads, over the data points of
// command (every data point when command is "").
func counted(t *testing.T, reader *sdkmetric.ManualReader, name, command string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := dp.Attributes.Value(executor.AttrCommand); command == "" || v.AsString() == command {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// askApproved makes finance-bot's refund of input, which needs carol's
// approval, and has carol approve it: the challenge, and the refusal's row.
func askApproved(t *testing.T, e *env, input string) (string, audit.Stored) {
	t.Helper()
	_, err := e.execute(t, as(token(t, "acme", "carol", "finance-bot")), "ticket.refund", input)
	ce := refusal(err)
	if ce.GetCode() != "confirmation.required" || ce.GetChallengeId() == "" {
		t.Fatalf("the refund: %v (%v), want confirmation.required", err, ce)
	}
	asked := e.rows(t, "acme", ce.GetInvocationId(), 1)[0]
	if _, err := e.confirm.Decide(context.Background(), carol, ce.GetChallengeId(), true, "api"); err != nil {
		t.Fatal(err)
	}
	return ce.GetChallengeId(), asked
}

// TestAnApprovedCallResumes (issue #28 §4): the refund that needs carol's
// approval is parked when its challenge is opened — the arguments' stages'
// decisions, the sensitive value withheld from the redacted arguments —
// and the approved call, sent again with the grant, resumes from it: its
// arguments are not decoded again (the resumed counter), and it runs
// once, with the arguments, digest and subject the first call's full run
// decided in each row. The parked call is dropped once the grant is
// redeemed, and the spent grant is refused as before.
func TestAnApprovedCallResumes(t *testing.T) { eachStore(t, testAnApprovedCallResumes) }

func testAnApprovedCallResumes(t *testing.T, st stores) {
	opt, reader := metered(t)
	e := start(t, st, opt)
	ctx := context.Background()
	bot := as(token(t, "acme", "carol", "finance-bot"))
	challenge, asked := askApproved(t, e, refundInput)
	p, err := e.execStore.Parked(ctx, "acme", challenge)
	if err != nil || p == nil {
		t.Fatalf("the parked call: %v, %v", p, err)
	}
	if p.Command != "ticket.refund" || p.ArgumentsDigest != asked.ArgumentsDigest || p.Arguments != string(asked.Arguments) ||
		strings.Contains(p.Arguments, "CH4242424242") || len(p.Withheld) != 1 || !p.Expires.After(time.Now()) {
		t.Fatalf("parked %+v, want the refusal's arguments and digest, the cardholder reference withheld", p)
	}

	resp, err := e.execute(t, bot, "ticket.refund", refundInput, withGrant(challenge))
	if err != nil {
		t.Fatalf("the approved call: %v (%v)", err, refusal(err))
	}
	if n := resumed(t, reader); n != 1 {
		t.Fatalf("%d calls resumed, want the approved one", n)
	}
	if got := resp.GetResult().GetFields()["status"].GetStringValue(); got != "REFUND_STATUS_ACCEPTED" {
		t.Fatalf("result %v", resp.GetResult())
	}
	rows := e.rows(t, "acme", resp.GetInvocationId(), 2)
	if len(rows) != 2 || rows[1].Outcome != audit.OutcomeExecuted || rows[1].Approval == nil || rows[1].Approval.Approver != "carol" ||
		rows[1].Approval.ChallengeID != challenge || rows[1].AgentID != "finance-bot" {
		t.Fatalf("rows %+v", rows)
	}
	for _, r := range rows {
		if r.ArgumentsDigest != asked.ArgumentsDigest || string(r.Arguments) != string(asked.Arguments) || r.Subject != asked.Subject || r.Subject == "" {
			t.Fatalf("row %s: arguments %s digest %s subject %q; the full run decided %s %s %q", r.Phase, r.Arguments, r.ArgumentsDigest, r.Subject,
				asked.Arguments, asked.ArgumentsDigest, asked.Subject)
		}
	}
	if n, moved := e.gateway.Refunds(), e.gateway.Moved()["EUR"]; n != 1 || moved != 2500 {
		t.Fatalf("gateway counted %d refunds moving %d, want exactly one of 2500", n, moved)
	}
	// Dropped after the reply.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		p, err := e.execStore.Parked(ctx, "acme", challenge)
		if err != nil {
			t.Fatal(err)
		}
		if p == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the parked call outlived the redemption of its grant")
		}
	}
	if _, err := e.execute(t, bot, "ticket.refund", refundInput, withGrant(challenge)); refusal(err).GetCode() != "confirmation.already_redeemed" {
		t.Fatalf("replayed grant: %v", err)
	}
	if n := e.gateway.Refunds(); n != 1 {
		t.Fatalf("gateway counted %d refunds, want 1", n)
	}
}

// TestOnlyTheSameCallResumes: with carol's approval parked, a call with
// other arguments, carol herself rather than her agent, and the agent
// under an idempotency key the approval was not given for each carry the
// grant: none resumes, each runs in full and is refused
// confirmation.grant_mismatch as before. The approved call then resumes.
func TestOnlyTheSameCallResumes(t *testing.T) { eachStore(t, testOnlyTheSameCallResumes) }

func testOnlyTheSameCallResumes(t *testing.T, st stores) {
	opt, reader := metered(t)
	e := start(t, st, opt)
	bot := as(token(t, "acme", "carol", "finance-bot"))
	challenge, _ := askApproved(t, e, refundInput)
	others := []struct {
		name  string
		ctx   context.Context
		input string
		opts  []func(*mandatev1.ExecuteRequest)
	}{
		{"other arguments", bot, strings.Replace(refundInput, `"2500"`, `"4900"`, 1), nil},
		{"another principal", as(token(t, "acme", "carol", "")), refundInput, nil},
		{"another idempotency key", bot, refundInput, []func(*mandatev1.ExecuteRequest){withKey("not-the-approved-one")}},
	}
	for _, o := range others {
		_, err := e.execute(t, o.ctx, "ticket.refund", o.input, append(o.opts, withGrant(challenge))...)
		if ce := refusal(err); ce.GetCode() != "confirmation.grant_mismatch" || ce.GetStage() != "confirmation_check" {
			t.Fatalf("%s: %v (%v), want confirmation.grant_mismatch", o.name, err, ce)
		}
		if n := resumed(t, reader); n != 0 {
			t.Fatalf("%s: %d calls resumed, want none", o.name, n)
		}
	}
	if _, err := e.execute(t, bot, "ticket.refund", refundInput, withGrant(challenge)); err != nil {
		t.Fatalf("the approved call: %v (%v)", err, refusal(err))
	}
	if n, r := e.gateway.Refunds(), resumed(t, reader); n != 1 || r != 1 {
		t.Fatalf("%d refunds, %d resumed: want the approved call alone, resumed", n, r)
	}
}

// TestAResumedCallIsAuthorisedAgain: carol loses the permission to refund
// between the question and her agent's approved call: the approved call
// is refused at permission_check, before anything is restored; nothing
// moves and the grant is not spent.
func TestAResumedCallIsAuthorisedAgain(t *testing.T) { eachStore(t, testAResumedCallIsAuthorisedAgain) }

func testAResumedCallIsAuthorisedAgain(t *testing.T, st stores) {
	opt, reader := metered(t)
	e := start(t, st, opt)
	ctx := context.Background()
	bot := as(token(t, "acme", "carol", "finance-bot"))
	challenge, _ := askApproved(t, e, refundInput)
	demoted := strings.Replace(policy, "{id: carol, org: finance, roles: [finance]}", "{id: carol, org: finance, roles: [support]}", 1)
	if demoted == policy {
		t.Fatal("the policy has no carol to demote")
	}
	if _, err := directory.Apply(ctx, e.dir, []byte(demoted)); err != nil {
		t.Fatal(err)
	}
	// The executor's directory cache drops carol's entry when the store
	// announces the change (over Postgres, a notification): a check, which
	// redeems nothing, says when.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if r := e.check(t, bot, "ticket.refund", refundInput, withGrant(challenge)).GetReason(); r.GetStage() == "permission_check" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the executor never saw carol lose her role")
		}
	}
	_, err := e.execute(t, bot, "ticket.refund", refundInput, withGrant(challenge))
	if ce := refusal(err); ce.GetStage() != "permission_check" || ce.GetCode() != "authorization.permission_denied" {
		t.Fatalf("the approved call of a demoted user: %v (%v), want a refusal at permission_check", err, ce)
	}
	if n, r := e.gateway.Refunds(), resumed(t, reader); n != 0 || r != 0 {
		t.Fatalf("%d refunds, %d resumed: want none", n, r)
	}
	ch, err := e.confirm.Get(ctx, carol, challenge)
	if err != nil || !ch.RedeemedAt.IsZero() {
		t.Fatalf("the grant: %+v, %v; want it unspent", ch, err)
	}
}

// TestAnExpiredParkedCallRunsInFull: the approved call whose parked state
// expired decodes its arguments as any call does, and runs.
func TestAnExpiredParkedCallRunsInFull(t *testing.T) { eachStore(t, testAnExpiredParkedCallRunsInFull) }

func testAnExpiredParkedCallRunsInFull(t *testing.T, st stores) {
	opt, reader := metered(t)
	e := start(t, st, opt)
	ctx := context.Background()
	challenge, _ := askApproved(t, e, refundInput)
	p, err := e.execStore.Parked(ctx, "acme", challenge)
	if err != nil || p == nil {
		t.Fatalf("the parked call: %v, %v", p, err)
	}
	p.Expires = time.Now().Add(time.Millisecond)
	if err := e.execStore.Park(ctx, *p); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if _, err := e.execute(t, as(token(t, "acme", "carol", "finance-bot")), "ticket.refund", refundInput, withGrant(challenge)); err != nil {
		t.Fatalf("the approved call: %v (%v)", err, refusal(err))
	}
	if n, r := e.gateway.Refunds(), resumed(t, reader); n != 1 || r != 0 {
		t.Fatalf("%d refunds, %d resumed: want one refund, run in full", n, r)
	}
}

// noParking is an executor store that refuses to park.
type noParking struct{ executor.Store }

func (noParking) Park(context.Context, executor.Parked) error {
	return errors.New("parking refused")
}

// TestACallThatCannotBeParkedStillAsks: the executor's store refuses to
// park the call; the call is refused confirmation.required all the same,
// and the approved call runs in full.
func TestACallThatCannotBeParkedStillAsks(t *testing.T) {
	eachStore(t, func(t *testing.T, st stores) {
		b := memoryBacking(t)
		if st == postgresStores {
			b = postgresBacking(t, context.Background())
		}
		b.execStore = noParking{b.execStore}
		opt, reader := metered(t)
		e := startOn(t, b, embedded(t), opt)
		challenge, _ := askApproved(t, e, refundInput)
		if p, err := e.execStore.Parked(context.Background(), "acme", challenge); err != nil || p != nil {
			t.Fatalf("parked %+v, %v; want nothing", p, err)
		}
		if _, err := e.execute(t, as(token(t, "acme", "carol", "finance-bot")), "ticket.refund", refundInput, withGrant(challenge)); err != nil {
			t.Fatalf("the approved call: %v (%v)", err, refusal(err))
		}
		if n, r := e.gateway.Refunds(), resumed(t, reader); n != 1 || r != 0 {
			t.Fatalf("%d refunds, %d resumed: want one refund, run in full", n, r)
		}
	})
}

// TestAnApprovedCallResumesOnAnotherReplica: the call is parked by one
// executor; its approved call reaches another on the same stores, and
// resumes there.
func TestAnApprovedCallResumesOnAnotherReplica(t *testing.T) {
	eachStore(t, func(t *testing.T, st stores) {
		first := start(t, st)
		challenge, _ := askApproved(t, first, refundInput)
		opt, reader := metered(t)
		other := startOn(t, first.backing, embedded(t), opt)
		resp, err := other.execute(t, as(token(t, "acme", "carol", "finance-bot")), "ticket.refund", refundInput, withGrant(challenge))
		if err != nil {
			t.Fatalf("the approved call on the other replica: %v (%v)", err, refusal(err))
		}
		if n, r := other.gateway.Refunds(), resumed(t, reader); n != 1 || r != 1 {
			t.Fatalf("%d refunds, %d resumed on the other replica: want the approved call, resumed", n, r)
		}
		if rows := other.rows(t, "acme", resp.GetInvocationId(), 2); len(rows) != 2 || rows[1].Outcome != audit.OutcomeExecuted {
			t.Fatalf("rows %+v", rows)
		}
	})
}
