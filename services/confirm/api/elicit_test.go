package api_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/api"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
	execapi "github.com/mandate-dev/mandate/services/executor/api"
)

// elicitCommands adds to the shared fixtures one declaration per rule that
// elicitation must respect on its own: a four-eyes command below L4, and an
// L4 command whose approver is the requesting user.
func elicitCommands() confirmtest.CommandSet {
	set := confirmtest.Commands()
	set["ledger.adjust"] = &manifest.Command{
		Code: "ledger.adjust", DisplayName: "Adjust the ledger", Risk: "L3", Lifecycle: "PUBLISHED",
		SideEffects: []string{"ledger"}, Permissions: []string{"payment.refund"}, ConfirmationRequired: true,
		Approver: manifest.Approver{Kind: "PERMISSION_HOLDER", Permission: "payment.approve", Declared: true},
	}
	set["vendor.close"] = &manifest.Command{
		Code: "vendor.close", DisplayName: "Close a vendor", Risk: "L4", Lifecycle: "PUBLISHED",
		SideEffects: []string{"ledger"}, Permissions: []string{"vendor.manage"}, ConfirmationRequired: true,
		Approver: manifest.Approver{Kind: "REQUESTING_USER", Declared: true},
	}
	return set
}

var (
	elicitBot   = identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "support-bot"}
	elicitAlice = identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "alice"}
	cronBot     = identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "cron-bot"}
)

var elicitInvocations int

// openFor opens a challenge for command as the executor relaying p.
func openFor(t *testing.T, svc *confirm.Service, p identity.Principal, command string) confirm.Challenge {
	t.Helper()
	elicitInvocations++
	inv := fmt.Sprintf("inv-elicit-%d-%d", time.Now().UnixNano(), elicitInvocations)
	p.Via = "executor"
	c, err := svc.Open(context.Background(), p, confirm.OpenRequest{
		Command: command, InvocationDigest: confirmtest.Digest(inv), InvocationID: inv,
		ArgumentsJSON: `{"ticket_id":"T-1","cardholder_reference":"[withheld]"}`, WithheldFields: []string{"/cardholder_reference"},
	})
	if err != nil {
		t.Fatalf("Open %s: %v", command, err)
	}
	return c
}

func wantConfirmCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	var ce *confirm.Error
	if !errors.As(err, &ce) || ce.Code != code {
		t.Fatalf("%s: got %v, want %s", what, err, code)
	}
}

