package tests

import (
	"context"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// TestEveryDecisionAttemptIsAudited: customer.erase is L4 under four eyes
// (holders of privacy.approve). carol, its requester, tries to approve her
// own request; finance-bot, her agent, tries to approve it over the API and
// claiming her MCP client's form; each is refused with its code. olive, a
// holder, approves on the approval page. The trail then holds exactly one
// decision row per attempt — refused ones with stage and code, the
// accepted one approved — each with its own id, naming the challenge, the
// invocation it belongs to and the decider; the chain verifies intact and
// `mandate audit query --phase decision` lists them.
func TestEveryDecisionAttemptIsAudited(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	carol, bot := tp.token("acme", "carol", ""), tp.token("acme", "carol", "finance-bot")
	erase := `{"customer_email":"jane.doe@example.com","reason":"Deletion request DR-9"}`
	r := tp.rest("executor", http.MethodPost, "/v1/commands/customer.erase:execute", carol, `{"input":`+erase+`}`)
	wantProblem(t, r, http.StatusUnprocessableEntity, "confirmation_check", "confirmation.required")
	challenge, _ := r.body["challenge_id"].(string)
	invocation, _ := r.body["invocation_id"].(string)
	if challenge == "" || invocation == "" {
		t.Fatalf("no challenge or invocation: %s", r.raw)
	}

	// The requester approving her own four-eyes request.
	_, err := tp.decide(carol, challenge, mandatev1.Decision_DECISION_APPROVE)
	wantGRPCError(t, err, codes.PermissionDenied, "confirmation_check", "confirmation.approver_not_allowed")
	// Her agent, over gRPC and over REST claiming the MCP form's channel.
	_, err = tp.decide(bot, challenge, mandatev1.Decision_DECISION_APPROVE)
	wantGRPCError(t, err, codes.PermissionDenied, "confirmation_check", "confirmation.approver_not_allowed")
	rr := tp.rest("confirm", http.MethodPost, "/v1/challenges/"+challenge+":decide", bot, `{"decision":"DECISION_DECLINE","channel":"mcp_elicitation"}`)
	if rr.status != http.StatusForbidden || rr.body["code"] != "confirmation.approver_not_allowed" {
		t.Fatalf("finance-bot claiming the elicitation channel: %d %s", rr.status, rr.raw)
	}
	if state, _ := tp.challengeState(challenge); state != "PENDING" {
		t.Fatalf("challenge %s after the refused attempts", state)
	}

	// olive, signed in on the approval page.
	link := strings.TrimSpace(tp.run("token", "--login-url", "http://"+tp.addr["confirm"].http, "--user", "olive", "--tenant", "acme"))
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	page := &approvalPage{base: "http://" + tp.addr["confirm"].http, client: &http.Client{Jar: jar}}
	if code, html := page.get(t, link); code != http.StatusOK || !strings.Contains(html, "signed in as olive") {
		t.Fatalf("olive signing in: %d\n%s", code, html)
	}
	page.approve(t, challenge)

	// One row per attempt, in order. Each is appended before its answer
	// goes out; the wait only covers a row held for a retry.
	const attempts = 4
	q := `SELECT count(*) FROM audit.records WHERE tenant = 'acme' AND phase = 'decision'`
	for deadline := time.Now().Add(10 * time.Second); tp.count(q) < attempts && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if n := tp.count(q); n != attempts {
		t.Fatalf("%d decision rows, want %d (one per attempt)", n, attempts)
	}
	rows, err := tp.db.Query(context.Background(), `
		SELECT invocation_id, subject, command, user_id, agent_id, actor_kind, channel, outcome, stage, code,
		       arguments->>'challenge_id', arguments->>'invocation_id', coalesce(arguments->>'verdict', ''),
		       arguments->>'decision_channel', arguments->>'assurance'
		FROM audit.records WHERE tenant = 'acme' AND phase = 'decision' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		id, subject, command, user, agent, actor, channel, outcome, stage, code string
		challenge, invocation, verdict, decisionChannel, assurance              string
	}
	var got []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.subject, &r.command, &r.user, &r.agent, &r.actor, &r.channel, &r.outcome, &r.stage, &r.code,
			&r.challenge, &r.invocation, &r.verdict, &r.decisionChannel, &r.assurance); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	refused := func(user, agent, actor, channel, verdict, decisionChannel, assurance string) row {
		return row{subject: challenge, command: "customer.erase", user: user, agent: agent, actor: actor, channel: channel,
			outcome: "refused", stage: "confirmation_check", code: "confirmation.approver_not_allowed",
			challenge: challenge, invocation: invocation, verdict: verdict, decisionChannel: decisionChannel, assurance: assurance}
	}
	want := []row{
		refused("carol", "", "user", "grpc", "approve", "api", "api_credential"),
		refused("carol", "finance-bot", "agent", "grpc", "approve", "api", "api_credential"),
		refused("carol", "finance-bot", "agent", "grpc", "decline", "mcp_elicitation", "client_attested"),
		{subject: challenge, command: "customer.erase", user: "olive", actor: "user", channel: "rest", outcome: "approved",
			challenge: challenge, invocation: invocation, verdict: "approve", decisionChannel: "approval_page", assurance: "signed_in"},
	}
	ids := map[string]bool{}
	for i := range want {
		g := got[i]
		if g.id == "" || g.id == invocation || g.id == challenge || ids[g.id] {
			t.Fatalf("attempt %d: id %q is not an attempt's own", i, g.id)
		}
		ids[g.id] = true
		g.id = ""
		if g != want[i] {
			t.Fatalf("attempt %d: row %+v\nwant %+v", i, g, want[i])
		}
	}

	if out := tp.run("audit", "verify", "--tenant", "acme"); !strings.Contains(out, "intact") {
		t.Fatalf("audit verify: %s", out)
	}
	out := tp.run("audit", "query", "--tenant", "acme", "--phase", "decision")
	if n := strings.Count(out, " decision "); n != attempts || !strings.Contains(out, "confirmation.approver_not_allowed") || !strings.Contains(out, "approved") {
		t.Fatalf("audit query --phase decision lists %d decision rows, want %d:\n%s", n, attempts, out)
	}
}

// TestDevRecordsDecisionAttempts: `mandate dev` wires the confirm service
// to the audit trail in process: carol approving her own four-eyes erase and
// finance-bot deciding it are refused, and olive, the auditor, reads their
// two decision rows over REST.
func TestDevRecordsDecisionAttempts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dev := startDev(t)
	base, tokens := dev.base, dev.tokens
	code, body := do(t, http.MethodPost, base+"/v1/commands/customer.erase:execute", tokens["carol"],
		`{"input":{"customer_email":"jane.doe@example.com","reason":"Deletion request DR-10"}}`)
	challenge, _ := body["challenge_id"].(string)
	if code != http.StatusUnprocessableEntity || body["code"] != "confirmation.required" || challenge == "" {
		t.Fatalf("customer.erase: %d %v", code, body)
	}
	for _, who := range []string{"carol", "finance-bot@carol"} {
		code, body := do(t, http.MethodPost, base+"/v1/challenges/"+challenge+":decide", tokens[who], `{"decision":"DECISION_APPROVE"}`)
		if code != http.StatusForbidden || body["code"] != "confirmation.approver_not_allowed" {
			t.Fatalf("%s approving: %d %v", who, code, body)
		}
	}
	code, body = do(t, http.MethodGet, base+"/v1/audit/records?phase=decision", tokens["olive"], "")
	records, _ := body["records"].([]any)
	if code != http.StatusOK || len(records) != 2 {
		t.Fatalf("decision rows: %d %v; want 2", code, body)
	}
	agents := map[string]bool{}
	for i := range records {
		r, _ := records[i].(map[string]any)
		if r["code"] != "confirmation.approver_not_allowed" || r["outcome"] != "refused" || r["user_id"] != "carol" || r["subject"] != challenge {
			t.Fatalf("decision row %d: %v", i, r)
		}
		agent, _ := r["agent_id"].(string)
		agents[agent] = true
	}
	if !agents[""] || !agents["finance-bot"] {
		t.Fatalf("decision rows by agents %v, want carol's own and finance-bot's", agents)
	}
}
