package mcpbridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpmem "github.com/mandate-dev/mandate/examples/helpdesk/memory"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/app/servicetest"
	"github.com/mandate-dev/mandate/internal/compile/compiletest"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/catalog"
	catalogapi "github.com/mandate-dev/mandate/services/catalog/api"
	"github.com/mandate-dev/mandate/services/confirm"
	confirmapi "github.com/mandate-dev/mandate/services/confirm/api"
	"github.com/mandate-dev/mandate/services/executor"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// stack is the governed topology with the bridge's Confirm set: directory,
// audit, executor and confirm on fresh stores (newStores), the catalog,
// their APIs on one authenticated server, and the bridge on an httptest
// server calling them through that server's in-process channel, over
// backends the test chooses.
type stack struct {
	url     string
	set     *manifest.Set
	audit   audit.Store
	confirm *confirm.Service
	// gateway counts the helpdesk's refunds (helpdesk stacks).
	gateway *helpdesk.Gateway
	// backendAddr serves the helpdesk, the catalog (ops.review) and
	// ConfirmService behind the service authenticator (helpdesk stacks).
	backendAddr string
	bridge      *mcpbridge.Bridge
	// cfg is the bridge's configuration, for more replicas of it.
	cfg mcpbridge.Config
	// clock is the bridge's clock of requestState expiry.
	clock *testClock
}

// testClock is a clock a test moves.
type testClock struct{ skew atomic.Int64 }

// Now is the time, moved by what Advance added.
func (c *testClock) Now() time.Time { return time.Now().Add(time.Duration(c.skew.Load())) }

// Advance moves the clock by d.
func (c *testClock) Advance(d time.Duration) { c.skew.Add(int64(d)) }

// backends returns the executor's connection per gRPC service of the
// manifest; it may fill in st.
type backends func(t *testing.T, ctx context.Context, st *stack, authn *identity.Authenticator, cat *catalog.Catalog) map[string]grpc.ClientConnInterface

// stateKey seals the requestState of 2026-07-28 confirmations.
var stateKey = []byte("state-key-0123456789abcdef0123456789")

// stackOption changes how newStack builds the stack (tasks_test.go).
type stackOption func(*stackOptions)

type stackOptions struct {
	// challengeTTL, when set, is the lifetime of every challenge the
	// executor opens.
	challengeTTL time.Duration
	// bridge changes the bridge's configuration; with recorder set its
	// EdgeRecorder appends to the stack's audit trail.
	bridge   func(*mcpbridge.Config)
	recorder bool
}

