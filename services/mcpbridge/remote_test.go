package mcpbridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/telemetry"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// startRemote is start with the bridge as its own process would run it: a
// second bridge that reaches the catalog, the executor and the confirm
// service only through their generated gRPC clients, over a network
// connection carrying the service token of "mcpbridge" (which relays each
// caller's token) and the OpenTelemetry client interceptors. The returned env
// is start's with url pointing at that bridge; conn is the bridge's
// connection, for tests that call a service directly as the bridge.
func startRemote(t testing.TB) (e *env, conn *grpc.ClientConn) {
	t.Helper()
	local := start(t)
	src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", identity.MCPBridgeService, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	conn, err = grpc.NewClient(local.services.GRPCAddr(), append(telemetry.GRPCClientOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)),
		grpc.WithStreamInterceptor(identity.StreamClientInterceptor(src)))...)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	hs := httptest.NewServer(mux)
	b, err := mcpbridge.New(mcpbridge.Config{
		Catalog:  mandatev1.NewCatalogServiceClient(conn),
		Executor: mandatev1.NewExecutorServiceClient(conn),
		Confirm:  mandatev1.NewConfirmServiceClient(conn),
		Manifest: local.set, Verifier: local.users, ResourceURL: hs.URL + "/mcp",
	})
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/mcp", b.Handler())
	t.Cleanup(func() {
		b.Close()
		hs.Close()
		_ = conn.Close()
	})
	remote := *local
	remote.url, remote.bridge = hs.URL, b
	return &remote, conn
}

