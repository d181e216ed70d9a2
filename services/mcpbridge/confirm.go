package mcpbridge

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// MetaChallenge is the `_meta` key of a confirmation form that names the
// challenge it asks about, so that a client can relate the form to the
// approval URL the same call would otherwise have returned.
const MetaChallenge = "mandate.dev/challenge_id"

// approvalSchema is the requestedSchema of a confirmation form. It asks
// for nothing: the form's accept action is the human's yes (the MCP
// meaning, and what hosts render as the approve button); decline and
// cancel are no.
var approvalSchema = map[string]any{"type": "object", "properties": map[string]any{}}

// confirmation handles a call the executor refused. Only a
// confirmation.required refusal, with a confirm service configured and a
// client that declared elicitation, is put to the session's human:
//
//   - where the confirm service says the session's principal may answer
//     by form (Challenge.Elicitable: its client is operated by its user —
//     a user, or an agent the directory marks host: interactive — the
//     requesting user is the approver, below L4) and the client declared
//     form elicitation, the confirm service's prompt is shown as a form.
//     Accept records the approval as the session's user on channel
//     mcp_elicitation and the call runs again with the grant; decline or
//     cancel record a decline, and the call runs again with the grant so
//     that the executor refuses it (confirmation.refused, audited) and the
//     backend is never called;
//   - otherwise (a headless agent, someone else must approve, L4, or a
//     client with URL mode only) a client that declared URL elicitation is
//     sent the approval page's URL, and the result is the
//     confirmation.required refusal: the agent retries with
//     `mandate.dev/approval` once a human approved on the page, signed in;
//   - any other client gets the confirmation.required refusal with the
//     approval URL, unchanged.
//
// When elicitation itself fails (the client errs, times out or goes away)
// the challenge stays pending and the result is the approval-URL refusal.
//
// A 2026-07-28 client has no session to elicit on: the form rides in an
// input_required result with a sealed requestState (askInput, resume), and
// URL mode is not used (the approval-URL refusal names the page).
func (b *Bridge) confirmation(ctx context.Context, req *mcp.CallToolRequest, p identity.Principal, call toolCall, refused error) (*mcp.CallToolResult, error) {
	prob := failure.Problem(failure.ToStatus(refused), "")
	if b.cfg.Confirm == nil || req.Session == nil || call.GrantID != "" ||
		prob.Code != failure.CodeConfirmationRequired || prob.ChallengeID == "" {
		return b.refusal(ctx, call.Code, refused)
	}
	form, url := elicitationModes(req.ClientCapabilities())
	stateless := modern(req)
	if stateless {
		// 2026-07-28 has no server-initiated requests: a form rides in an
		// input_required result, and URL mode gets the approval URL.
		url = false
		form = form && len(b.cfg.StateKey) > 0
	}
	if !form && !url {
		return b.refusal(ctx, call.Code, refused)
	}
	c, err := b.cfg.Confirm.Get(ctx, &mandatev1.ConfirmServiceGetRequest{ChallengeId: prob.ChallengeID})
	if err != nil {
		b.log.WarnContext(ctx, "mcpbridge: reading the challenge to elicit; answering with the approval URL",
			"tool", call.Code, "challenge_id", prob.ChallengeID, "invocation_id", prob.InvocationID, "error", err)
		return b.refusal(ctx, call.Code, refused)
	}
	if form && c.GetElicitable() {
		if stateless {
			return b.askInput(ctx, p, call, c, refused)
		}
		return b.elicitForm(ctx, req, call, c, refused)
	}
	if url && prob.ApprovalURL != "" {
		b.elicitURL(ctx, req, c, prob.ApprovalURL)
	}
	return b.refusal(ctx, call.Code, refused)
}