func newStack(t *testing.T, set *manifest.Set, policy string, be backends, opts ...stackOption) *stack {
	t.Helper()
	var o stackOptions
	for _, f := range opts {
		f(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stores := newStores(t)
	dir := stores.dir
	if _, err := directory.Apply(ctx, dir, []byte(policy)); err != nil {
		t.Fatal(err)
	}
	cache := directory.NewCache(dir, directory.CacheOptions{TTL: time.Hour})
	writer := audit.NewWriter(stores.audit, audit.WriterOptions{Attempts: 1})
	t.Cleanup(func() {
		_ = writer.Close()
		cache.Close()
	})
	confirmSvc, err := confirm.New(confirm.Config{
		Store: stores.confirm, Directory: cache, Commands: set, ApprovalBaseURL: "http://approve.test",
	})
	if err != nil {
		t.Fatal(err)
	}
	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{"mandate"}, Issuers: []string{"test"}, DevSecret: devSecret})
	if err != nil {
		t.Fatal(err)
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{Secret: serviceSecret, Audience: []string{"mandate"}, Issuers: []string{"test"}})
	if err != nil {
		t.Fatal(err)
	}
	authn, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services})
	if err != nil {
		t.Fatal(err)
	}
	cat, err := catalog.New(catalog.Config{Manifest: set, Directory: dir, TrustedServices: []string{executor.ServiceName}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cat.Close)
	st := &stack{set: set, audit: stores.audit, confirm: confirmSvc, clock: &testClock{}}
	conns := be(t, ctx, st, authn, cat)
	t.Cleanup(cancel) // before the backends' cleanups, which wait for their servers to stop
	execSrc, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", executor.ServiceName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ports := servicetest.Executor(t, users, services, execSrc, writer, cache, confirmSvc)
	var confirmPort executor.ConfirmClient = ports.Confirm
	if o.challengeTTL > 0 {
		confirmPort = shortChallenges{ConfirmClient: ports.Confirm, ttl: o.challengeTTL}
	}
	exec, err := executor.New(executor.Config{
		Manifest: set, Directory: cache, Audit: ports.Audit, Confirm: confirmPort,
		Dispatcher: executor.NewGRPCDispatcher(conns),
		Store:      stores.exec,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(exec.Close)
	local := bridgeChannel(t, serveServices(t, ctx, authn, set, exec, cat, confirmSvc))
	t.Cleanup(cancel) // before serveServices' cleanup, which waits for its server to stop

	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	st.cfg = mcpbridge.Config{
		Catalog:  mandatev1.NewCatalogServiceClient(local),
		Confirm:  mandatev1.NewConfirmServiceClient(local),
		Executor: mandatev1.NewExecutorServiceClient(local),
		Manifest: set, Verifier: users,
		ResourceURL: srv.URL + "/mcp", AuthorizationServers: []string{"https://issuer.test"},
		StateKey: stateKey, Clock: st.clock.Now,
	}
	if o.recorder {
		st.cfg.EdgeRecorder = edgeRecorder(t, ctx, users, writer, cache)
	}
	if o.bridge != nil {
		o.bridge(&st.cfg)
	}
	b, err := mcpbridge.New(st.cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/mcp", b.Handler())
	t.Cleanup(func() {
		b.Close()
		srv.Close()
	})
	st.url = srv.URL
	st.bridge = b
	return st
}

// wirePrompt is the prompt of challenge id as the confirm service's API
// answers p.
func wirePrompt(t *testing.T, svc *confirm.Service, p identity.Principal, id string) *mandatev1.Prompt {
	t.Helper()
	ch, err := confirmapi.New(svc, nil).Get(identity.WithPrincipal(context.Background(), p), &mandatev1.ConfirmServiceGetRequest{ChallengeId: id})
	if err != nil {
		t.Fatal(err)
	}
	return ch.GetPrompt()
}

// helpdeskBackends serves the helpdesk sample, the catalog's Review
// (ops.review is dispatched like any backend) and ConfirmService on one
// authenticated gRPC server, reached with the executor's service identity.
func helpdeskBackends(t *testing.T, ctx context.Context, st *stack, authn *identity.Authenticator, cat *catalog.Catalog) map[string]grpc.ClientConnInterface {
	t.Helper()
	hstore := helpmem.New()
	if err := helpdesk.Seed(ctx, hstore); err != nil {
		t.Fatal(err)
	}
	st.gateway = helpdesk.NewGateway()
	backend, err := helpdesk.New(helpdesk.Config{Store: hstore, Gateway: st.gateway, TrustedServices: []string{executor.ServiceName}})
	if err != nil {
		t.Fatal(err)
	}
	hsrv, err := server.New(server.Config{Name: "backends", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: authn})
	if err != nil {
		t.Fatal(err)
	}
	backend.Register(hsrv)
	catalogapi.New(cat, nil).Register(hsrv)
	confirmapi.New(st.confirm, nil).Register(hsrv)
	serve(t, ctx, hsrv)
	st.backendAddr = hsrv.GRPCAddr()
	src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", executor.ServiceName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(hsrv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return map[string]grpc.ClientConnInterface{"examples.helpdesk.v1.HelpdeskService": conn, "mandate.v1.CatalogService": conn}
}

func newHelpdeskStack(t *testing.T) *stack {
	t.Helper()
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	return newStack(t, set, policy, helpdeskBackends)
}

// mcpClient is the real go-sdk client with the handlers a test gives it;
// it records what the bridge asked.
type mcpClient struct {
	mu      sync.Mutex
	forms   []*mcp.ElicitParams
	urls    []*mcp.ElicitParams
	samples []*samplingParams
}

func (c *mcpClient) counts() (forms, urls, samples int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.forms), len(c.urls), len(c.samples)
}

// clientOptions configures what the client declares and how its user
// answers.
type clientOptions struct {
	// form and url declare the elicitation modes; answer is the user's
	// answer to a form (nil: no elicitation capability at all).
	form, url bool
	answer    *mcp.ElicitResult
	// sample, when set, declares sampling and answers it.
	sample *samplingResult
	// protocol is the revision the client asks for: legacyProtocol when
	// empty, or mcpbridge.ProtocolStateless.
	protocol string
	// noMRTR turns off the SDK's answering of input_required results, so
	// that the test sees them and retries by hand.
	noMRTR bool
}

// legacyProtocol is the newest revision with sessions and initialize.
const legacyProtocol = "2025-11-25"

// The SDK's sampling types are deprecated from protocol 2026-07-28; the
// bridge narrates through sampling on 2025-06-18 and 2025-11-25.
type (
	samplingResult = mcp.CreateMessageResult //nolint:staticcheck // see above
	samplingParams = mcp.CreateMessageParams //nolint:staticcheck // see above
)

func (st *stack) client(t *testing.T, tok string, o clientOptions) (*mcp.ClientSession, *mcpClient) {
	t.Helper()
	rec := &mcpClient{}
	opts := &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}}
	if o.noMRTR {
		opts.MultiRoundTrip = &mcp.MultiRoundTripOptions{Disabled: true}
	}
	proto := o.protocol
	if proto == "" {
		proto = legacyProtocol
	}
	if o.form || o.url {
		opts.Capabilities.Elicitation = &mcp.ElicitationCapabilities{}
		if o.form {
			opts.Capabilities.Elicitation.Form = &mcp.FormElicitationCapabilities{}
		}
		if o.url {
			opts.Capabilities.Elicitation.URL = &mcp.URLElicitationCapabilities{}
		}
		opts.ElicitationHandler = func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if req.Params.Mode == "url" {
				rec.urls = append(rec.urls, req.Params)
				return &mcp.ElicitResult{Action: "accept"}, nil
			}
			rec.forms = append(rec.forms, req.Params)
			return o.answer, nil
		}
	}
	if o.sample != nil {
		//nolint:staticcheck // sampling is deprecated from 2026-07-28; the bridge narrates through it on 2025-11-25
		opts.CreateMessageHandler = func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			rec.samples = append(rec.samples, req.Params)
			return o.sample, nil
		}
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts).Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: st.url + "/mcp", HTTPClient: &http.Client{Transport: bearer{tok}}, DisableStandaloneSSE: true,
	}, &mcp.ClientSessionOptions{ProtocolVersion: proto})
	if err != nil {
		t.Fatal(err)
	}
	if got := cs.InitializeResult().ProtocolVersion; got != proto {
		t.Fatalf("negotiated protocol %s, want %s", got, proto)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs, rec
}