// TestDecideElicited applies each rule of confirm.Service.DecideElicited on
// both stores: the session's own call under a requesting-user policy is
// recorded as its user through mcp_elicitation; everything else is refused
// with the code that says why.
func TestDecideElicited(t *testing.T) {
	for name, b := range backends {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dir := newDirectory(t)
			svc, err := confirm.New(confirm.Config{Store: b(t), Directory: directory.Direct(dir), Commands: elicitCommands(), ApprovalBaseURL: "https://confirm.example"})
			if err != nil {
				t.Fatal(err)
			}

			// The agent's session answers its own refund: recorded as alice.
			c := openFor(t, svc, elicitBot, "ticket.refund")
			got, err := svc.DecideElicited(ctx, elicitBot, c.ID, true)
			if err != nil || got.State != confirm.StateApproved || got.DecidedBy != "alice" || got.DecisionChannel != confirm.ChannelMCPElicitation {
				t.Fatalf("approve: %+v %v", got, err)
			}
			g, err := svc.Redeem(ctx, identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "support-bot", Via: "executor"}, c.ID, c.InvocationDigest, "")
			if err != nil || g.Approver != "alice" || g.Channel != confirm.ChannelMCPElicitation {
				t.Fatalf("redeem the elicited grant: %+v %v", g, err)
			}
			_, err = svc.DecideElicited(ctx, elicitBot, c.ID, false)
			wantConfirmCode(t, "answering twice", err, failure.CodeConfirmationAlreadyDecided)

			// A decline is recorded the same way and refuses the grant.
			d := openFor(t, svc, elicitBot, "ticket.refund")
			got, err = svc.DecideElicited(ctx, elicitBot, d.ID, false)
			if err != nil || got.State != confirm.StateDeclined || got.DecidedBy != "alice" || got.DecisionChannel != confirm.ChannelMCPElicitation {
				t.Fatalf("decline: %+v %v", got, err)
			}
			_, err = svc.Redeem(ctx, identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "support-bot", Via: "executor"}, d.ID, d.InvocationDigest, "")
			wantConfirmCode(t, "redeeming a declined challenge", err, failure.CodeConfirmationRefused)

			pending := openFor(t, svc, elicitBot, "ticket.refund")
			refusals := []struct {
				name string
				p    identity.Principal
				id   string
				code string
			}{
				{"alice's own session, not the agent's that asked", elicitAlice, pending.ID, failure.CodeConfirmationApproverNotAllowed},
				{"another agent of the tenant", identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "carol", AgentID: "finance-bot"}, pending.ID, failure.CodeConfirmationApproverNotAllowed},
				{"another user of the tenant", identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "carol"}, pending.ID, failure.CodeConfirmationApproverNotAllowed},
				{"a user of another tenant", identity.Principal{Kind: identity.KindUser, Tenant: "globex", UserID: "gina"}, pending.ID, failure.CodeConfirmationNotFound},
				{"a service", identity.Principal{Kind: identity.KindService, ServiceName: "mcpbridge"}, pending.ID, failure.CodeConfirmationApproverNotAllowed},
				{"a malformed id", elicitBot, "not-an-id", failure.CodeConfirmationNotFound},
				{"four eyes below L4", elicitBot, openFor(t, svc, elicitBot, "ledger.adjust").ID, failure.CodeConfirmationApproverNotAllowed},
				{"L4 with the requesting user as approver", elicitBot, openFor(t, svc, elicitBot, "vendor.close").ID, failure.CodeConfirmationApproverNotAllowed},
				{"L4 four eyes", elicitBot, openFor(t, svc, elicitBot, "payment.payout").ID, failure.CodeConfirmationApproverNotAllowed},
				{"a headless agent's own call", cronBot, openFor(t, svc, cronBot, "ticket.refund").ID, failure.CodeConfirmationApproverNotAllowed},
			}
			for _, r := range refusals {
				_, err := svc.DecideElicited(ctx, r.p, r.id, true)
				wantConfirmCode(t, r.name, err, r.code)
			}
			// Get tells the bridge, per caller, whether a form may be used.
			for _, e := range []struct {
				name string
				p    identity.Principal
				cmd  string
				want bool
			}{
				{"interactive agent, requesting-user policy", elicitBot, "ticket.refund", true},
				{"headless agent", cronBot, "ticket.refund", false},
				{"four eyes", elicitBot, "ledger.adjust", false},
				{"L4", elicitBot, "vendor.close", false},
			} {
				c := openFor(t, svc, e.p, e.cmd)
				got, err := svc.Get(ctx, e.p, c.ID)
				if err != nil || got.Elicitable != e.want {
					t.Fatalf("%s: Elicitable = %v (%v), want %v", e.name, got.Elicitable, err, e.want)
				}
			}
			headless := openFor(t, svc, cronBot, "ticket.refund")
			_, err = svc.DecideElicited(ctx, cronBot, headless.ID, true)
			var he *confirm.Error
			if !errors.As(err, &he) || !strings.Contains(he.Message, "headless") || !strings.Contains(he.Message, "approval page") {
				t.Fatalf("headless agent answering its form: %v", err)
			}

			// None of the refusals decided anything.
			if c, err := svc.Get(ctx, elicitBot, pending.ID); err != nil || c.State != confirm.StatePending {
				t.Fatalf("pending challenge after refusals: %+v %v", c, err)
			}
			for _, code := range []string{"ledger.adjust", "vendor.close", "payment.payout"} {
				c := openFor(t, svc, elicitBot, code)
				_, err := svc.DecideElicited(ctx, elicitBot, c.ID, true)
				var ce *confirm.Error
				if !errors.As(err, &ce) || !strings.Contains(ce.Message, "approval page") {
					t.Fatalf("%s: message %v should send the user to the approval page", code, err)
				}
			}

			// A disabled user's sessions answer nothing.
			disabled := strings.Replace(confirmtest.Policy, "{id: alice, roles: [support]}", "{id: alice, roles: [support], disabled: true}", 1)
			if _, err := directory.Apply(ctx, dir, []byte(disabled)); err != nil {
				t.Fatal(err)
			}
			_, err = svc.DecideElicited(ctx, elicitBot, pending.ID, true)
			wantConfirmCode(t, "disabled user", err, failure.CodeAuthorizationPrincipalInactive)
		})
	}
}

