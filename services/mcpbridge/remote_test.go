package mcpbridge_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/mandate-dev/mandate/internal/callattr"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/schema"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/catalog"
	catalogapi "github.com/mandate-dev/mandate/services/catalog/api"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmapi "github.com/mandate-dev/mandate/services/confirm/api"
	"github.com/mandate-dev/mandate/services/executor"
	execapi "github.com/mandate-dev/mandate/services/executor/api"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// The gRPC clients are the bridge's Catalog, Executor and Confirmer.
var (
	_ mcpbridge.Catalog   = (*catalogapi.Client)(nil)
	_ mcpbridge.Executor  = (*execapi.Client)(nil)
	_ mcpbridge.Confirmer = (*confirmapi.Client)(nil)
	_ mcpbridge.Catalog   = (*catalog.Catalog)(nil)
)

// startRemote is start with the bridge as its own process would run it:
// catalog, executor and confirm behind an authenticated gRPC server, and a
// second bridge that reaches them only through their gRPC clients, over a
// connection carrying the service token of "mcpbridge" (which relays each
// caller's token) and the OpenTelemetry client handler. The returned env
// is start's with url pointing at that bridge; conn is the bridge's
// connection, for tests that call a client directly.
func startRemote(t testing.TB) (e *env, conn *grpc.ClientConn) {
	t.Helper()
	local := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	execSvc := execapi.New(local.exec, local.set)
	srv, err := server.New(server.Config{Name: "mandate", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: local.authn, GRPCOptions: execSvc.ServerOptions()})
	if err != nil {
		t.Fatal(err)
	}
	execSvc.Register(srv)
	catalogapi.New(local.catalog, nil).Register(srv)
	confirmapi.New(local.confirm, nil).Register(srv)
	serve(t, ctx, srv)

	src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", identity.MCPBridgeService, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	conn, err = grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)),
		grpc.WithStreamInterceptor(identity.StreamClientInterceptor(src)))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := catalogapi.NewClient(conn, local.set)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	hs := httptest.NewServer(mux)
	b, err := mcpbridge.New(mcpbridge.Config{
		Catalog: cat, Executor: execapi.NewClient(conn), Confirm: confirmapi.NewClient(conn),
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
		cancel()
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
		if r.Code != mcpbridge.CodeConfirmationRequired || r.Stage == "" || r.ChallengeID == "" || r.ApprovalURL == "" {
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

	t.Run("executor client carries the trace", func(t *testing.T) {
		prev := otel.GetTextMapPropagator()
		otel.SetTextMapPropagator(propagation.TraceContext{})
		t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
		tid := trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled, Remote: true})
		cctx := identity.WithRawToken(trace.ContextWithRemoteSpanContext(ctx, sc), token(t, "acme", "alice", "support-bot"))
		res, err := execapi.NewClient(conn).Execute(cctx, executor.Call{Code: "ticket.search", Input: []byte(`{"query":"charged twice"}`), MCPSessionID: "s-1"})
		if err != nil {
			t.Fatal(err)
		}
		rows := auditRows(t, e, "acme", res.InvocationID)
		if got := rows[len(rows)-1]; got.TraceID != tid.String() || got.MCPSessionID != "s-1" || got.Channel != audit.ChannelMCP {
			t.Fatalf("audit row trace %q session %q channel %q, want %s s-1 mcp", got.TraceID, got.MCPSessionID, got.Channel, tid)
		}
	})

	t.Run("clients keep the services' errors", func(t *testing.T) {
		botCtx := identity.WithRawToken(ctx, token(t, "acme", "alice", "support-bot"))
		_, err := execapi.NewClient(conn).Execute(botCtx, executor.Call{Code: "ticket.search", Input: []byte(`["not an object"]`)})
		if p := failure.Problem(failure.ToStatus(err), ""); p.Code != "schema.invalid" || p.Stage != executor.StageSchema || p.InvocationID == "" {
			t.Fatalf("array input: %v %+v", err, p)
		}
		// What the bridge found wrong with an input, and attributes it could
		// not read as strings, travel with the call: the executor refuses
		// and audits them.
		_, err = execapi.NewClient(conn).Execute(botCtx, executor.Call{Code: "ticket.search", InputError: &schema.InvalidError{
			Violations: []schema.Violation{{Pointer: "/query", Rule: "schema.duplicate_key", Message: "an object names the same member twice"}}}})
		if p := failure.Problem(failure.ToStatus(err), ""); p.Code != "schema.invalid" || len(p.Errors) != 1 || p.Errors[0].Pointer != "/query" || p.Errors[0].Rule != "schema.duplicate_key" {
			t.Fatalf("relayed input error: %v %+v", err, p)
		}
		_, err = execapi.NewClient(conn).Execute(botCtx, executor.Call{Code: "ticket.search", Input: []byte(`{}`),
			Invalid: []callattr.Invalid{*callattr.TypeError(callattr.IdempotencyKey, "42")}})
		if p := failure.Problem(failure.ToStatus(err), ""); p.Code != "idempotency.invalid_key" || p.InvocationID == "" {
			t.Fatalf("relayed invalid attribute: %v %+v", err, p)
		}
		if rows := auditRows(t, e, "acme", failure.Problem(failure.ToStatus(err), "").InvocationID); len(rows) != 1 || rows[0].Code != "idempotency.invalid_key" {
			t.Fatalf("rows of the relayed invalid attribute: %+v", rows)
		}

		financeBot := identity.WithRawToken(ctx, token(t, "acme", "carol", "finance-bot"))
		// The input travels as its JSON (input_json), not as a Struct: the
		// executor's strict decoder sees what the client sent.
		dup := `{"ticket_id":"T-1001","ticket_id":"T-1002"}`
		_, err = execapi.NewClient(conn).Execute(financeBot, executor.Call{Code: "ticket.get", Input: []byte(dup)})
		if p := failure.Problem(failure.ToStatus(err), ""); p.Code != "schema.invalid" || p.InvocationID == "" {
			t.Fatalf("input with a duplicate key: %v %+v", err, p)
		}
		res, err := execapi.NewClient(conn).Execute(financeBot, executor.Call{Code: "ticket.refund", Input: []byte(refundInput)})
		r := failure.Problem(failure.ToStatus(err), "")
		if res != nil || r.Code != mcpbridge.CodeConfirmationRequired || r.ChallengeID == "" {
			t.Fatalf("refund as finance-bot: %v %+v", err, r)
		}
		cc := confirmapi.NewClient(conn)
		ch, err := cc.Get(financeBot, identity.Principal{}, r.ChallengeID)
		if err != nil {
			t.Fatal(err)
		}
		if ch.ID != r.ChallengeID || ch.Command != "ticket.refund" || ch.State != confirm.StatePending || ch.RequesterAgent != "finance-bot" ||
			ch.Prompt.Title == "" || ch.Prompt.Risk != ch.Risk || ch.Risk == "" || ch.ExpiresAt.IsZero() ||
			strings.Contains(ch.Prompt.ArgumentsJSON, "CH4242424242") {
			t.Fatalf("challenge %+v", ch)
		}
		// Another user's session can neither read nor answer it.
		if _, err := cc.Get(botCtx, identity.Principal{}, r.ChallengeID); !errors.Is(err, confirm.ErrNotFound) {
			t.Fatalf("alice's agent reading carol's challenge: %v", err)
		}
		if _, err := cc.DecideElicited(botCtx, identity.Principal{}, r.ChallengeID, true); err == nil {
			t.Fatal("alice's agent answered carol's challenge")
		}
		// The requester's session answers for its human, carol, through
		// the mcp_elicitation channel.
		ch, err = cc.DecideElicited(financeBot, identity.Principal{}, r.ChallengeID, false)
		if err != nil || ch.State != confirm.StateDeclined || ch.DecisionChannel != confirm.ChannelMCPElicitation || ch.DecidedBy != "carol" {
			t.Fatalf("finance-bot's session declining: %v %+v", err, ch)
		}
		if _, err := cc.DecideElicited(financeBot, identity.Principal{}, r.ChallengeID, true); !errors.Is(err, confirm.ErrAlreadyDecided) {
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

// auditRows waits for an invocation's outcome row (written after the reply).
func auditRows(t *testing.T, e *env, tenant, inv string) []audit.Stored {
	t.Helper()
	if inv == "" {
		t.Fatal("no invocation id")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		rows, err := e.audit.Get(context.Background(), tenant, inv)
		if err != nil {
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