// rows waits for at least n audit rows of an invocation (the outcome row
// is written after the reply).
func (st *stack) rows(t *testing.T, tenant, inv string, n int) []audit.Stored {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		rows, err := st.audit.Get(context.Background(), tenant, inv)
		if err != nil && !errors.Is(err, audit.ErrNotFound) { // not relayed yet
			t.Fatal(err)
		}
		if len(rows) >= n {
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("invocation %s: %d audit rows, want %d", inv, len(rows), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// outcome is the outcome row of an invocation.
func (st *stack) outcome(t *testing.T, tenant, inv string) audit.Stored {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, r := range st.rows(t, tenant, inv, 1) {
			if r.Phase == audit.PhaseOutcome {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("invocation %s: no outcome row", inv)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func invocationOf(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	inv, _ := res.Meta["mandate.dev/invocation_id"].(string)
	if inv == "" {
		t.Fatalf("result without an invocation id: %+v", res.Meta)
	}
	return inv
}

func challengeOf(t *testing.T, p *mcp.ElicitParams) string {
	t.Helper()
	id, _ := p.Meta[mcpbridge.MetaChallenge].(string)
	if id == "" {
		t.Fatalf("form elicitation without %s: %+v", mcpbridge.MetaChallenge, p.Meta)
	}
	return id
}

var (
	carolFinanceBot = identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "carol", AgentID: "finance-bot"}
	carolUser       = identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "carol"}
)

// TestConfirmationThroughElicitation: finance-bot asks for a refund; its
// client shows carol the confirm service's prompt as a form. Accept runs
// the refund once, recorded as approved by carol through mcp_elicitation
// (assurance client_attested: finance-bot runs in a client carol operates);
// the form asks for nothing else, so accept is the yes. Decline is refused
// by the executor with confirmation.refused and moves no money; cancel
// decides nothing, leaves the challenge open and says it was cancelled. A 2025-11-25
// client is asked with elicitation/create on its session; a 2026-07-28
// client gets an input_required result, which the SDK client answers with
// its elicitation handler and retries (MRTR).
func TestConfirmationThroughElicitation(t *testing.T) {
	for _, proto := range []string{legacyProtocol, mcpbridge.ProtocolStateless} {
		t.Run(proto, func(t *testing.T) { testConfirmationThroughElicitation(t, proto) })
	}
}

func testConfirmationThroughElicitation(t *testing.T, proto string) {
	cases := []struct {
		name    string
		answer  *mcp.ElicitResult
		refunds int
		state   confirm.State
	}{
		{"accept", &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, 1, confirm.StateRedeemed},
		{"accept without content", &mcp.ElicitResult{Action: "accept"}, 1, confirm.StateRedeemed},
		{"decline", &mcp.ElicitResult{Action: "decline"}, 0, confirm.StateDeclined},
		{"cancel", &mcp.ElicitResult{Action: "cancel"}, 0, confirm.StatePending},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := newHelpdeskStack(t)
			cs, rec := st.client(t, token(t, "acme", "carol", "finance-bot"), clientOptions{form: true, answer: tc.answer, protocol: proto})
			res, err := call(t, cs, "ticket.refund", refundInput, mcp.Meta{mcpbridge.MetaConversation: "conv-elicit"})
			if err != nil {
				t.Fatal(err)
			}
			if forms, urls, _ := rec.counts(); forms != 1 || urls != 0 {
				t.Fatalf("elicitations: %d forms, %d URLs; want one form", forms, urls)
			}
			form := rec.forms[0]
			id := challengeOf(t, form)
			c, err := st.confirm.Get(context.Background(), carolFinanceBot, id)
			if err != nil {
				t.Fatal(err)
			}
			// The helpdesk's preview of the refund (what it would do) is in the form too.
			if form.Message != mcpbridge.FormMessage(wirePrompt(t, st.confirm, carolFinanceBot, id)) || !strings.Contains(form.Message, "Refund a ticket (ticket.refund)") ||
				!strings.Contains(form.Message, "[withheld]") || strings.Contains(form.Message, "CH4242424242") ||
				!strings.Contains(form.Message, "\nWhat it will do (checked by the system that runs it):\n- refund 25.00 EUR of 49.90 EUR paid; 0.00 EUR refunded so far\n") {
				t.Fatalf("form message:\n%s", form.Message)
			}
			schema, _ := json.Marshal(form.RequestedSchema)
			if string(schema) != `{"properties":{},"type":"object"}` {
				t.Fatalf("requested schema %s", schema)
			}
			if tc.state == confirm.StatePending {
				// Cancel decides nothing: the challenge stays open on the
				// approval page, and the refusal says it was cancelled.
				r := refusalOf(t, res)
				if c.State != confirm.StatePending || c.DecidedBy != "" || !strings.Contains(r.Message, "cancelled") || strings.Contains(r.Message, "declined") ||
					(r.Code != failure.CodeConfirmationRequired && r.Code != failure.CodeConfirmationPending) || st.gateway.Refunds() != 0 {
					t.Fatalf("after cancel: challenge %s decided by %q, refusal %+v", c.State, c.DecidedBy, r)
				}
				return
			}
			if c.State != tc.state || c.DecidedBy != "carol" || c.DecisionChannel != confirm.ChannelMCPElicitation {
				t.Fatalf("challenge after %s: state %s, decided by %q on %q", tc.name, c.State, c.DecidedBy, c.DecisionChannel)
			}
			if n := st.gateway.Refunds(); n != tc.refunds {
				t.Fatalf("gateway counted %d refunds, want %d", n, tc.refunds)
			}
			if tc.refunds == 0 {
				r := refusalOf(t, res)
				if r.Code != failure.CodeConfirmationRefused || r.Stage != "confirmation_check" || r.InvocationID == "" {
					t.Fatalf("refusal %+v", r)
				}
				// The executor's own refusal, audited.
				out := st.outcome(t, "acme", r.InvocationID)
				if out.Outcome != audit.OutcomeRefused || out.Code != failure.CodeConfirmationRefused || out.Stage != "confirmation_check" || out.ConversationID != "conv-elicit" {
					t.Fatalf("audit outcome %+v", out.Record)
				}
				return
			}
			if res.IsError {
				t.Fatalf("accepted call refused: %+v", refusalOf(t, res))
			}
			if out, _ := res.StructuredContent.(map[string]any); out["status"] != "REFUND_STATUS_ACCEPTED" {
				t.Fatalf("structured content %v", res.StructuredContent)
			}
			inv := invocationOf(t, res)
			rows := st.rows(t, "acme", inv, 2)
			for _, r := range rows {
				if r.Approval == nil || r.Approval.Approver != "carol" || r.Approval.Channel != confirm.ChannelMCPElicitation || r.Approval.ChallengeID != id ||
					r.Approval.Assurance() != audit.AssuranceClientAttested {
					t.Fatalf("%s row approval %+v", r.Phase, r.Approval)
				}
				if r.AgentID != "finance-bot" || r.UserID != "carol" || r.Channel != "mcp" {
					t.Fatalf("%s row %+v", r.Phase, r.Record)
				}
			}
			if out := st.outcome(t, "acme", inv); out.Outcome != audit.OutcomeExecuted {
				t.Fatalf("outcome %+v", out.Record)
			}
		})
	}
}

// TestHeadlessAgentCannotApproveItself: payout-bot acts for carol but runs
// headless (the directory's default), so whoever holds its token drives
// its MCP client and could answer a confirmation form itself. Its client
// declares form elicitation and accepts everything: it is never asked. On
// both protocol revisions it gets the confirmation.required refusal with
// the approval URL (and, on 2025-11-25 with URL mode declared, the page
// through URL elicitation); no refund moves; the challenge stays pending
// for carol to approve on the page, signed in; once she has, the retry runs
// once and the trail records her approval as signed_in.
func TestHeadlessAgentCannotApproveItself(t *testing.T) {
	for _, c := range []struct {
		name  string
		opts  clientOptions
		forms int
		urls  int
	}{
		{"2025-11-25 form only", clientOptions{form: true, answer: &mcp.ElicitResult{Action: "accept"}}, 0, 0},
		{"2025-11-25 form and URL", clientOptions{form: true, url: true, answer: &mcp.ElicitResult{Action: "accept"}}, 0, 1},
		{"2026-07-28 form", clientOptions{form: true, answer: &mcp.ElicitResult{Action: "accept"}, protocol: mcpbridge.ProtocolStateless}, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := newHelpdeskStack(t)
			cs, rec := st.client(t, token(t, "acme", "carol", "payout-bot"), c.opts)
			res, err := call(t, cs, "ticket.refund", refundInput, nil)
			if err != nil {
				t.Fatal(err)
			}
			if forms, urls, _ := rec.counts(); forms != c.forms || urls != c.urls {
				t.Fatalf("elicitations: %d forms, %d URLs; want %d and %d", forms, urls, c.forms, c.urls)
			}
			r := refusalOf(t, res)
			if r.Code != failure.CodeConfirmationRequired || r.ChallengeID == "" || r.ApprovalURL == "" {
				t.Fatalf("refusal %+v", r)
			}
			if n := st.gateway.Refunds(); n != 0 {
				t.Fatalf("gateway counted %d refunds", n)
			}
			payoutBot := identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "carol", AgentID: "payout-bot"}
			ch, err := st.confirm.Get(context.Background(), payoutBot, r.ChallengeID)
			if err != nil || ch.State != confirm.StatePending || ch.Elicitable {
				t.Fatalf("challenge %+v %v", ch, err)
			}
			// The agent's runtime answering through the bridge's relay is
			// refused by the confirm service itself.
			if _, err := st.confirm.DecideElicited(context.Background(), payoutBot, r.ChallengeID, true); !errors.Is(err, confirm.ErrApproverNotAllowed) {
				t.Fatalf("headless DecideElicited: %v", err)
			}
			out := st.outcome(t, "acme", r.InvocationID)
			if out.Outcome != audit.OutcomeRefused || out.Code != failure.CodeConfirmationRequired {
				t.Fatalf("audit outcome %+v", out.Record)
			}
			if _, err := st.confirm.Decide(context.Background(), carolUser, r.ChallengeID, true, confirm.ChannelApprovalPage); err != nil {
				t.Fatal(err)
			}
			res, err = call(t, cs, "ticket.refund", refundInput, mcp.Meta{mcpbridge.MetaApproval: r.ChallengeID})
			if err != nil || res.IsError {
				t.Fatalf("approved retry: %v %+v", err, res)
			}
			if n := st.gateway.Refunds(); n != 1 {
				t.Fatalf("gateway counted %d refunds, want 1", n)
			}
			rows := st.rows(t, "acme", invocationOf(t, res), 2)
			if a := rows[len(rows)-1].Approval; a == nil || a.Approver != "carol" || a.Assurance() != audit.AssuranceSignedIn {
				t.Fatalf("approval %+v", a)
			}
		})
	}
}

