package mcpbridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

const refundInput = `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"2500"},"reason":"Customer was charged twice","cardholder_reference":"CH4242424242"}`

var (
	alicePrincipal = identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "alice", Issuer: "test"}
	carol          = identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "carol", Issuer: "test"}
)

// bearer adds a token to every request of the MCP client.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// connect opens an MCP session with the real go-sdk client.
func (e *env) connect(t *testing.T, tok string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: e.url + "/mcp", HTTPClient: &http.Client{Transport: bearer{tok}}, DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func names(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tl := range res.Tools {
		out = append(out, tl.Name)
	}
	slices.Sort(out)
	return out
}

func call(t *testing.T, cs *mcp.ClientSession, name, input string, meta mcp.Meta) (*mcp.CallToolResult, error) {
	t.Helper()
	return cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: json.RawMessage(input), Meta: meta})
}

// refusalOf decodes an isError result's refusal from its `_meta`, and
// checks that the result carries no structuredContent (which clients
// validate against the tool's outputSchema) and the same refusal as JSON
// in its second text block.
func refusalOf(t *testing.T, res *mcp.CallToolResult) mcpbridge.Refusal {
	t.Helper()
	if res == nil || !res.IsError {
		t.Fatalf("want an isError result, got %+v", res)
	}
	if res.StructuredContent != nil {
		t.Fatalf("an isError result carries structuredContent %v", res.StructuredContent)
	}
	raw, err := json.Marshal(res.Meta[mcpbridge.MetaRefusal])
	if err != nil {
		t.Fatal(err)
	}
	var r mcpbridge.Refusal
	if err := json.Unmarshal(raw, &r); err != nil || r.Code == "" {
		t.Fatalf("no refusal under _meta %s: %s (%v)", mcpbridge.MetaRefusal, raw, err)
	}
	var fromText mcpbridge.Refusal
	if len(res.Content) != 2 {
		t.Fatalf("%d content blocks, want a sentence and the refusal", len(res.Content))
	}
	if tc, ok := res.Content[1].(*mcp.TextContent); !ok || json.Unmarshal([]byte(tc.Text), &fromText) != nil || fromText.Code != r.Code || fromText.InvocationID != r.InvocationID {
		t.Fatalf("the second text block does not hold the refusal: %+v", res.Content[1])
	}
	return r
}

func TestToolsListPerPrincipal(t *testing.T) {
	e := start(t)
	alice := names(t, e.connect(t, token(t, "acme", "alice", "")))
	bot := names(t, e.connect(t, token(t, "acme", "alice", "support-bot")))
	carolTools := names(t, e.connect(t, token(t, "acme", "carol", "")))
	dave := names(t, e.connect(t, token(t, "globex", "dave", "")))

	if !slices.Equal(alice, bot) {
		t.Errorf("support-bot sees %v, its user alice %v", bot, alice)
	}
	if slices.Equal(alice, carolTools) || slices.Equal(alice, dave) {
		t.Errorf("alice %v, carol %v, dave %v: want different sets", alice, carolTools, dave)
	}
	if slices.Contains(alice, "ticket.refund") || !slices.Contains(carolTools, "ticket.refund") || !slices.Contains(dave, "ticket.refund") {
		t.Errorf("ticket.refund: alice %v, carol %v, dave %v", alice, carolTools, dave)
	}
	for who, got := range map[string][]string{"alice": alice, "carol": carolTools, "dave": dave} {
		if !slices.Contains(got, "ticket.search") {
			t.Errorf("%s lacks ticket.search: %v", who, got)
		}
	}
	// The list is the catalog's, exactly.
	ts, err := e.catalog.Tools(context.Background(), alicePrincipal)
	if err != nil {
		t.Fatal(err)
	}
	if want := withCheck(ts.Names()); !slices.Equal(alice, want) {
		t.Errorf("alice sees %v, catalog says %v", alice, want)
	}
	// Raw schemas pass through.
	res, err := e.connect(t, token(t, "acme", "carol", "")).ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range res.Tools {
		if tl.Name == "ticket.refund" {
			in, _ := json.Marshal(tl.InputSchema)
			if !strings.Contains(string(in), "cardholder_reference") || tl.Annotations == nil || tl.Annotations.DestructiveHint == nil {
				t.Errorf("ticket.refund descriptor: %s %+v", in, tl.Annotations)
			}
		}
	}
}

