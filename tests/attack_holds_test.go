package tests

// The named attack suite, part one: the attacks that already hold (issue
// 11). Each test plays an adversary against the separate-process topology
// (newTopology) on every channel the attack can use — REST, gRPC on the
// executor's address, MCP on the bridge, and the confirm service's API and
// approval page where the attack aims at a confirmation — and asserts what
// an operator could observe afterwards: the HTTP status or gRPC code and
// the Mandate stage and code of each refusal, the audit rows each attempt
// left (counted in the database before and after, per tenant), and the
// sample's fake payment gateway, which must have moved no more money than
// the one legitimate call of a test.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// refundRequest is refundInput as the sample's generated gRPC request.
func refundRequest() *helpdeskv1.IssueRefundRequest {
	return &helpdeskv1.IssueRefundRequest{
		TicketId: "T-1001", Amount: &helpdeskv1.Money{CurrencyCode: "EUR", AmountMinor: 2500},
		Reason: "Customer was charged twice", CardholderReference: cardholderReference,
	}
}

// refundOf is refundInput with another amount in EUR minor units.
func refundOf(minor string) string {
	return strings.Replace(refundInput, `"2500"`, `"`+minor+`"`, 1)
}

// wantTrail waits until the audit trail of tenant ("" for every tenant)
// holds want rows and fails unless it still holds exactly want a moment
// later: the outcome rows of dispatched calls and of replays are written
// after the reply, so an early count could be short and a late row missed.
func (tp *topology) wantTrail(tenant string, want int) {
	tp.t.Helper()
	q, args := `SELECT count(*) FROM audit.records`, []any{}
	if tenant != "" {
		q, args = q+` WHERE tenant = $1`, []any{tenant}
	}
	n := tp.count(q, args...)
	for deadline := time.Now().Add(15 * time.Second); n < want && time.Now().Before(deadline); n = tp.count(q, args...) {
		time.Sleep(50 * time.Millisecond)
	}
	if n == want {
		time.Sleep(250 * time.Millisecond)
		n = tp.count(q, args...)
	}
	if n != want {
		tp.t.Fatalf("the audit trail of tenant %q holds %d rows, want %d", tenant, n, want)
	}
}

// challengeState reads a challenge's state and who decided it.
func (tp *topology) challengeState(id string) (state, decidedBy string) {
	tp.t.Helper()
	if err := tp.db.QueryRow(tp.t.Context(), `SELECT state, coalesce(decided_by, '') FROM confirm.challenges WHERE id = $1`, id).Scan(&state, &decidedBy); err != nil {
		tp.t.Fatalf("challenge %s: %v", id, err)
	}
	return state, decidedBy
}

// rawResponse is an HTTP answer with its headers, for answers that are not
// problem+json from the pipeline (401s of the transports, the approval page).
type rawResponse struct {
	status int
	header http.Header
	body   string
}