// TestConfirmationWithoutElicitation: a client with no elicitation gets
// the approval URL; its retry is refused until a human approved, then runs
// once.
func TestConfirmationWithoutElicitation(t *testing.T) {
	st := newHelpdeskStack(t)
	cs, _ := st.client(t, token(t, "acme", "carol", "finance-bot"), clientOptions{})
	res, err := call(t, cs, "ticket.refund", refundInput, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := refusalOf(t, res)
	if r.Code != failure.CodeConfirmationRequired || r.Stage != "confirmation_check" || r.ChallengeID == "" ||
		r.ApprovalURL != "http://approve.test/approve/"+r.ChallengeID {
		t.Fatalf("refusal %+v", r)
	}
	grant := mcp.Meta{mcpbridge.MetaApproval: r.ChallengeID}
	res, err = call(t, cs, "ticket.refund", refundInput, grant)
	if err != nil {
		t.Fatal(err)
	}
	if early := refusalOf(t, res); early.Code != failure.CodeConfirmationPending || early.Stage != "confirmation_check" {
		t.Fatalf("retry before approval: %+v", early)
	}
	if n := st.gateway.Refunds(); n != 0 {
		t.Fatalf("gateway counted %d refunds before approval", n)
	}
	if _, err := st.confirm.Decide(context.Background(), carolUser, r.ChallengeID, true, confirm.ChannelApprovalPage); err != nil {
		t.Fatal(err)
	}
	res, err = call(t, cs, "ticket.refund", refundInput, grant)
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("approved retry refused: %+v", refusalOf(t, res))
	}
	if n := st.gateway.Refunds(); n != 1 {
		t.Fatalf("gateway counted %d refunds, want 1", n)
	}
	out := st.outcome(t, "acme", invocationOf(t, res))
	if out.Approval == nil || out.Approval.Approver != "carol" || out.Approval.Channel != confirm.ChannelApprovalPage {
		t.Fatalf("approval %+v", out.Approval)
	}
}