// TestRemoteBridge runs the bridge over the gRPC clients: what an agent
// sees and gets is what the in-process bridge gives.
func TestRemoteBridge(t *testing.T) {
	e, conn := startRemote(t)
	ctx := context.Background()
	bot := e.connect(t, token(t, "acme", "alice", "support-bot"))

	t.Run("tools/list per principal", func(t *testing.T) {
		who := []struct {
			tok string
			p   identity.Principal
		}{
			{token(t, "acme", "alice", ""), alicePrincipal},
			{token(t, "acme", "alice", "support-bot"), identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "support-bot", Issuer: "test"}},
			{token(t, "acme", "carol", ""), carol},
			{token(t, "globex", "dave", ""), identity.Principal{Kind: identity.KindUser, Tenant: "globex", UserID: "dave", Issuer: "test"}},
		}
		var lists [][]string
		for _, w := range who {
			got := names(t, e.connect(t, w.tok))
			if want := catalogNames(t, e, w.p); !slices.Equal(got, want) || len(got) == 0 {
				t.Errorf("%s/%s/%s lists %v, catalog says %v", w.p.Tenant, w.p.UserID, w.p.AgentID, got, want)
			}
			lists = append(lists, got)
		}
		if !slices.Equal(lists[0], lists[1]) || slices.Equal(lists[0], lists[2]) || slices.Equal(lists[0], lists[3]) {
			t.Errorf("alice %v, her agent %v, carol %v, dave %v", lists[0], lists[1], lists[2], lists[3])
		}
	})

	t.Run("tools/call", func(t *testing.T) {
		res, err := call(t, bot, "ticket.search", `{"query":"charged twice"}`, mcp.Meta{mcpbridge.MetaConversation: "conv-remote"})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "T-1001") {
			t.Fatalf("ticket.search: %+v", res)
		}
		inv, _ := res.Meta["mandate.dev/invocation_id"].(string)
		rows := auditRows(t, e, "acme", inv)
		out := rows[len(rows)-1]
		if out.Channel != audit.ChannelMCP || out.MCPSessionID != bot.ID() || out.ConversationID != "conv-remote" ||
			out.AgentID != "support-bot" || out.UserID != "alice" || out.Outcome != audit.OutcomeExecuted {
			t.Fatalf("audit row %+v", out.Record)
		}
	})

	t.Run("refusal", func(t *testing.T) {
		res, err := call(t, bot, "ticket.refund", refundInput, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := refusalOf(t, res)
		if r.Code != "authorization.permission_denied" || r.Stage != "permission_check" || r.InvocationID == "" || r.Remedy == "" {
			t.Fatalf("refusal %+v", r)
		}
		rows := auditRows(t, e, "acme", r.InvocationID)
		if last := rows[len(rows)-1]; last.Outcome != audit.OutcomeRefused || last.Code != r.Code || last.Channel != audit.ChannelMCP {
			t.Fatalf("audit row %+v", last.Record)
		}
		if n := e.gateway.Refunds(); n != 0 {
			t.Fatalf("gateway counted %d refunds", n)
		}
		// Arguments that are no JSON object cannot travel in ExecuteRequest,
		// yet the attempt is refused and audited by the executor, as in
		// process.
		res, err = call(t, bot, "ticket.search", `["charged twice"]`, nil)
		if err != nil {
			t.Fatal(err)
		}
		r = refusalOf(t, res)
		if r.Code != "schema.invalid" || r.Stage != "schema_validate" || len(r.Violations) != 1 || r.Violations[0].Rule != "schema.type" {
			t.Fatalf("non-object arguments: %+v", r)
		}
		rows = auditRows(t, e, "acme", r.InvocationID)
		if last := rows[len(rows)-1]; last.Outcome != audit.OutcomeRefused || last.Stage != "schema_validate" || last.Channel != audit.ChannelMCP {
			t.Fatalf("audit row %+v", last.Record)
		}
		_, err = call(t, bot, "no.such.tool", `{}`, nil)
		var je *jsonrpc.Error
		if !errors.As(err, &je) || je.Code != jsonrpc.CodeInvalidParams {
			t.Fatalf("no.such.tool: %v", err)
		}
	})

	t.Run("approval URL and retry", func(t *testing.T) {
		cs := e.connect(t, token(t, "acme", "carol", "finance-bot"))
		res, err := call(t, cs, "ticket.refund", refundInput, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := refusalOf(t, res)
		if r.Code != failure.CodeConfirmationRequired || r.Stage == "" || r.ChallengeID == "" || r.ApprovalURL == "" {
			t.Fatalf("refusal %+v", r)
		}
		if _, err := e.confirm.Decide(ctx, carol, r.ChallengeID, true, "api"); err != nil {
			t.Fatal(err)
		}
		res, err = call(t, cs, "ticket.refund", refundInput, mcp.Meta{mcpbridge.MetaApproval: r.ChallengeID})
		if err != nil || res.IsError {
			t.Fatalf("approved refund: %v %+v", err, res)
		}
		if n := e.gateway.Refunds(); n != 1 {
			t.Fatalf("gateway counted %d refunds, want 1", n)
		}
	})

	t.Run("resources", func(t *testing.T) {
		cs := e.connect(t, token(t, "acme", "alice", ""))
		res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "mandate://command/ticket.search"})
		if err != nil {
			t.Fatal(err)
		}
		want, err := e.catalog.CommandSlice(ctx, alicePrincipal, "ticket.search")
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Contents) != 1 || res.Contents[0].Text != string(want) {
			t.Fatalf("slice differs:\n got %+v\nwant %s", res.Contents, want)
		}
		var je *jsonrpc.Error
		if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "mandate://command/ticket.refund"}); !errors.As(err, &je) || je.Code != jsonrpc.CodeInvalidParams {
			t.Fatalf("alice read ticket.refund: %v", err)
		}
		if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpbridge.ManifestURI}); !errors.As(err, &je) || je.Code != mcpbridge.CodeForbidden {
			t.Fatalf("alice read the manifest: %v", err)
		}
		res, err = e.connect(t, token(t, "acme", "olga", "")).ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpbridge.ManifestURI})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Contents) != 1 || res.Contents[0].Text != string(e.set.Bytes()) {
			t.Fatal("manifest differs from the manifest.Set bytes")
		}
	})

	t.Run("the call's trace reaches the executor", func(t *testing.T) {
		prev := otel.GetTextMapPropagator()
		otel.SetTextMapPropagator(propagation.TraceContext{})
		t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
		const tid = "4bf92f3577b34da6a3ce929d0e0e4736"
		res, err := call(t, bot, "ticket.search", `{"query":"charged twice"}`, mcp.Meta{mcpbridge.MetaTraceparent: "00-" + tid + "-00f067aa0ba902b7-01"})
		if err != nil || res.IsError {
			t.Fatalf("ticket.search: %v %+v", err, res)
		}
		rows := auditRows(t, e, "acme", invocationOf(t, res))
		if got := rows[len(rows)-1]; got.TraceID != tid || got.MCPSessionID != bot.ID() || got.Channel != audit.ChannelMCP {
			t.Fatalf("audit row trace %q session %q channel %q, want %s %s mcp", got.TraceID, got.MCPSessionID, got.Channel, tid, bot.ID())
		}
	})

	t.Run("what the bridge finds wrong travels with the call", func(t *testing.T) {
		// An attribute the bridge cannot read as a string: the executor
		// refuses and audits it.
		res, err := call(t, bot, "ticket.search", `{}`, mcp.Meta{mcpbridge.MetaIdempotencyKey: 42})
		if err != nil {
			t.Fatal(err)
		}
		r := refusalOf(t, res)
		if r.Code != "idempotency.invalid_key" || r.InvocationID == "" {
			t.Fatalf("relayed invalid attribute: %+v", r)
		}
		if rows := auditRows(t, e, "acme", r.InvocationID); len(rows) != 1 || rows[0].Code != "idempotency.invalid_key" {
			t.Fatalf("rows of the relayed invalid attribute: %+v", rows)
		}
		// A repeated member of the arguments: the envelope check answers,
		// and the executor refuses and audits the attempt it relays.
		body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"ticket.search","arguments":{"query":"a","query":"b"}}}`
		rep := e.post(t, token(t, "acme", "alice", "support-bot"), bot, strings.NewReader(body))
		var msg struct {
			Error struct {
				Data map[string]string `json:"data"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(rep.body), &msg); err != nil {
			t.Fatalf("%d %s: %v", rep.status, rep.body, err)
		}
		rows := auditRows(t, e, "acme", msg.Error.Data["invocation_id"])
		if last := rows[len(rows)-1]; last.Outcome != audit.OutcomeRefused || last.Stage != "schema_validate" || last.Channel != audit.ChannelMCP {
			t.Fatalf("audit row of the repeated member %+v", last.Record)
		}
	})

	t.Run("the confirm service answers the bridge for the session's human", func(t *testing.T) {
		financeBot := identity.WithRawToken(ctx, token(t, "acme", "carol", "finance-bot"))
		botCtx := identity.WithRawToken(ctx, token(t, "acme", "alice", "support-bot"))
		cs := e.connect(t, token(t, "acme", "carol", "finance-bot"))
		// 10.00 EUR: an earlier subtest refunded 25.00 of T-1001's 49.90, and
		// the helpdesk's preview refuses a refund of more than is left
		// before anyone is asked.
		res, err := call(t, cs, "ticket.refund", strings.Replace(refundInput, `"2500"`, `"1000"`, 1), nil)
		if err != nil {
			t.Fatal(err)
		}
		r := refusalOf(t, res)
		if r.Code != failure.CodeConfirmationRequired || r.ChallengeID == "" {
			t.Fatalf("refund as finance-bot: %+v", r)
		}
		cc := mandatev1.NewConfirmServiceClient(conn)
		ch, err := cc.Get(financeBot, &mandatev1.ConfirmServiceGetRequest{ChallengeId: r.ChallengeID})
		if err != nil {
			t.Fatal(err)
		}
		pr := ch.GetPrompt()
		if ch.GetChallengeId() != r.ChallengeID || ch.GetCommand() != "ticket.refund" || ch.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_PENDING ||
			ch.GetRequesterAgentId() != "finance-bot" || pr.GetTitle() == "" || pr.GetRisk() == "" || ch.GetExpiresAt() == nil ||
			len(pr.GetArgumentLines()) == 0 || strings.Contains(pr.GetArgumentsJson(), "CH4242424242") ||
			strings.Contains(strings.Join(pr.GetArgumentLines(), "\n"), "CH4242424242") {
			t.Fatalf("challenge %+v", ch)
		}
		// Another user's session can neither read nor answer it.
		if _, err := cc.Get(botCtx, &mandatev1.ConfirmServiceGetRequest{ChallengeId: r.ChallengeID}); codeOf(err) != failure.CodeConfirmationNotFound {
			t.Fatalf("alice's agent reading carol's challenge: %v", err)
		}
		decide := func(ctx context.Context, approve bool) (*mandatev1.Challenge, error) {
			d := mandatev1.Decision_DECISION_DECLINE
			if approve {
				d = mandatev1.Decision_DECISION_APPROVE
			}
			return cc.Decide(ctx, &mandatev1.DecideRequest{ChallengeId: r.ChallengeID, Decision: d, Channel: confirm.ChannelMCPElicitation})
		}
		if _, err := decide(botCtx, true); err == nil {
			t.Fatal("alice's agent answered carol's challenge")
		}
		// The requester's session answers for its human, carol, through
		// the mcp_elicitation channel.
		ch, err = decide(financeBot, false)
		if err != nil || ch.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_DECLINED ||
			ch.GetDecisionChannel() != confirm.ChannelMCPElicitation || ch.GetDecidedBy() != "carol" {
			t.Fatalf("finance-bot's session declining: %v %+v", err, ch)
		}
		if _, err := decide(financeBot, true); codeOf(err) != failure.CodeConfirmationAlreadyDecided {
			t.Fatalf("deciding twice: %v", err)
		}
	})

	t.Run("list_changed over the catalog's Watch", func(t *testing.T) {
		cs, changed := e.listen(t, token(t, "acme", "carol", "finance-bot"))
		if len(names(t, cs)) == 0 {
			t.Fatal("finance-bot sees no tools")
		}
		if err := directory.SetUserDisabled(ctx, e.dir, "acme", "carol", true); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
		case <-time.After(10 * time.Second):
			t.Fatal("no tools/list_changed")
		}
		if got := names(t, cs); len(got) != 0 {
			t.Fatalf("disabled carol's agent lists %v", got)
		}
	})
}

// codeOf is the Mandate code of a service's status error.
func codeOf(err error) string {
	return failure.Problem(failure.ToStatus(err), "").Code
}

// auditRows waits for an invocation's outcome row (written after the reply).
func auditRows(t *testing.T, e *env, tenant, inv string) []audit.Stored {
	t.Helper()
	if inv == "" {
		t.Fatal("no invocation id")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		rows, err := e.audit.Get(context.Background(), tenant, inv)
		if err != nil && !errors.Is(err, audit.ErrNotFound) { // not relayed yet
			t.Fatal(err)
		}
		if len(rows) > 0 && rows[len(rows)-1].Phase == audit.PhaseOutcome {
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("no outcome row for %s: %+v", inv, rows)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
