package confirm_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
	"github.com/mandate-dev/mandate/services/confirm/trail"
)

// rows is a confirm.Trail that keeps the audit row of every attempt, as
// the audit-backed trail builds it (trail.Row).
type rows struct {
	mu   sync.Mutex
	rows []*mandatev1.AuditRecord
}

func (r *rows) Record(_ context.Context, a confirm.Attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rows = append(r.rows, trail.Row(a))
}

// take returns the rows recorded since the last take.
func (r *rows) take() []*mandatev1.AuditRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.rows
	r.rows = nil
	return out
}

func setupTrail(t *testing.T) (*fixture, *rows) {
	t.Helper()
	f := setup(t, false)
	tr := &rows{}
	svc, err := confirm.New(confirm.Config{
		Store: f.store, Directory: directory.Direct(f.dir), Commands: confirmtest.Commands(), Trail: tr,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.svc = svc
	return f, tr
}

// wantRow checks the one row an attempt left: phase decision, its own id,
// filed under the decider's tenant, naming the decider, the challenge and
// (when it could be read) the invocation it belongs to, the verdict asked,
// and the outcome: refused with stage and code, or approved or declined.
type wantRow struct {
	tenant, user, agent, actor string
	challenge, invocation      string
	command                    string
	verdict, channel           string
	outcome, code              string
}

func checkRow(t *testing.T, what string, got []*mandatev1.AuditRecord, w wantRow) {
	t.Helper()
	if len(got) != 1 {
		t.Fatalf("%s: %d decision rows, want 1: %v", what, len(got), got)
	}
	r := got[0]
	var args trail.Arguments
	if err := json.Unmarshal([]byte(r.GetArgumentsJson()), &args); err != nil {
		t.Fatalf("%s: arguments %q: %v", what, r.GetArgumentsJson(), err)
	}
	stage := ""
	if w.code != "" {
		stage = failure.StageConfirmation
	}
	if r.GetPhase() != "decision" || len(r.GetInvocationId()) != 22 || r.GetInvocationId() == w.challenge ||
		r.GetTenant() != w.tenant || r.GetUserId() != w.user || r.GetAgentId() != w.agent || r.GetActorKind() != w.actor ||
		r.GetSubject() != w.challenge || args.ChallengeID != w.challenge || args.InvocationID != w.invocation ||
		r.GetCommand() != w.command || args.Verdict != w.verdict || args.Channel != w.channel ||
		r.GetOutcome() != w.outcome || r.GetCode() != w.code || r.GetStage() != stage || (w.code != "" && r.GetMessage() == "") {
		t.Fatalf("%s: row %v (arguments %+v), want %+v", what, r, args, w)
	}
}

// Every attempt to decide, accepted or refused, leaves one decision row;
// one test per refusal kind.
func TestDecisionRows(t *testing.T) {
	ctx := context.Background()
	refused := func(c confirm.Challenge, p identity.Principal, verdict, channel, code string) wantRow {
		actor := string(p.Kind)
		if p.AgentID != "" {
			actor = "agent"
		}
		return wantRow{tenant: p.Tenant, user: p.UserID, agent: p.AgentID, actor: actor, challenge: c.ID, invocation: c.InvocationID,
			command: c.Command, verdict: verdict, channel: channel, outcome: "refused", code: code}
	}

	t.Run("an agent deciding", func(t *testing.T) {
		f, tr := setupTrail(t)
		c := f.open(t, botForAlice, "payment.payout")
		_, err := f.svc.Decide(ctx, financeBot, c.ID, true, confirm.ChannelAPI)
		wantCode(t, "finance-bot approving", err, failure.CodeConfirmationApproverNotAllowed)
		checkRow(t, "finance-bot approving", tr.take(), refused(c, financeBot, "approve", "api", failure.CodeConfirmationApproverNotAllowed))
		_, err = f.svc.Decide(ctx, botForAlice, c.ID, false, "")
		wantCode(t, "support-bot declining", err, failure.CodeConfirmationApproverNotAllowed)
		checkRow(t, "support-bot declining", tr.take(), refused(c, botForAlice, "decline", "api", failure.CodeConfirmationApproverNotAllowed))
	})

	t.Run("the requester approving her own four-eyes request", func(t *testing.T) {
		f, tr := setupTrail(t)
		c := f.open(t, botForAlice, "payment.payout")
		_, err := f.svc.Decide(ctx, alice, c.ID, true, confirm.ChannelApprovalPage)
		wantCode(t, "alice approving", err, failure.CodeConfirmationApproverNotAllowed)
		checkRow(t, "alice approving", tr.take(), refused(c, alice, "approve", "approval_page", failure.CodeConfirmationApproverNotAllowed))
	})

	t.Run("a user without the approver's permission", func(t *testing.T) {
		f, tr := setupTrail(t)
		c := f.open(t, botForAlice, "payment.payout")
		_, err := f.svc.Decide(ctx, mallory, c.ID, true, confirm.ChannelApprovalPage)
		wantCode(t, "mallory approving", err, failure.CodeConfirmationApproverNotAllowed)
		checkRow(t, "mallory approving", tr.take(), refused(c, mallory, "approve", "approval_page", failure.CodeConfirmationApproverNotAllowed))
	})

	t.Run("a disabled approver", func(t *testing.T) {
		f, tr := setupTrail(t)
		c := f.open(t, botForAlice, "payment.payout")
		_, err := f.svc.Decide(ctx, bob, c.ID, true, confirm.ChannelApprovalPage)
		wantCode(t, "bob approving", err, failure.CodeAuthorizationPrincipalInactive)
		checkRow(t, "bob approving", tr.take(), refused(c, bob, "approve", "approval_page", failure.CodeAuthorizationPrincipalInactive))
	})

	t.Run("an L4 approval off the approval page", func(t *testing.T) {
		f, tr := setupTrail(t)
		c := f.open(t, botForAlice, "payment.payout")
		_, err := f.svc.Decide(ctx, carol, c.ID, true, confirm.ChannelAPI)
		wantCode(t, "carol over the API", err, failure.CodeConfirmationApproverNotAllowed)
		checkRow(t, "carol over the API", tr.take(), refused(c, carol, "approve", "api", failure.CodeConfirmationApproverNotAllowed))
	})

	t.Run("another tenant's challenge", func(t *testing.T) {
		f, tr := setupTrail(t)
		c := f.open(t, botForAlice, "ticket.refund")
		_, err := f.svc.Decide(ctx, gina, c.ID, true, confirm.ChannelAPI)
		wantCode(t, "gina approving", err, failure.CodeConfirmationNotFound)
		// Filed under gina's tenant, with nothing of acme's challenge.
		checkRow(t, "gina approving", tr.take(), wantRow{tenant: "globex", user: "gina", actor: "user", challenge: c.ID,
			verdict: "approve", channel: "api", outcome: "refused", code: failure.CodeConfirmationNotFound})
	})

	t.Run("an unknown channel", func(t *testing.T) {
		f, tr := setupTrail(t)
		c := f.open(t, botForAlice, "ticket.refund")
		_, err := f.svc.Decide(ctx, alice, c.ID, true, "carrier-pigeon")
		wantCode(t, "a channel of no kind", err, failure.CodeSchemaInvalid)
		checkRow(t, "a channel of no kind", tr.take(), refused(c, alice, "approve", "carrier-pigeon", failure.CodeSchemaInvalid))
	})

	t.Run("deciding twice, and after expiry", func(t *testing.T) {
		f, tr := setupTrail(t)
		c := f.open(t, botForAlice, "ticket.refund")
		if _, err := f.svc.Decide(ctx, alice, c.ID, false, confirm.ChannelAPI); err != nil {
			t.Fatal(err)
		}
		checkRow(t, "alice declining", tr.take(), wantRow{tenant: "acme", user: "alice", actor: "user", challenge: c.ID, invocation: c.InvocationID,
			command: c.Command, verdict: "decline", channel: "api", outcome: "declined"})
		_, err := f.svc.Decide(ctx, alice, c.ID, true, confirm.ChannelAPI)
		wantCode(t, "second decision", err, failure.CodeConfirmationAlreadyDecided)
		checkRow(t, "second decision", tr.take(), refused(c, alice, "approve", "api", failure.CodeConfirmationAlreadyDecided))

		late := f.open(t, botForAlice, "ticket.refund")
		f.clock.Advance(confirm.DefaultTTL)
		_, err = f.svc.Decide(ctx, alice, late.ID, true, confirm.ChannelAPI)
		wantCode(t, "after expiry", err, failure.CodeConfirmationExpired)
		checkRow(t, "after expiry", tr.take(), refused(late, alice, "approve", "api", failure.CodeConfirmationExpired))
	})

	t.Run("an elicited answer for a headless agent, and one accepted", func(t *testing.T) {
		f, tr := setupTrail(t)
		cronBot := identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "cron-bot", Via: identity.MCPBridgeService}
		c := f.open(t, cronBot, "ticket.refund")
		_, err := f.svc.DecideElicited(ctx, cronBot, c.ID, true)
		wantCode(t, "cron-bot's client answering", err, failure.CodeConfirmationApproverNotAllowed)
		checkRow(t, "cron-bot's client answering", tr.take(), refused(c, cronBot, "approve", "mcp_elicitation", failure.CodeConfirmationApproverNotAllowed))
		mine := f.open(t, botForAlice, "ticket.refund")
		bridged := botForAlice
		bridged.Via = identity.MCPBridgeService
		if _, err := f.svc.DecideElicited(ctx, bridged, mine.ID, true); err != nil {
			t.Fatal(err)
		}
		got := tr.take()
		checkRow(t, "support-bot's interactive client answering", got, wantRow{tenant: "acme", user: "alice", agent: "support-bot", actor: "agent",
			challenge: mine.ID, invocation: mine.InvocationID, command: mine.Command, verdict: "approve", channel: "mcp_elicitation", outcome: "approved"})
		var args trail.Arguments
		_ = json.Unmarshal([]byte(got[0].GetArgumentsJson()), &args)
		if got[0].GetChannel() != "mcp" || args.Assurance != "client_attested" || args.Via != identity.MCPBridgeService {
			t.Fatalf("an elicited answer's row: channel %q, arguments %+v; want mcp, client_attested, via the bridge", got[0].GetChannel(), args)
		}
	})

	t.Run("the four-eyes approver, accepted", func(t *testing.T) {
		f, tr := setupTrail(t)
		c := f.open(t, botForAlice, "payment.payout")
		if _, err := f.svc.Decide(ctx, carol, c.ID, true, confirm.ChannelApprovalPage); err != nil {
			t.Fatal(err)
		}
		got := tr.take()
		checkRow(t, "carol approving", got, wantRow{tenant: "acme", user: "carol", actor: "user", challenge: c.ID, invocation: c.InvocationID,
			command: c.Command, verdict: "approve", channel: "approval_page", outcome: "approved"})
		if got[0].GetChannel() != "rest" || got[0].GetRisk() != "L4" {
			t.Fatalf("the approval page's row: channel %q risk %q, want rest and L4", got[0].GetChannel(), got[0].GetRisk())
		}
		var args trail.Arguments
		_ = json.Unmarshal([]byte(got[0].GetArgumentsJson()), &args)
		if args.Assurance != "signed_in" {
			t.Fatalf("assurance %q, want signed_in", args.Assurance)
		}
	})

	t.Run("a transport's own refusal", func(t *testing.T) {
		f, tr := setupTrail(t)
		c := f.open(t, botForAlice, "ticket.refund")
		err := f.svc.RefuseDecision(ctx, botForAlice, c.ID, "", "mcp_elicitation", confirm.ErrApproverNotAllowed)
		wantCode(t, "RefuseDecision", err, failure.CodeConfirmationApproverNotAllowed)
		checkRow(t, "RefuseDecision", tr.take(), refused(c, botForAlice, "", "mcp_elicitation", failure.CodeConfirmationApproverNotAllowed))
	})

	t.Run("a service without a tenant", func(t *testing.T) {
		f, tr := setupTrail(t)
		c := f.open(t, botForAlice, "ticket.refund")
		_, err := f.svc.Decide(ctx, identity.Principal{Kind: identity.KindService, ServiceName: "executor"}, c.ID, true, confirm.ChannelAPI)
		wantCode(t, "a service deciding", err, failure.CodeConfirmationApproverNotAllowed)
		if got := tr.take(); len(got) != 0 {
			t.Fatalf("a row with no tenant to file it under: %v", got)
		}
	})
}