// TestAgentApprovingItsOwnChallenge: finance-bot cannot decide the
// challenge its call opened, in process or over ConfirmService, on any
// channel; carol still can.
func TestAgentApprovingItsOwnChallenge(t *testing.T) {
	st := newHelpdeskStack(t)
	botToken := token(t, "acme", "carol", "finance-bot")
	cs, _ := st.client(t, botToken, clientOptions{})
	res, err := call(t, cs, "ticket.refund", refundInput, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := refusalOf(t, res).ChallengeID
	for _, ch := range []string{confirm.ChannelAPI, confirm.ChannelMCPElicitation, confirm.ChannelApprovalPage} {
		if _, err := st.confirm.Decide(context.Background(), carolFinanceBot, id, true, ch); !errors.Is(err, confirm.ErrApproverNotAllowed) {
			t.Fatalf("finance-bot deciding on %s: %v", ch, err)
		}
	}
	conn, err := grpc.NewClient(st.backendAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+botToken)
	for _, ch := range []string{"", confirm.ChannelMCPElicitation} {
		_, err := mandatev1.NewConfirmServiceClient(conn).Decide(ctx, &mandatev1.DecideRequest{ChallengeId: id, Decision: mandatev1.Decision_DECISION_APPROVE, Channel: ch})
		if status.Code(err) != codes.PermissionDenied || failure.Problem(status.Convert(err), "").Code != failure.CodeConfirmationApproverNotAllowed {
			t.Fatalf("finance-bot over ConfirmService on %q: %v", ch, err)
		}
	}
	res, err = call(t, cs, "ticket.refund", refundInput, mcp.Meta{mcpbridge.MetaApproval: id})
	if err != nil {
		t.Fatal(err)
	}
	if r := refusalOf(t, res); r.Code != failure.CodeConfirmationPending {
		t.Fatalf("retry after the agent's attempts: %+v", r)
	}
	if n := st.gateway.Refunds(); n != 0 {
		t.Fatalf("gateway counted %d refunds", n)
	}
}

// ledger is a fake backend for fixture.v1.LedgerService: every call is
// counted and answered with an empty response.
type ledger struct{ calls atomic.Int64 }

func (l *ledger) Invoke(_ context.Context, method string, _, _ any, _ ...grpc.CallOption) error {
	if strings.HasPrefix(method, "/mandate.v1.PreviewService/") {
		// A backend without previews, as gRPC answers for a service it
		// does not serve.
		return status.Error(codes.Unimplemented, "unknown service mandate.v1.PreviewService")
	}
	l.calls.Add(1)
	return nil
}

func (l *ledger) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "the fake ledger has no streams")
}