// send makes one HTTP request with the given headers (pairs) through
// client (nil: a fresh client without cookies). It never fails the test
// from another goroutine: transport errors are returned.
func send(ctx context.Context, client *http.Client, method, url, body string, headers ...string) (rawResponse, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return rawResponse{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	if client == nil {
		client = &http.Client{}
	}
	resp, err := client.Do(req)
	if err != nil {
		return rawResponse{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return rawResponse{status: resp.StatusCode, header: resp.Header, body: string(b)}, err
}

// mustSend is send on the test's goroutine.
func mustSend(t *testing.T, client *http.Client, method, url, body string, headers ...string) rawResponse {
	t.Helper()
	r, err := send(t.Context(), client, method, url, body, headers...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

// forge re-signs nothing: it swaps claims in a token's payload and keeps
// the original header and signature, as an attacker editing a token would.
func forge(t *testing.T, tok string, claims map[string]any) string {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWS: %q", tok)
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var payload map[string]any
	if err := json.Unmarshal(raw, &payload); err != nil {
		t.Fatal(err)
	}
	for k, v := range claims {
		payload[k] = v
	}
	b, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	return parts[0] + "." + base64.RawURLEncoding.EncodeToString(b) + "." + parts[2]
}

// unsigned is an `alg: none` token with valid-looking claims for carol's
// finance-bot in acme.
func unsigned(t *testing.T) string {
	t.Helper()
	now := time.Now().Unix()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return enc(map[string]any{"alg": "none", "typ": "JWT"}) + "." + enc(map[string]any{
		"iss": "mandate-dev", "aud": "mandate", "sub": "carol", "tenant": "acme", "org": "finance",
		"exp": now + 3600, "nbf": now, "iat": now, "jti": "forged-1",
		"act": map[string]any{"sub": "finance-bot"},
	}) + "."
}

// mint signs a token for carol's finance-bot in acme with r's changes
// applied (secret nil: the dev secret the services trust).
func (tp *topology) mint(secret []byte, change func(*identity.MintRequest)) string {
	tp.t.Helper()
	r := identity.MintRequest{
		Issuer: "mandate-dev", Audience: "mandate", User: "carol", Tenant: "acme", Org: "finance",
		Agent: "finance-bot", Model: scenarioModel, ModelVersion: scenarioModelVersion, TTL: time.Hour,
	}
	if change != nil {
		change(&r)
	}
	if secret == nil {
		secret = []byte(devSecret)
	}
	tok, err := identity.MintDev(secret, r)
	if err != nil {
		tp.t.Fatal(err)
	}
	return tok
}

// TestAttackForgedTokens: credentials that must not authenticate — none,
// another key's signature, `alg: none`, expired, another audience, another
// issuer, a genuine token whose payload was edited to move it into acme, a
// service token presented as a user's, and a relay (x-mandate-on-behalf-of)
// by a caller that is not a Mandate service — each on REST (the executor's
// route and the sample's own), gRPC (ExecutorService.Execute and the
// governed proxy on the executor's address) and MCP (/mcp on the bridge).
// Every one is 401 / Unauthenticated with the authenticate stage and the
// identity package's stable code. Nothing is dispatched: no refund, no
// challenge, no audit row. An unauthenticated request names no tenant whose
// trail could hold it; the transports refuse it before the pipeline starts,
// and it is counted only by the servers' OpenTelemetry RPC and HTTP metrics
// (otelgrpc status code Unauthenticated, otelhttp status 401).
func TestAttackForgedTokens(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	carol := tp.token("acme", "carol", "")
	dave := tp.token("globex", "dave", "")
	forgedBridge, err := identity.MintService([]byte("guessed-service-secret-0123456789abcdef"), "mandate-dev", "mandate", "mcpbridge", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	genuineService, err := identity.MintService([]byte(serviceSecret), "mandate-dev", "mandate", "executor", time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name       string
		bearer     string // "" sends no Authorization header
		onBehalfOf string // the relayed user's token, if any
		code       string
		mcp        bool // the bridge reads only the bearer, so relays are not tried there
	}{
		{name: "no token", code: failure.CodeAuthenticationMissingCredentials, mcp: true},
		{name: "signed with another secret", bearer: tp.mint([]byte("attacker-secret-0123456789abcdef0123456789"), nil), code: failure.CodeAuthenticationInvalidToken, mcp: true},
		{name: "alg none", bearer: unsigned(t), code: failure.CodeAuthenticationInvalidToken, mcp: true},
		{name: "expired", bearer: tp.mint(nil, func(r *identity.MintRequest) { r.Now = time.Now().Add(-3 * time.Hour) }), code: failure.CodeAuthenticationTokenExpired, mcp: true},
		{name: "another audience", bearer: tp.mint(nil, func(r *identity.MintRequest) { r.Audience = "billing" }), code: failure.CodeAuthenticationWrongAudience, mcp: true},
		{name: "another issuer", bearer: tp.mint(nil, func(r *identity.MintRequest) { r.Issuer = "evil-idp" }), code: failure.CodeAuthenticationWrongIssuer, mcp: true},
		{name: "globex token edited into acme", bearer: forge(t, dave, map[string]any{"tenant": "acme", "sub": "carol", "org": "finance"}), code: failure.CodeAuthenticationInvalidToken, mcp: true},
		{name: "acme token edited to another user", bearer: forge(t, tp.token("acme", "alice", ""), map[string]any{"sub": "carol"}), code: failure.CodeAuthenticationInvalidToken, mcp: true},
		{name: "service token as a user", bearer: genuineService, code: failure.CodeAuthenticationInvalidToken, mcp: true},
		{name: "relay with a forged bridge token", bearer: forgedBridge, onBehalfOf: carol, code: failure.CodeAuthenticationNotAService},
		{name: "relay by a user token", bearer: dave, onBehalfOf: carol, code: failure.CodeAuthenticationNotAService},
		{name: "relay by an agent token", bearer: tp.token("acme", "carol", "finance-bot"), onBehalfOf: carol, code: failure.CodeAuthenticationNotAService},
	}
	executor := "http://" + tp.addr["executor"].http
	bridge := "http://" + tp.addr["mcpbridge"].http + "/mcp"
	helpdesk, executorClient := tp.helpdeskClient(), mandatev1.NewExecutorServiceClient(tp.conn("executor"))
	input := map[string]any{}
	if err := json.Unmarshal([]byte(refundInput), &input); err != nil {
		t.Fatal(err)
	}
	in, err := structpb.NewStruct(input)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var headers []string
			md := metadata.MD{}
			if c.bearer != "" {
				headers = append(headers, "Authorization", "Bearer "+c.bearer)
				md.Set("authorization", "Bearer "+c.bearer)
			}
			if c.onBehalfOf != "" {
				headers = append(headers, identity.OnBehalfOfHeader, "Bearer "+c.onBehalfOf)
				md.Set(identity.OnBehalfOfHeader, "Bearer "+c.onBehalfOf)
			}
			for _, route := range []struct{ path, body string }{
				{"/v1/commands/ticket.refund:execute", `{"input":` + refundInput + `}`},
				{"/v1/tickets/T-1001:refund", `{"amount":{"currency_code":"EUR","amount_minor":"2500"},"reason":"Customer was charged twice","cardholder_reference":"` + cardholderReference + `"}`},
			} {
				r := mustSend(t, nil, http.MethodPost, executor+route.path, route.body, append([]string{"Content-Type", "application/json"}, headers...)...)
				var p map[string]any
				_ = json.Unmarshal([]byte(r.body), &p)
				if r.status != http.StatusUnauthorized || r.header.Get("Content-Type") != "application/problem+json" ||
					p["code"] != c.code || p["stage"] != identity.Stage || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
					t.Fatalf("REST %s: %d %q %s (WWW-Authenticate %q); want 401 problem+json %s at authenticate",
						route.path, r.status, r.header.Get("Content-Type"), r.body, r.header.Get("WWW-Authenticate"), c.code)
				}
			}

			ctx := metadata.NewOutgoingContext(t.Context(), md)
			_, err := helpdesk.IssueRefund(ctx, refundRequest())
			wantGRPCError(t, err, codes.Unauthenticated, identity.Stage, c.code)
			_, err = executorClient.Execute(ctx, &mandatev1.ExecuteRequest{Code: "ticket.refund", Input: in})
			wantGRPCError(t, err, codes.Unauthenticated, identity.Stage, c.code)

			if !c.mcp {
				return
			}
			// The bridge answers before reading the JSON-RPC message: 401,
			// the code in the body, and the RFC 9728 metadata to sign in at.
			call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ticket.refund","arguments":` + refundInput + `}}`
			r := mustSend(t, nil, http.MethodPost, bridge, call, append([]string{
				"Content-Type", "application/json", "Accept", "application/json, text/event-stream", "Mcp-Protocol-Version", "2025-06-18",
			}, headers...)...)
			wantBody := c.code
			if c.code == failure.CodeAuthenticationMissingCredentials {
				wantBody = "no bearer token" // the SDK's own answer; it never reaches the verifier
			}
			if r.status != http.StatusUnauthorized || !strings.Contains(r.body, wantBody) ||
				!strings.Contains(r.header.Get("WWW-Authenticate"), "resource_metadata=") {
				t.Fatalf("MCP: %d %q (WWW-Authenticate %q); want 401 naming %s", r.status, r.body, r.header.Get("WWW-Authenticate"), wantBody)
			}
		})
	}

	// Nothing ran, nobody was asked, and no tenant's trail holds a row.
	tp.wantRefunds(0, 0)
	if n := tp.challenges("acme") + tp.challenges("globex"); n != 0 {
		t.Fatalf("%d challenges opened by unauthenticated calls", n)
	}
	tp.wantTrail("", 0)
}

// TestAttackCrossTenant: dave (globex) reaching for acme's ticket, report,
// challenge and grant ids on REST, gRPC and MCP; an acme principal naming
// globex; and a genuinely signed token that claims dave is in acme. Every
// attempt is refused with its stable code, leaves exactly its rows in the
// trail of the tenant its token names (one for a refusal before dispatch,
// intent and outcome for a refusal by the backend) and none in the other,
// opens no challenge, decides nothing and moves no money.
func TestAttackCrossTenant(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	client := tp.helpdeskClient()

	// acme's records: a draft report of alice's and a challenge that
	// finance-bot's refund opened.
	alice := tp.token("acme", "alice", "")
	report, err := client.CreateExpenseReport(tp.as(alice), lyonReport())
	if err != nil {
		t.Fatal(err)
	}
	asked := tp.rest("executor", http.MethodPost, "/v1/commands/ticket.refund:execute", tp.token("acme", "carol", "finance-bot"), `{"input":`+refundInput+`}`)
	wantProblem(t, asked, http.StatusUnprocessableEntity, "confirmation_check", "confirmation.required")
	challenge := asked.body["challenge_id"].(string)
	acme := 3 // the report's intent and outcome, the refusal
	tp.wantTrail("acme", acme)
	tp.wantTrail("globex", 0)

	dave := tp.token("globex", "dave", "")
	daveMCP := tp.mcpSession(dave, nil)
	type attempt struct {
		name        string
		run         func(t *testing.T) string // returns the invocation id
		stage, code string
		rows        int // in globex
	}
	grpcRefusal := func(c codes.Code, stage, code string, call func() error) func(t *testing.T) string {
		return func(t *testing.T) string {
			return wantGRPCRefusal(t, call(), c, stage, code).GetInvocationId()
		}
	}
	attempts := []attempt{
		{"gRPC ticket.get naming acme", grpcRefusal(codes.PermissionDenied, "scope_check", "scope.tenant_mismatch", func() error {
			_, err := client.GetTicket(tp.as(dave, "x-mandate-tenant", "acme"), &helpdeskv1.GetTicketRequest{TicketId: "T-1002"})
			return err
		}), "scope_check", "scope.tenant_mismatch", 1},
		{"gRPC ticket.refund naming acme", grpcRefusal(codes.PermissionDenied, "scope_check", "scope.tenant_mismatch", func() error {
			_, err := client.IssueRefund(tp.as(dave, "x-mandate-tenant", "acme"), refundRequest())
			return err
		}), "scope_check", "scope.tenant_mismatch", 1},
		{"REST acme's ticket id", func(t *testing.T) string {
			r := tp.rest("executor", http.MethodGet, "/v1/tickets/T-1002", dave, "")
			wantProblem(t, r, http.StatusNotFound, "state_check", "state.not_found")
			if strings.Contains(r.raw, "password") || strings.Contains(r.raw, "li.wei") || strings.Contains(r.raw, "acme") {
				t.Fatalf("the refusal tells dave about acme's ticket: %s", r.raw)
			}
			return r.body["invocation_id"].(string)
		}, "state_check", "state.not_found", 2},
		// REST reads no tenant hint (the gateway does not forward
		// X-Mandate-Tenant): the call stays in the token's tenant.
		{"REST acme's ticket id naming acme", func(t *testing.T) string {
			r := tp.rest("executor", http.MethodGet, "/v1/tickets/T-1002", dave, "", "X-Mandate-Tenant", "acme")
			wantProblem(t, r, http.StatusNotFound, "state_check", "state.not_found")
			return r.body["invocation_id"].(string)
		}, "state_check", "state.not_found", 2},
		{"MCP acme's ticket id", func(t *testing.T) string {
			res := callTool(t, daveMCP, "ticket.get", `{"ticket_id":"T-1002"}`, nil)
			return wantToolRefusal(t, res, "state_check", "state.not_found")["invocation_id"].(string)
		}, "state_check", "state.not_found", 2},
		{"gRPC acme's report id", grpcRefusal(codes.PermissionDenied, "entitlement_check", "entitlement.missing", func() error {
			_, err := client.SubmitExpenseReport(tp.as(dave), &helpdeskv1.SubmitExpenseReportRequest{ReportId: report.GetReportId()})
			return err
		}), "entitlement_check", "entitlement.missing", 1},
		{"REST refund with acme's challenge as grant", func(t *testing.T) string {
			r := tp.rest("executor", http.MethodPost, "/v1/commands/ticket.refund:execute", dave,
				`{"input":`+refundInput+`,"approval_grant_id":"`+challenge+`"}`)
			wantProblem(t, r, http.StatusNotFound, "confirmation_check", "confirmation.not_found")
			return r.body["invocation_id"].(string)
		}, "confirmation_check", "confirmation.not_found", 1},
	}
	globex := 0
	for _, a := range attempts {
		t.Logf("attempt: %s", a.name)
		inv := a.run(t)
		globex += a.rows
		var last map[string]any
		for _, r := range waitRows(t, tp, "globex", inv, a.rows) {
			if r["Phase"] == "outcome" {
				last = r
			}
		}
		if last == nil || last["Outcome"] != "refused" || last["Stage"] != a.stage || last["Code"] != a.code ||
			last["UserID"] != "dave" || last["Tenant"] != "globex" {
			t.Fatalf("%s: globex row %v; want dave's refusal %s at %s", a.name, last, a.code, a.stage)
		}
		tp.wantTrail("globex", globex)
		tp.wantTrail("acme", acme)
	}

	// The confirm service: acme's challenge does not exist for dave, to
	// read or to decide.
	confirmClient := mandatev1.NewConfirmServiceClient(tp.conn("confirm"))
	_, err = confirmClient.Get(tp.as(dave), &mandatev1.ConfirmServiceGetRequest{ChallengeId: challenge})
	wantGRPCError(t, err, codes.NotFound, "confirmation_check", "confirmation.not_found")
	_, err = tp.decide(dave, challenge, mandatev1.Decision_DECISION_APPROVE)
	wantGRPCError(t, err, codes.NotFound, "confirmation_check", "confirmation.not_found")
	globex++ // the attempt's decision row, in dave's own trail
	if state, by := tp.challengeState(challenge); state != "PENDING" || by != "" {
		t.Fatalf("acme's challenge is %s (decided by %q) after dave's attempts", state, by)
	}

	// carol naming globex: refused in acme, nothing in globex.
	carol := tp.token("acme", "carol", "")
	_, err = client.IssueRefund(tp.as(carol, "x-mandate-tenant", "globex"), refundRequest())
	ce := wantGRPCRefusal(t, err, codes.PermissionDenied, "scope_check", "scope.tenant_mismatch")
	outcome(t, tp.invocationRows(ce.GetInvocationId(), 1), "refused", "scope_check", "scope.tenant_mismatch")
	acme++

	// A token signed with the trusted secret that claims dave is in acme:
	// acme's directory has no dave. Refused at authenticate, in acme's
	// trail (the tenant the token names), on gRPC and MCP.
	claimed := tp.token("acme", "dave", "")
	_, err = client.GetTicket(tp.as(claimed), &helpdeskv1.GetTicketRequest{TicketId: "T-1001"})
	ce = wantGRPCRefusal(t, err, codes.PermissionDenied, "authenticate", "authorization.principal_inactive")
	outcome(t, tp.invocationRows(ce.GetInvocationId(), 1), "refused", "authenticate", "authorization.principal_inactive")
	acme++
	res := callTool(t, tp.mcpSession(claimed, nil), "ticket.refund", refundInput, nil)
	m := wantToolRefusal(t, res, "authenticate", "authorization.principal_inactive")
	outcome(t, tp.invocationRows(m["invocation_id"].(string), 1), "refused", "authenticate", "authorization.principal_inactive")
	acme++

	tp.wantTrail("acme", acme)
	tp.wantTrail("globex", globex)
	tp.wantRefunds(0, 0)
	if n := tp.challenges("globex"); n != 0 {
		t.Fatalf("%d challenges opened in globex", n)
	}
	if n := tp.challenges("acme"); n != 1 {
		t.Fatalf("%d challenges in acme, want finance-bot's one", n)
	}
	if s := tp.reportState(report.GetReportId()); s != "draft" {
		t.Fatalf("acme's report is %s", s)
	}
}

// TestAttackGrantReuseAndMismatch: carol approves finance-bot's refund of
// 25.00 EUR on T-1001. The grant cannot be spent before it is approved, nor
// on other arguments or another idempotency key; it is spent once by the
// call it was given for; after that it is refused for the same call again
// (on MCP and gRPC), for another amount, for carol herself, for alice's
// agent and for dave in globex. Every refused attempt leaves one refused
// row in its caller's trail; exactly one refund of 25.00 EUR moves.
func TestAttackGrantReuseAndMismatch(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	bot := tp.token("acme", "carol", "finance-bot")
	cs := tp.mcpSession(bot, nil)
	challenge, _ := financeBotAsks(t, tp, cs)
	acme := 1
	grant := mcp.Meta{"mandate.dev/approval": challenge}

	// refusedMCP runs a refused finance-bot call and checks its one row.
	refusedMCP := func(t *testing.T, args string, meta mcp.Meta, code string) {
		t.Helper()
		m := wantToolRefusal(t, callTool(t, cs, "ticket.refund", args, meta), "confirmation_check", code)
		outcome(t, tp.invocationRows(m["invocation_id"].(string), 1), "refused", "confirmation_check", code)
		acme++
	}

	refusedMCP(t, refundInput, grant, "confirmation.pending")
	if ch, err := tp.decide(tp.token("acme", "carol", ""), challenge, mandatev1.Decision_DECISION_APPROVE); err != nil ||
		ch.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_APPROVED {
		t.Fatalf("carol approving: %v %v", ch, err)
	}
	acme++ // her decision row
	// Consent is for one invocation: another amount, or the same arguments
	// under an idempotency key the approved call did not have, is another.
	refusedMCP(t, refundOf("9000"), grant, "confirmation.grant_mismatch")
	refusedMCP(t, refundInput, mcp.Meta{"mandate.dev/approval": challenge, "mandate.dev/idempotency_key": "sneak-1"}, "confirmation.grant_mismatch")
	tp.wantRefunds(0, 0)
	if state, _ := tp.challengeState(challenge); state != "APPROVED" {
		t.Fatalf("a mismatched attempt changed the grant: %s", state)
	}

	res := callTool(t, cs, "ticket.refund", refundInput, grant)
	if res.IsError {
		t.Fatalf("the approved refund was refused: %s", jsonOf(res.Content))
	}
	outcome(t, tp.invocationRows(res.Meta["mandate.dev/invocation_id"].(string), 2), "executed", "", "")
	acme += 2
	tp.wantRefunds(1, 2500)

	refusedMCP(t, refundInput, grant, "confirmation.already_redeemed")
	refusedMCP(t, refundOf("2400"), grant, "confirmation.grant_mismatch")

	// The same call over the governed gRPC proxy, with the grant in metadata.
	client := tp.helpdeskClient()
	_, err := client.IssueRefund(tp.as(bot, "x-mandate-approval-grant", challenge), refundRequest())
	ce := wantGRPCRefusal(t, err, codes.FailedPrecondition, "confirmation_check", "confirmation.already_redeemed")
	outcome(t, tp.invocationRows(ce.GetInvocationId(), 1), "refused", "confirmation_check", "confirmation.already_redeemed")
	acme++

	// Another principal: carol herself (the grant was her agent's), over
	// REST with the grant header.
	byCarol := tp.rest("executor", http.MethodPost, "/v1/commands/ticket.refund:execute", tp.token("acme", "carol", ""),
		`{"input":`+refundInput+`}`, "X-Mandate-Approval-Grant", challenge)
	wantProblem(t, byCarol, http.StatusUnprocessableEntity, "confirmation_check", "confirmation.grant_mismatch")
	outcome(t, tp.invocationRows(byCarol.body["invocation_id"].(string), 1), "refused", "confirmation_check", "confirmation.grant_mismatch")
	acme++

	// alice's agent: a grant never adds a permission.
	_, err = client.IssueRefund(tp.as(tp.token("acme", "alice", "support-bot"), "x-mandate-approval-grant", challenge), refundRequest())
	ce = wantGRPCRefusal(t, err, codes.PermissionDenied, "permission_check", "authorization.permission_denied")
	outcome(t, tp.invocationRows(ce.GetInvocationId(), 1), "refused", "permission_check", "authorization.permission_denied")
	acme++

	// dave, who may refund in globex: acme's challenge is not found there.
	_, err = client.IssueRefund(tp.as(tp.token("globex", "dave", ""), "x-mandate-approval-grant", challenge), refundRequest())
	ce = wantGRPCRefusal(t, err, codes.NotFound, "confirmation_check", "confirmation.not_found")
	rows := waitRows(t, tp, "globex", ce.GetInvocationId(), 1)
	if rows[0]["Outcome"] != "refused" || rows[0]["Code"] != "confirmation.not_found" || rows[0]["UserID"] != "dave" {
		t.Fatalf("globex row %v", rows[0])
	}

	tp.wantRefunds(1, 2500)
	tp.wantTrail("acme", acme)
	tp.wantTrail("globex", 1)
	if executed := tp.query(&mandatev1.QueryRequest{Command: "ticket.refund", Outcomes: []string{"executed"}}); len(executed) != 1 {
		t.Fatalf("%d executed refunds in the trail, want 1", len(executed))
	}
	if state, by := tp.challengeState(challenge); state != "REDEEMED" || by != "carol" {
		t.Fatalf("the grant is %s (decided by %q)", state, by)
	}
}

// TestAttackAgentDecidesOwnChallenge: finance-bot, holding only its own
// token, tries to approve the challenge its refund opened on every path a
// decision can take: ConfirmService.Decide over gRPC and REST (every
// channel value, approve and decline), posing as the MCP bridge's relay,
// redeeming directly, the same RPC sent to the executor's governed proxy
// and as a command over REST and MCP, and the approval page (with its
// bearer, and its bearer offered as a sign-in token). All are refused; the
// challenge stays pending, undecided; no money moves; the attempts that
// reach the executor leave one refused row each, and those that reach the
// confirm service as the agent's one refused decision row each.
func TestAttackAgentDecidesOwnChallenge(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	bot := tp.token("acme", "carol", "finance-bot")
	cs := tp.mcpSession(bot, nil)
	challenge, _ := financeBotAsks(t, tp, cs)
	acme := 1
	confirmClient := mandatev1.NewConfirmServiceClient(tp.conn("confirm"))
	pending := func(after string) {
		t.Helper()
		if state, by := tp.challengeState(challenge); state != "PENDING" || by != "" {
			t.Fatalf("after %s the challenge is %s, decided by %q", after, state, by)
		}
		tp.wantRefunds(0, 0)
		tp.wantTrail("acme", acme)
	}

	// ConfirmService.Decide over gRPC, approve or decline, on every
	// channel value.
	for _, c := range []struct {
		decision mandatev1.Decision
		channel  string
		grpcCode codes.Code
		code     string
	}{
		{mandatev1.Decision_DECISION_APPROVE, "", codes.PermissionDenied, "confirmation.approver_not_allowed"},
		{mandatev1.Decision_DECISION_DECLINE, "", codes.PermissionDenied, "confirmation.approver_not_allowed"},
		{mandatev1.Decision_DECISION_APPROVE, "api", codes.PermissionDenied, "confirmation.approver_not_allowed"},
		{mandatev1.Decision_DECISION_APPROVE, "mcp_elicitation", codes.PermissionDenied, "confirmation.approver_not_allowed"},
		{mandatev1.Decision_DECISION_APPROVE, "approval_page", codes.InvalidArgument, "schema.invalid"},
	} {
		t.Logf("gRPC Decide %v on channel %q", c.decision, c.channel)
		_, err := confirmClient.Decide(tp.as(bot), &mandatev1.DecideRequest{ChallengeId: challenge, Decision: c.decision, Channel: c.channel})
		wantGRPCError(t, err, c.grpcCode, "confirmation_check", c.code)
		acme++ // its decision row
	}
	// Posing as the bridge that relays elicited answers: the agent's own
	// token, or one signed with a guessed service secret, as the relay.
	forged, err := identity.MintService([]byte("guessed-service-secret-0123456789abcdef"), "mandate-dev", "mandate", "mcpbridge", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, relay := range []string{bot, forged} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+relay, identity.OnBehalfOfHeader, "Bearer "+bot)
		_, err := confirmClient.Decide(ctx, &mandatev1.DecideRequest{ChallengeId: challenge, Decision: mandatev1.Decision_DECISION_APPROVE, Channel: "mcp_elicitation"})
		wantGRPCError(t, err, codes.Unauthenticated, identity.Stage, failure.CodeAuthenticationNotAService)
	}
	// Nor can it spend the challenge by redeeming it itself.
	_, err = confirmClient.Redeem(tp.as(bot), &mandatev1.RedeemRequest{ChallengeId: challenge, InvocationDigest: strings.Repeat("0", 64)})
	wantGRPCError(t, err, codes.PermissionDenied, "confirmation_check", "authorization.permission_denied")
	pending("gRPC Decide")

	// The same RPC over REST.
	for _, body := range []string{
		`{"decision":"DECISION_APPROVE"}`,
		`{"decision":"DECISION_APPROVE","channel":"mcp_elicitation"}`,
		`{"decision":"DECISION_DECLINE","channel":"api"}`,
	} {
		r := tp.rest("confirm", http.MethodPost, "/v1/challenges/"+challenge+":decide", bot, body)
		if r.status != http.StatusForbidden || r.contentType != "application/problem+json" ||
			r.body["code"] != "confirmation.approver_not_allowed" || r.body["stage"] != "confirmation_check" {
			t.Fatalf("REST Decide %s: %d %s", body, r.status, r.raw)
		}
		acme++ // its decision row
	}
	// Each attempt that reached the confirm service as finance-bot's:
	// one refused decision row, with the code it was refused with.
	if n := tp.count(`SELECT count(*) FROM audit.records WHERE tenant = 'acme' AND phase = 'decision' AND outcome = 'refused'
		AND agent_id = 'finance-bot' AND actor_kind = 'agent' AND subject = $1
		AND code IN ('confirmation.approver_not_allowed', 'schema.invalid')`, challenge); n != 8 {
		t.Fatalf("%d refused decision rows of finance-bot, want 8 (5 over gRPC, 3 over REST)", n)
	}
	pending("REST Decide")

	// ConfirmService/Decide sent to the executor's address is no command:
	// refused through the pipeline, audited, never forwarded. So is a
	// command of that name over REST and a tool of that name over MCP
	// (where the client gets the JSON-RPC error the protocol prescribes).
	_, err = mandatev1.NewConfirmServiceClient(tp.conn("executor")).Decide(tp.as(bot),
		&mandatev1.DecideRequest{ChallengeId: challenge, Decision: mandatev1.Decision_DECISION_APPROVE})
	ce := wantGRPCRefusal(t, err, codes.NotFound, "load_definition", "command.not_found")
	outcome(t, tp.invocationRows(ce.GetInvocationId(), 1), "refused", "load_definition", "command.not_found")
	acme++
	r := tp.rest("executor", http.MethodPost, "/v1/commands/confirm.decide:execute", bot,
		`{"input":{"challenge_id":"`+challenge+`","decision":"DECISION_APPROVE"}}`)
	wantProblem(t, r, http.StatusNotFound, "load_definition", "command.not_found")
	outcome(t, tp.invocationRows(r.body["invocation_id"].(string), 1), "refused", "load_definition", "command.not_found")
	acme++
	_, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "confirm.decide",
		Arguments: map[string]any{"challenge_id": challenge, "decision": "DECISION_APPROVE"}})
	if err == nil || !strings.Contains(err.Error(), "unknown tool") {
		t.Fatalf("tools/call confirm.decide: %v; want an unknown tool error", err)
	}
	acme++
	if rows := tp.query(&mandatev1.QueryRequest{Command: "confirm.decide"}); len(rows) != 2 || rows[0].GetChannel() == rows[1].GetChannel() {
		t.Fatalf("confirm.decide rows %v; want the REST and the MCP attempt", rows)
	}
	pending("the executor's channels")

	// The approval page: a bearer is no session, so the page shows nothing
	// and decides nothing; the agent's token is no sign-in token either.
	page := "http://" + tp.addr["confirm"].http + "/approve/"
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	browser := &http.Client{Jar: jar}
	form := url.Values{"decision": {"approve"}, "csrf": {"x"}}.Encode()
	formHeaders := []string{"Content-Type", "application/x-www-form-urlencoded", "Authorization", "Bearer " + bot}
	for _, r := range []rawResponse{
		mustSend(t, browser, http.MethodGet, page+challenge, "", "Authorization", "Bearer "+bot),
		mustSend(t, browser, http.MethodPost, page+challenge, form, formHeaders...),
	} {
		if r.status != http.StatusUnauthorized || strings.Contains(r.body, "Refund a ticket") || strings.Contains(r.body, "T-1001") {
			t.Fatalf("approval page with the agent's bearer: %d %s", r.status, tail(r.body, 400))
		}
	}
	login := mustSend(t, browser, http.MethodGet, page+"login?t="+url.QueryEscape(bot)+"&next="+url.QueryEscape("/approve/"+challenge), "")
	if login.status != http.StatusUnauthorized || !strings.Contains(login.body, "not valid") {
		t.Fatalf("signing in with the agent's token: %d %s", login.status, tail(login.body, 400))
	}
	if u, _ := url.Parse(page); len(jar.Cookies(u)) != 0 {
		t.Fatalf("the page set cookies for the agent's token: %v", jar.Cookies(u))
	}
	again := mustSend(t, browser, http.MethodPost, page+challenge, form, formHeaders...)
	if again.status != http.StatusUnauthorized {
		t.Fatalf("posting a decision after the refused sign-in: %d %s", again.status, tail(again.body, 400))
	}
	pending("the approval page")

	// The agent still holds no grant: its retry is refused as pending.
	m := wantToolRefusal(t, callTool(t, cs, "ticket.refund", refundInput, mcp.Meta{"mandate.dev/approval": challenge}),
		"confirmation_check", "confirmation.pending")
	outcome(t, tp.invocationRows(m["invocation_id"].(string), 1), "refused", "confirmation_check", "confirmation.pending")
	acme++
	pending("the retry")
}