// elicitForm asks the session's human with the challenge's prompt, records
// the answer and runs the call again with the grant: the executor then
// either runs it (approved) or refuses it with confirmation.refused.
func (b *Bridge) elicitForm(ctx context.Context, req *mcp.CallToolRequest, call toolCall, c *mandatev1.Challenge, refused error) (*mcp.CallToolResult, error) {
	ectx := ctx
	if exp := c.GetExpiresAt(); exp != nil {
		var cancel context.CancelFunc
		ectx, cancel = context.WithDeadline(ctx, exp.AsTime())
		defer cancel()
	}
	id := c.GetChallengeId()
	res, err := req.Session.Elicit(ectx, &mcp.ElicitParams{
		Meta: mcp.Meta{MetaChallenge: id},
		Mode: "form", Message: FormMessage(c.GetPrompt()), RequestedSchema: approvalSchema,
	})
	if err != nil {
		b.log.WarnContext(ctx, "mcpbridge: confirmation form failed; the challenge stays open at the approval URL",
			"tool", call.Code, "challenge_id", id, "error", err)
		return b.refusal(ctx, call.Code, refused)
	}
	if res.Action == "cancel" {
		return b.cancelled(ctx, call, id, refused)
	}
	approve := res.Action == "accept"
	if err := b.decideElicited(ctx, id, approve); err != nil && !isCode(err, failure.CodeConfirmationAlreadyDecided) {
		// Nothing was recorded: the challenge stays open at the approval
		// URL, which the refusal names.
		b.log.WarnContext(ctx, "mcpbridge: recording the elicited answer failed",
			"tool", call.Code, "challenge_id", id, "action", res.Action, "error", err)
		return b.refusal(ctx, call.Code, refused)
	}
	b.log.InfoContext(ctx, "mcpbridge: confirmation answered through elicitation",
		"tool", call.Code, "challenge_id", id, "action", res.Action, "approved", approve)
	return b.runWithGrant(ctx, req, call, id)
}

// cancelled answers a confirmation form the human dismissed: nothing is
// decided (cancel is neither yes nor no), the challenge stays open on the
// approval page, and the refusal says so instead of calling it declined.
func (b *Bridge) cancelled(ctx context.Context, call toolCall, id string, refused error) (*mcp.CallToolResult, error) {
	b.log.InfoContext(ctx, "mcpbridge: confirmation form cancelled; nothing decided", "tool", call.Code, "challenge_id", id)
	fe, ok := refusalOf(refused)
	if !ok {
		return b.refusal(ctx, call.Code, refused)
	}
	c := *fe
	c.Message = "the confirmation was cancelled: nothing was decided, and the challenge stays open at the approval URL"
	return b.refusal(ctx, call.Code, &c)
}

// decideElicited records the answer the session's human gave through MCP
// elicitation (a form, or the retry of an input_required result) to a
// challenge of the session's own call: ConfirmService.Decide on channel
// mcp_elicitation, relayed for that human.
func (b *Bridge) decideElicited(ctx context.Context, id string, approve bool) error {
	d := mandatev1.Decision_DECISION_DECLINE
	if approve {
		d = mandatev1.Decision_DECISION_APPROVE
	}
	_, err := b.cfg.Confirm.Decide(ctx, &mandatev1.DecideRequest{ChallengeId: id, Decision: d, Channel: channelMCPElicitation})
	return err
}

// refusalOf is the Mandate refusal an error of another service carries.
func refusalOf(err error) (*failure.Error, bool) {
	var fe *failure.Error
	if errors.As(err, &fe) {
		return fe, true
	}
	return failure.FromStatus(status.Convert(err))
}

// isCode reports whether err is a Mandate refusal with code.
func isCode(err error, code string) bool {
	fe, ok := refusalOf(err)
	return ok && fe.Code == code
}