// ledgerPolicy: alice may close the books (and holds ledger.approve, which
// four eyes does not let her use on her own call); carol approves.
const ledgerPolicy = `
tenants:
  - id: acme
    roles:
      closer: [ledger.close, ledger.approve]
      approver: [ledger.approve]
    users:
      - {id: alice, roles: [closer]}
      - {id: carol, roles: [approver]}
    agents:
      - {id: ledger-bot, user: alice}
`

// TestL4NeedsASecondHuman: ledger.books.close (compiled from the compiler's
// clean fixture: L4, approver another holder of ledger.approve) is never
// put to the requester as a form, even by a client that declares forms;
// a client with URL mode is sent the approval page; the requester cannot
// approve it by any path; carol's approval lets the retry run, once.
func TestL4NeedsASecondHuman(t *testing.T) {
	set := compiletest.Set(t, compiletest.Testdata(t), "clean.proto")
	cmd, ok := set.ByCode("ledger.books.close")
	if !ok || cmd.Risk != "L4" || cmd.Approver.Kind != "PERMISSION_HOLDER" || cmd.Approver.Permission != "ledger.approve" {
		t.Fatalf("fixture declaration %+v", cmd)
	}
	fake := &ledger{}
	st := newStack(t, set, ledgerPolicy, func(*testing.T, context.Context, *stack, *identity.Authenticator, *catalog.Catalog) map[string]grpc.ClientConnInterface {
		return map[string]grpc.ClientConnInterface{"fixture.v1.LedgerService": fake}
	})
	tok := token(t, "acme", "alice", "ledger-bot")
	approve := &mcp.ElicitResult{Action: "accept", Content: map[string]any{"approve": true}}
	const input = `{"entry_id":"E-1"}`

	// Form and URL declared: only the URL is used.
	both, rec := st.client(t, tok, clientOptions{form: true, url: true, answer: approve})
	res, err := call(t, both, "ledger.books.close", input, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := refusalOf(t, res)
	if r.Code != failure.CodeConfirmationRequired || r.ChallengeID == "" || r.ApprovalURL == "" {
		t.Fatalf("refusal %+v", r)
	}
	if forms, urls, _ := rec.counts(); forms != 0 || urls != 1 {
		t.Fatalf("form+URL client: %d forms, %d URL elicitations; want 0 and 1", forms, urls)
	}
	if u := rec.urls[0]; u.URL != r.ApprovalURL || u.ElicitationID != r.ChallengeID || !strings.Contains(u.Message, "ledger.approve") {
		t.Fatalf("URL elicitation %+v, refusal %+v", u, r)
	}

	// Forms only: not even asked.
	formsOnly, rec2 := st.client(t, tok, clientOptions{form: true, answer: approve})
	res, err = call(t, formsOnly, "ledger.books.close", input, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r2 := refusalOf(t, res); r2.Code != failure.CodeConfirmationRequired || r2.ApprovalURL == "" {
		t.Fatalf("forms-only client: %+v", r2)
	}
	if forms, urls, _ := rec2.counts(); forms != 0 || urls != 0 {
		t.Fatalf("forms-only client: %d forms, %d URL elicitations; want none", forms, urls)
	}

	// A 2026-07-28 client declaring both modes gets no input_required
	// result either: the approval URL.
	modern, rec3 := st.client(t, tok, clientOptions{form: true, url: true, answer: approve, protocol: mcpbridge.ProtocolStateless})
	res, err = call(t, modern, "ledger.books.close", input, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r3 := refusalOf(t, res); r3.Code != failure.CodeConfirmationRequired || r3.ApprovalURL == "" || res.NeedsInput() || res.RequestState != "" {
		t.Fatalf("2026-07-28 client: %+v", res)
	}
	if forms, urls, _ := rec3.counts(); forms != 0 || urls != 0 {
		t.Fatalf("2026-07-28 client: %d forms, %d URL elicitations; want none", forms, urls)
	}

	// The requester cannot approve: not as herself, not through her agent's
	// session, not through elicitation.
	ctx := context.Background()
	alice := identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "alice"}
	bot := identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "alice", AgentID: "ledger-bot"}
	if _, err := st.confirm.Decide(ctx, alice, r.ChallengeID, true, confirm.ChannelApprovalPage); !errors.Is(err, confirm.ErrApproverNotAllowed) {
		t.Fatalf("alice approving her own L4 call: %v", err)
	}
	if _, err := st.confirm.DecideElicited(ctx, bot, r.ChallengeID, true); !errors.Is(err, confirm.ErrApproverNotAllowed) {
		t.Fatalf("elicited approval of an L4 call: %v", err)
	}
	grant := mcp.Meta{mcpbridge.MetaApproval: r.ChallengeID}
	res, err = call(t, both, "ledger.books.close", input, grant)
	if err != nil {
		t.Fatal(err)
	}
	if early := refusalOf(t, res); early.Code != failure.CodeConfirmationPending {
		t.Fatalf("retry before a second human approved: %+v", early)
	}
	if n := fake.calls.Load(); n != 0 {
		t.Fatalf("ledger called %d times before approval", n)
	}

	// carol, who holds ledger.approve, approves; the retry runs once.
	if _, err := st.confirm.Decide(ctx, carolUser, r.ChallengeID, true, confirm.ChannelApprovalPage); err != nil {
		t.Fatal(err)
	}
	res, err = call(t, both, "ledger.books.close", input, grant)
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("approved retry refused: %+v", refusalOf(t, res))
	}
	if n := fake.calls.Load(); n != 1 {
		t.Fatalf("ledger called %d times, want 1", n)
	}
	if forms, _, _ := rec.counts(); forms != 0 {
		t.Fatalf("%d form elicitations for an L4 command", forms)
	}
	out := st.outcome(t, "acme", invocationOf(t, res))
	if out.Approval == nil || out.Approval.Approver != "carol" || out.Risk != "L4" {
		t.Fatalf("outcome %+v approval %+v", out.Record, out.Approval)
	}
}