func TestUnlistedCommandGoesToExecutor(t *testing.T) {
	e := start(t)
	cs := e.connect(t, token(t, "acme", "alice", "support-bot"))
	res, err := call(t, cs, "ticket.refund", refundInput, nil)
	if err != nil {
		t.Fatalf("ticket.refund: %v", err)
	}
	r := refusalOf(t, res)
	if r.Code != "authorization.permission_denied" || r.Stage != "permission_check" || r.InvocationID == "" {
		t.Fatalf("refusal %+v", r)
	}
	rows, err := waitRows(e, "acme", r.InvocationID)
	if err != nil || rows == 0 {
		t.Fatalf("no audit row for %s: %v", r.InvocationID, err)
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("gateway counted %d refunds", n)
	}

	_, err = call(t, cs, "no.such.tool", `{}`, nil)
	var je *jsonrpc.Error
	if !errors.As(err, &je) || je.Code != jsonrpc.CodeInvalidParams {
		t.Fatalf("no.such.tool: %v", err)
	}
}

func waitRows(e *env, tenant, inv string) (int, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		rows, err := e.audit.Get(context.Background(), tenant, inv)
		if errors.Is(err, audit.ErrNotFound) && time.Now().Before(deadline) {
			err = nil // not relayed yet
		}
		if err != nil || len(rows) > 0 || time.Now().After(deadline) {
			return len(rows), err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConfirmationThroughApprovalURL(t *testing.T) {
	e := start(t)
	cs := e.connect(t, token(t, "acme", "carol", "finance-bot"))
	res, err := call(t, cs, "ticket.refund", refundInput, mcp.Meta{mcpbridge.MetaConversation: "conv-1"})
	if err != nil {
		t.Fatal(err)
	}
	r := refusalOf(t, res)
	if r.Code != failure.CodeConfirmationRequired || r.ChallengeID == "" || !strings.HasPrefix(r.ApprovalURL, "http://approve.test/approve/") {
		t.Fatalf("refusal %+v", r)
	}
	text := res.Content[0].(*mcp.TextContent).Text
	if !strings.Contains(text, r.ApprovalURL) || !strings.Contains(text, mcpbridge.MetaApproval) {
		t.Fatalf("text %q", text)
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("gateway counted %d refunds before approval", n)
	}
	if _, err := e.confirm.Decide(context.Background(), carol, r.ChallengeID, true, "api"); err != nil {
		t.Fatal(err)
	}
	res, err = call(t, cs, "ticket.refund", refundInput, mcp.Meta{mcpbridge.MetaApproval: r.ChallengeID, mcpbridge.MetaConversation: "conv-1"})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("approved call refused: %+v", refusalOf(t, res))
	}
	out, _ := res.StructuredContent.(map[string]any)
	if out["status"] != "REFUND_STATUS_ACCEPTED" {
		t.Fatalf("structured content %v", res.StructuredContent)
	}
	if len(res.Content) == 0 || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "REFUND_STATUS_ACCEPTED") {
		t.Fatalf("content %v", res.Content)
	}
	if n := e.gateway.Refunds(); n != 1 {
		t.Fatalf("gateway counted %d refunds, want exactly one", n)
	}
}

func TestAuthentication(t *testing.T) {
	e := start(t)
	for name, header := range map[string]string{"missing": "", "bad": "Bearer not-a-token"} {
		req, _ := http.NewRequest(http.MethodPost, e.url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), "resource_metadata=") {
			t.Errorf("%s token: %d %q", name, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
	}
	resp, err := http.Get(e.url + "/.well-known/oauth-protected-resource/mcp")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	var prm struct {
		Resource             string   `json:"resource"`
		AuthorizationServers []string `json:"authorization_servers"`
	}
	if err := json.Unmarshal(body, &prm); err != nil || prm.Resource != e.url+"/mcp" || len(prm.AuthorizationServers) != 1 {
		t.Fatalf("metadata %s: %v", body, err)
	}
}

func TestResources(t *testing.T) {
	e := start(t)
	cs := e.connect(t, token(t, "acme", "alice", ""))
	ctx := context.Background()
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
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "mandate://command/ticket.refund"}); err == nil {
		t.Fatal("alice read ticket.refund")
	}
	_, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpbridge.ManifestURI})
	var je *jsonrpc.Error
	if !errors.As(err, &je) || je.Code != mcpbridge.CodeForbidden {
		t.Fatalf("alice read the manifest: %v", err)
	}
	// An ops.read holder gets the manifest verbatim.
	res, err = e.connect(t, token(t, "acme", "olga", "")).ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpbridge.ManifestURI})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Contents) != 1 || res.Contents[0].Text != string(e.set.Bytes()) {
		t.Fatalf("manifest differs from the manifest.Set bytes")
	}
}