// elicitURL sends the approval page's URL to the client (URL mode, the
// challenge id as elicitationId). The answer only says whether the user
// agreed to open it; the decision happens on the page.
func (b *Bridge) elicitURL(ctx context.Context, req *mcp.CallToolRequest, c *mandatev1.Challenge, approvalURL string) {
	who := "the requesting user"
	if c.GetApproverKind() == approverPermissionHolder {
		who = "another user holding " + c.GetApproverPermission()
	}
	id, command := c.GetChallengeId(), c.GetCommand()
	msg := fmt.Sprintf("%s needs the approval of %s. Open the approval page to review the exact call and decide; "+
		"once it is approved, the agent can call %s again with the grant.", c.GetPrompt().GetTitle(), who, command)
	res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Mode: "url", Message: msg, URL: approvalURL, ElicitationID: id})
	if err != nil {
		b.log.WarnContext(ctx, "mcpbridge: URL elicitation failed", "tool", command, "challenge_id", id, "error", err)
		return
	}
	b.log.InfoContext(ctx, "mcpbridge: approval URL sent through elicitation", "tool", command, "challenge_id", id, "action", res.Action)
}

// FormMessage is the message of a confirmation form: the confirm service's
// prompt, which is rendered from the declaration and the request with
// sensitive values withheld, never from model text. The arguments are
// listed one per line as the confirm service rendered them by their
// declaration (Prompt.argument_lines): money with its currency, enums and
// timestamps readable, free text quoted and marked as the agent's, control
// and bidi characters shown as ⟦U+…⟧ markers, so that no value can pass
// itself off as another. When the command's backend previewed the call,
// what it would do comes first (Prompt.effect_lines), as the confirm
// service neutralised it.
func FormMessage(pr *mandatev1.Prompt) string {
	var b strings.Builder
	b.WriteString("Confirm: " + pr.GetTitle() + "\n\n")
	b.WriteString(pr.GetSummary() + "\n\n")
	fmt.Fprintf(&b, "Risk: %s\n", pr.GetRisk())
	if len(pr.GetSideEffects()) > 0 {
		fmt.Fprintf(&b, "Side effects: %s\n", strings.Join(pr.GetSideEffects(), ", "))
	}
	if pr.GetReversible() && pr.GetRecall() != "" {
		fmt.Fprintf(&b, "Undo: %s\n", pr.GetRecall())
	} else {
		b.WriteString("Undo: not possible\n")
	}
	fmt.Fprintf(&b, "Requested by: %s\n", pr.GetRequestedBy())
	if effects := pr.GetEffectLines(); len(effects) > 0 {
		b.WriteString("What it will do (checked by the system that runs it):\n")
		for _, l := range effects {
			b.WriteString("- " + l + "\n")
		}
	}
	if lines := pr.GetArgumentLines(); len(lines) == 0 {
		b.WriteString("Arguments: none\n")
	} else {
		b.WriteString("Arguments:\n")
		for _, l := range lines {
			b.WriteString("- " + l + "\n")
		}
	}
	if len(pr.GetWithheldFields()) > 0 {
		fmt.Fprintf(&b, "Withheld from this prompt: %s\n", strings.Join(pr.GetWithheldFields(), ", "))
	}
	b.WriteString("\nAccept to run this call once, with exactly these arguments. " +
		"Decline or cancel, and it does not run.")
	return b.String()
}

// elicitationModes reports which elicitation modes the client declared.
// An empty elicitation capability means form (2025-06-18).
func elicitationModes(caps *mcp.ClientCapabilities) (form, url bool) {
	if caps == nil || caps.Elicitation == nil {
		return false, false
	}
	e := caps.Elicitation
	return e.Form != nil || e.URL == nil, e.URL != nil
}

// runWithGrant runs call again with the challenge the session's human just
// answered as its grant: the executor redeems it, or refuses (and audits)
// when the answer was no.
func (b *Bridge) runWithGrant(ctx context.Context, req *mcp.CallToolRequest, call toolCall, challengeID string) (*mcp.CallToolResult, error) {
	call.GrantID = challengeID
	out, err := b.execute(ctx, call)
	if err != nil {
		return b.refusal(ctx, call.Code, err)
	}
	return b.result(ctx, req, call, out), nil
}