// TestOlderProtocolRevisions: clients of every revision the SDK serves are
// accepted, 2025-03-26 and 2024-11-05 included (they send that value in
// MCP-Protocol-Version). They predate elicitation, so a confirmation is the
// approval-URL refusal, and they see refusals as isError results.
func TestOlderProtocolRevisions(t *testing.T) {
	for _, proto := range []string{"2025-03-26", "2024-11-05", "2025-06-18"} {
		t.Run(proto, func(t *testing.T) {
			st := newHelpdeskStack(t)
			cs, rec := st.client(t, token(t, "acme", "carol", "finance-bot"), clientOptions{protocol: proto})
			if tools, err := cs.ListTools(context.Background(), nil); err != nil || len(tools.Tools) == 0 {
				t.Fatalf("tools/list at %s: %v", proto, err)
			}
			res, err := call(t, cs, "ticket.search", `{"query":"charged twice"}`, nil)
			if err != nil || res.IsError {
				t.Fatalf("search at %s: %v %+v", proto, err, res)
			}
			res, err = call(t, cs, "ticket.refund", refundInput, nil)
			if err != nil {
				t.Fatal(err)
			}
			r := refusalOf(t, res)
			if r.Code != failure.CodeConfirmationRequired || r.ApprovalURL == "" {
				t.Fatalf("refund at %s: %+v", proto, r)
			}
			if forms, urls, _ := rec.counts(); forms+urls != 0 {
				t.Fatalf("a %s client was asked through elicitation", proto)
			}
			if n := st.gateway.Refunds(); n != 0 {
				t.Fatalf("gateway counted %d refunds", n)
			}
		})
	}
}