// TestToolsFollowTheDirectory: a directory change that alters a
// principal's tool set reaches its open session as tools/list_changed with
// no request of the session in flight (the bridge watches the catalog for
// it), and the next tools/list is the catalog's new set.
func TestToolsFollowTheDirectory(t *testing.T) {
	grant := strings.Replace(policy, "support: [ticket.read, expense.report.submit]", "support: [ticket.read, expense.report.submit, payment.refund]", 1)
	cases := []struct {
		name string
		// before runs ahead of the session, change while it is open.
		before, change func(t *testing.T, e *env)
		check          func(t *testing.T, before, after []string)
	}{
		{
			name:   "role gains a permission",
			change: func(t *testing.T, e *env) { apply(t, e, grant) },
			check: func(t *testing.T, before, after []string) {
				if slices.Contains(before, "ticket.refund") || !slices.Contains(after, "ticket.refund") {
					t.Fatalf("ticket.refund: before %v, after %v", before, after)
				}
			},
		},
		{
			name:   "role removed from the user",
			before: func(t *testing.T, e *env) { setRoles(t, e, "alice", "support", "finance") },
			change: func(t *testing.T, e *env) { setRoles(t, e, "alice", "support") },
			check: func(t *testing.T, before, after []string) {
				if !slices.Contains(before, "ticket.refund") || slices.Contains(after, "ticket.refund") || !slices.Contains(after, "ticket.search") {
					t.Fatalf("before %v, after %v", before, after)
				}
			},
		},
		{
			name: "user disabled",
			change: func(t *testing.T, e *env) {
				if err := directory.SetUserDisabled(context.Background(), e.dir, "acme", "alice", true); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, before, after []string) {
				if len(before) == 0 || len(after) != 0 {
					t.Fatalf("before %v, after %v: want an empty list", before, after)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t)
			if tc.before != nil {
				tc.before(t, e)
			}
			// alice's agent: an agent sees its user's set, and loses it with her.
			cs, changed := e.listen(t, token(t, "acme", "alice", "support-bot"))
			before := names(t, cs)
			agent := identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "support-bot", Issuer: "test"}
			if want := catalogNames(t, e, agent); !slices.Equal(before, want) {
				t.Fatalf("listed %v, catalog says %v", before, want)
			}
			tc.change(t, e)
			// Nothing else is sent until the notification comes: only the
			// bridge's watch can have caused it.
			select {
			case <-changed:
			case <-time.After(10 * time.Second):
				t.Fatal("no tools/list_changed")
			}
			after := names(t, cs)
			if want := catalogNames(t, e, agent); !slices.Equal(after, want) {
				t.Fatalf("listed %v after the change, catalog says %v", after, want)
			}
			tc.check(t, before, after)
		})
	}
}

// listen opens a session with its standalone SSE stream (where
// notifications that answer no request arrive) and reports
// tools/list_changed on the channel.
func (e *env) listen(t *testing.T, tok string) (*mcp.ClientSession, <-chan struct{}) {
	t.Helper()
	changed := make(chan struct{}, 8)
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case changed <- struct{}{}:
			default:
			}
		},
	})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: e.url + "/mcp", HTTPClient: &http.Client{Transport: bearer{tok}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs, changed
}

func catalogNames(t *testing.T, e *env, p identity.Principal) []string {
	t.Helper()
	ts, err := e.catalog.Tools(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return withCheck(ts.Names())
}

// withCheck is the list the bridge serves for the catalog's names: those,
// and its check and plan tools when there is one to check.
func withCheck(names []string) []string {
	if len(names) == 0 {
		return names
	}
	out := append(slices.Clone(names), mcpbridge.CheckTool, mcpbridge.PlanTool)
	slices.Sort(out)
	return out
}

func apply(t *testing.T, e *env, doc string) {
	t.Helper()
	if _, err := directory.Apply(context.Background(), e.dir, []byte(doc)); err != nil {
		t.Fatal(err)
	}
}

// setRoles gives an acme user exactly these roles.
func setRoles(t *testing.T, e *env, user string, roles ...string) {
	t.Helper()
	ctx := context.Background()
	err := e.dir.Update(ctx, func(tx directory.Tx) error {
		snap, err := tx.Snapshot(ctx, "acme")
		if err != nil {
			return err
		}
		for _, u := range snap.Users {
			if u.ID == user {
				u.Roles = roles
				return tx.PutUser(ctx, u)
			}
		}
		return errors.New("no user " + user)
	})
	if err != nil {
		t.Fatal(err)
	}
}