// TestAttackIdempotencyKeyRace: 64 concurrent expense.report.create calls
// with one idempotency key — alice over REST and gRPC, her support-bot over
// MCP (the key is scoped to tenant, user and command, so all 64 are one
// call). Exactly one runs: one report is created; every other answer is
// that call's response replayed or an idempotency.in_flight refusal. The
// trail holds all 64 attempts: the executed call's intent and outcome, and
// one replayed or refused outcome row for each of the other 63.
func TestAttackIdempotencyKeyRace(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	const n, key = 64, "race-lyon-1"
	const input = `{"title":"Customer visit Lyon","lines":[{"description":"Train Paris-Lyon","amount":{"currency_code":"EUR","amount_minor":8900},"category":"EXPENSE_CATEGORY_TRAVEL"}],"payroll_id":"P-0042"}`
	alice := tp.token("acme", "alice", "")
	cs := tp.mcpSession(tp.token("acme", "alice", "support-bot"), nil)
	client := tp.helpdeskClient()
	restURL := "http://" + tp.addr["executor"].http + "/v1/commands/expense.report.create:execute"
	reportsBefore := tp.count(`SELECT count(*) FROM helpdesk.expense_reports`)

	// answer is what one caller saw: the invocation and report ids of a
	// result, or the stage and code of a refusal.
	type answer struct {
		channel             string
		invocation, report  string
		replayed            bool // REST says so; gRPC and MCP show the first call's invocation id
		stage, code, failed string
	}
	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			a := &answers[i]
			switch i % 3 {
			case 0:
				a.channel = "rest"
				r, err := send(context.Background(), http.DefaultClient, http.MethodPost, restURL,
					`{"input":`+input+`,"idempotency_key":"`+key+`"}`, "Authorization", "Bearer "+alice, "Content-Type", "application/json")
				var body map[string]any
				if err == nil {
					err = json.Unmarshal([]byte(r.body), &body)
				}
				switch {
				case err != nil:
					a.failed = err.Error()
				case r.status == http.StatusOK:
					a.invocation, _ = body["invocation_id"].(string)
					a.replayed, _ = body["replayed"].(bool)
					result, _ := body["result"].(map[string]any)
					a.report, _ = result["report_id"].(string)
				case r.status == http.StatusConflict:
					a.stage, _ = body["stage"].(string)
					a.code, _ = body["code"].(string)
					a.invocation, _ = body["invocation_id"].(string)
				default:
					a.failed = r.body
				}
			case 1:
				a.channel = "grpc"
				header, invocation := invocationHeader()
				rep, err := client.CreateExpenseReport(tp.as(alice, "idempotency-key", key), lyonReport(), header)
				if err != nil {
					st, _ := status.FromError(err)
					for _, d := range st.Details() {
						if ce, ok := d.(*mandatev1.CommandError); ok && st.Code() == codes.Aborted {
							a.stage, a.code, a.invocation = ce.GetStage(), ce.GetCode(), ce.GetInvocationId()
						}
					}
					if a.code == "" {
						a.failed = err.Error()
					}
					return
				}
				a.invocation, a.report = invocation(), rep.GetReportId()
			case 2:
				a.channel = "mcp"
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "expense.report.create",
					Arguments: json.RawMessage(input), Meta: mcp.Meta{"mandate.dev/idempotency_key": key}})
				if err != nil {
					a.failed = err.Error()
					return
				}
				var out map[string]any
				b, _ := json.Marshal(res.StructuredContent)
				if res.IsError {
					b, _ = json.Marshal(res.Meta["mandate.dev/refusal"])
				}
				_ = json.Unmarshal(b, &out)
				if res.IsError {
					a.stage, _ = out["stage"].(string)
					a.code, _ = out["code"].(string)
					a.invocation, _ = out["invocation_id"].(string)
					return
				}
				a.invocation, _ = res.Meta["mandate.dev/invocation_id"].(string)
				a.report, _ = out["report_id"].(string)
			}
		})
	}
	close(start)
	wg.Wait()

	// Exactly one invocation ran; every success is its response.
	var ran, report string
	var successes, inFlight int
	refused := map[string]bool{}
	for _, a := range answers {
		switch {
		case a.failed != "":
			t.Fatalf("%s call failed: %s", a.channel, a.failed)
		case a.code != "":
			if a.stage != "idempotency_check" || a.code != "idempotency.in_flight" || a.invocation == "" {
				t.Fatalf("%s refusal %s at %s (%s); want idempotency.in_flight", a.channel, a.code, a.stage, a.invocation)
			}
			inFlight++
			refused[a.invocation] = true
		default:
			successes++
			if ran == "" {
				ran, report = a.invocation, a.report
			}
			if a.invocation != ran || a.report != report || a.report == "" {
				t.Fatalf("%s answer %+v; another success ran %s creating %s", a.channel, a, ran, report)
			}
		}
	}
	restFirst := 0
	for _, a := range answers {
		if a.channel == "rest" && a.code == "" && !a.replayed {
			restFirst++
		}
	}
	if successes == 0 || successes+inFlight != n || len(refused) != inFlight || restFirst > 1 {
		t.Fatalf("%d successes, %d in-flight refusals (%d distinct), %d REST answers not marked replayed", successes, inFlight, len(refused), restFirst)
	}
	if created := tp.count(`SELECT count(*) FROM helpdesk.expense_reports`) - reportsBefore; created != 1 {
		t.Fatalf("%d reports created for one key, want 1", created)
	}
	t.Logf("%d replayed, %d refused in flight", successes-1, inFlight)

	// The trail: 64 attempts, 65 rows.
	tp.wantTrail("acme", n+1)
	rows := tp.query(&mandatev1.QueryRequest{Command: "expense.report.create"})
	byInvocation := map[string][]*mandatev1.AuditRecord{}
	var intents, executed, replayed, inFlightRows int
	for _, r := range rows {
		byInvocation[r.GetInvocationId()] = append(byInvocation[r.GetInvocationId()], r)
		switch {
		case r.GetPhase() == "intent":
			intents++
			if r.GetInvocationId() != ran {
				t.Fatalf("intent row of %s; only %s ran", r.GetInvocationId(), ran)
			}
		case r.GetOutcome() == "executed":
			executed++
			if r.GetInvocationId() != ran {
				t.Fatalf("executed row of %s; only %s ran", r.GetInvocationId(), ran)
			}
		case r.GetOutcome() == "replayed" && r.GetStage() == "idempotency_check" && r.GetCode() == "idempotency.replayed":
			replayed++
		case r.GetOutcome() == "refused" && r.GetStage() == "idempotency_check" && r.GetCode() == "idempotency.in_flight":
			inFlightRows++
			if !refused[r.GetInvocationId()] {
				t.Fatalf("refused row of %s, which no caller saw refused", r.GetInvocationId())
			}
		default:
			t.Fatalf("unexpected row %v", r)
		}
	}
	if len(rows) != n+1 || len(byInvocation) != n || intents != 1 || executed != 1 || replayed != successes-1 || inFlightRows != inFlight {
		t.Fatalf("%d rows of %d invocations: %d intents, %d executed, %d replayed, %d in flight; want %d rows of %d, 1, 1, %d, %d",
			len(rows), len(byInvocation), intents, executed, replayed, inFlightRows, n+1, n, successes-1, inFlight)
	}
	tp.wantRefunds(0, 0)
}