// TestElicitedDecisionOverGRPC: only the MCP bridge's relay records
// mcp_elicitation; agents deciding directly are refused whatever channel
// they name.
func TestElicitedDecisionOverGRPC(t *testing.T) {
	if api.MCPBridgeService != execapi.MCPBridgeService {
		t.Fatalf("confirm/api.MCPBridgeService %q, executor/api.MCPBridgeService %q", api.MCPBridgeService, execapi.MCPBridgeService)
	}
	for name, b := range backends {
		t.Run(name, func(t *testing.T) {
			e := start(t, b(t))
			src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", api.MCPBridgeService, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			bridgeConn, err := grpc.NewClient(e.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = bridgeConn.Close() })
			bridge := mandatev1.NewConfirmServiceClient(bridgeConn)
			direct := mandatev1.NewConfirmServiceClient(e.conn)
			bot, alice := token(t, "acme", "alice", "support-bot"), token(t, "acme", "alice", "")
			financeBot := token(t, "acme", "carol", "finance-bot")
			decide := func(id, channel string) *mandatev1.DecideRequest {
				return &mandatev1.DecideRequest{ChallengeId: id, Decision: mandatev1.Decision_DECISION_APPROVE, Channel: channel}
			}

			c := e.open(t, bot, openReq("ticket.refund"))
			id := c.GetChallengeId()
			for _, ch := range []string{"", "api", "mcp_elicitation"} {
				_, err := direct.Decide(as(bot), decide(id, ch))
				wantRefusal(t, "support-bot deciding directly on channel "+ch, err, codes.PermissionDenied, failure.CodeConfirmationApproverNotAllowed)
			}
			_, err = bridge.Decide(relaying(bot), decide(id, "api"))
			wantRefusal(t, "the bridge relaying the agent on the api channel", err, codes.PermissionDenied, failure.CodeConfirmationApproverNotAllowed)
			_, err = mandatev1.NewConfirmServiceClient(e.svc).Decide(relaying(bot), decide(id, "mcp_elicitation"))
			wantRefusal(t, "the executor relaying the agent on mcp_elicitation", err, codes.PermissionDenied, failure.CodeConfirmationApproverNotAllowed)
			_, err = bridge.Decide(relaying(financeBot), decide(id, "mcp_elicitation"))
			wantRefusal(t, "the bridge relaying another agent's session", err, codes.PermissionDenied, failure.CodeConfirmationApproverNotAllowed)

			got, err := bridge.Decide(relaying(bot), decide(id, "mcp_elicitation"))
			if err != nil || got.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_APPROVED ||
				got.GetDecidedBy() != "alice" || got.GetDecisionChannel() != "mcp_elicitation" {
				t.Fatalf("the bridge relaying support-bot's session: %v %v", got, err)
			}

			// The requester's own user session (alice, no agent) answers
			// her own call the same way.
			own := e.open(t, alice, openReq("ticket.refund"))
			got, err = bridge.Decide(relaying(alice), &mandatev1.DecideRequest{ChallengeId: own.GetChallengeId(), Decision: mandatev1.Decision_DECISION_DECLINE, Channel: "mcp_elicitation"})
			if err != nil || got.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_DECLINED || got.GetDecidedBy() != "alice" {
				t.Fatalf("alice's session declining: %v %v", got, err)
			}

			payout := e.open(t, bot, openReq("payment.payout"))
			_, err = bridge.Decide(relaying(bot), decide(payout.GetChallengeId(), "mcp_elicitation"))
			wantRefusal(t, "elicitation for an L4 four-eyes payout", err, codes.PermissionDenied, failure.CodeConfirmationApproverNotAllowed)
		})
	}
}

// TestL4IsApprovedOnlyOnThePage: an L4 challenge is approved only through
// the approval page, where the human signed in: the API refuses to approve
// it for the approver the policy names, and for the requester under a
// requesting-user policy; declining there is allowed (it runs nothing).
func TestL4IsApprovedOnlyOnThePage(t *testing.T) {
	for name, b := range backends {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			svc, err := confirm.New(confirm.Config{Store: b(t), Directory: directory.Direct(newDirectory(t)), Commands: elicitCommands(), ApprovalBaseURL: "https://confirm.example"})
			if err != nil {
				t.Fatal(err)
			}
			carol := identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "carol"}
			for _, c := range []struct {
				name, cmd string
				approver  identity.Principal
			}{
				{"four eyes (payment.payout)", "payment.payout", carol},
				{"requesting user (vendor.close)", "vendor.close", elicitAlice},
			} {
				for _, channel := range []string{confirm.ChannelAPI, confirm.ChannelMCPElicitation, ""} {
					ch := openFor(t, svc, elicitBot, c.cmd)
					_, err := svc.Decide(ctx, c.approver, ch.ID, true, channel)
					wantConfirmCode(t, c.name+" over "+channel, err, failure.CodeConfirmationApproverNotAllowed)
					if got, _ := svc.Get(ctx, c.approver, ch.ID); got.State != confirm.StatePending {
						t.Fatalf("%s over %q: state %s after a refused approval", c.name, channel, got.State)
					}
				}
				ch := openFor(t, svc, elicitBot, c.cmd)
				if got, err := svc.Decide(ctx, c.approver, ch.ID, false, confirm.ChannelAPI); err != nil || got.State != confirm.StateDeclined {
					t.Fatalf("%s: declining over the API: %+v %v", c.name, got, err)
				}
				ch = openFor(t, svc, elicitBot, c.cmd)
				if got, err := svc.Decide(ctx, c.approver, ch.ID, true, confirm.ChannelApprovalPage); err != nil || got.State != confirm.StateApproved {
					t.Fatalf("%s: approving on the page: %+v %v", c.name, got, err)
				}
			}
		})
	}
}
