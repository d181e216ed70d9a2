package mcpbridge_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/edgelimit"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// edgeBridge is a second bridge on e's services with the edge's limits:
// rate and burst per principal, maxSessions, and a recorder that appends
// its refusal rows to e's audit trail on the bridge's own authority.
func (e *env) edgeBridge(t *testing.T, rate float64, burst, maxSessions int) string {
	t.Helper()
	// The audit service admits the bridge's own-authority rows, as its
	// process does: service tokens alone are accepted there.
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{Secret: serviceSecret, Audience: []string{"mandate"}, Issuers: []string{"test"}})
	if err != nil {
		t.Fatal(err)
	}
	authn, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: e.users, Services: services, AllowServiceOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	auditSrv, err := server.New(server.Config{Name: "audit", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: authn})
	if err != nil {
		t.Fatal(err)
	}
	e.auditAPI.Register(auditSrv)
	ctx, cancel := context.WithCancel(context.Background())
	serve(t, ctx, auditSrv)
	rec, err := edgelimit.NewRecorder(edgelimit.RecorderConfig{Audit: mandatev1.NewAuditServiceClient(bridgeChannel(t, auditSrv)), FlushInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	b, err := mcpbridge.New(mcpbridge.Config{
		Catalog: mandatev1.NewCatalogServiceClient(e.local), Executor: mandatev1.NewExecutorServiceClient(e.local),
		Manifest: e.set, Verifier: e.users, ResourceURL: srv.URL + "/mcp",
		EdgeLimit:   edgelimit.New(edgelimit.Config{Rate: rate, Burst: burst}),
		MaxSessions: maxSessions, EdgeRecorder: rec,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/mcp", b.Handler())
	t.Cleanup(func() {
		b.Close()
		srv.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the recorder: %v", err)
		}
	})
	return srv.URL + "/mcp"
}

// connectTo opens a session on url with the go-sdk client.
func connectTo(url, tok string) (*mcp.ClientSession, error) {
	return connectCounting(url, tok, nil)
}

// connectCounting is connectTo counting the 429s the client got in
// refused (when not nil).
func connectCounting(url, tok string, refused *atomic.Int32) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	return c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: url, HTTPClient: &http.Client{Transport: counting{bearer{tok}, refused}}, DisableStandaloneSSE: true,
	}, nil)
}

// counting counts the 429 answers of a transport.
type counting struct {
	next    http.RoundTripper
	refused *atomic.Int32
}

func (c counting) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err == nil && c.refused != nil && resp.StatusCode == http.StatusTooManyRequests {
		c.refused.Add(1)
	}
	return resp, err
}

// edgeReply is an answer of the edge: status, Retry-After and the
// JSON-RPC error's data.
type edgeReply struct {
	status     int
	retryAfter string
	code       string
	retriable  bool
}

func postRaw(t *testing.T, url, tok, session, body string) edgeReply {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(resp.Body)
	r := edgeReply{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	if resp.StatusCode == http.StatusTooManyRequests {
		var msg struct {
			Error struct {
				Code int `json:"code"`
				Data struct {
					Code      string `json:"code"`
					Retriable bool   `json:"retriable"`
				} `json:"data"`
			} `json:"error"`
		}
		if err := json.Unmarshal(raw, &msg); err != nil || msg.Error.Code != -32000 {
			t.Fatalf("the 429's body is no JSON-RPC error: %s (%v)", raw, err)
		}
		r.code, r.retriable = msg.Error.Data.Code, msg.Error.Data.Retriable
	}
	return r
}

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

// edgeRows waits for want rows of code for user in tenant's trail.
func (e *env) edgeRows(t *testing.T, tenant, user, code string, want int) int {
	t.Helper()
	n := 0
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n = 0
		for _, r := range e.auditRows(t, tenant) {
			if r.Code == code && r.UserID == user && r.Channel == "mcp" && r.Stage == "request_check" && r.Outcome == "refused" {
				n++
			}
		}
		if n >= want || time.Now().After(deadline) {
			return n
		}
	}
}

// TestSessionCap (issue 27 §4, issue 29 §2): a principal holds at most
// MaxSessions open MCP sessions on a bridge. One more initialize — by the
// go-sdk client or raw — is answered HTTP 429 session.too_many, retriable,
// with Retry-After and a JSON-RPC error every client can read, and each
// refusal leaves an audit row (channel mcp, stage request_check). Another
// principal is not affected, and once a session ends (DELETE) a new one
// opens.
func TestSessionCap(t *testing.T) {
	e := start(t)
	url := e.edgeBridge(t, 1000, 1000, 2)
	alice := token(t, "acme", "alice", "support-bot")
	var open []*mcp.ClientSession
	for range 2 {
		cs, err := connectTo(url, alice)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, cs)
	}
	defer func() {
		for _, cs := range open {
			_ = cs.Close()
		}
	}()
	var refused atomic.Int32
	if cs, err := connectCounting(url, alice, &refused); err == nil {
		_ = cs.Close()
		t.Fatal("a third session opened past the cap of 2")
	}
	if refused.Load() == 0 {
		t.Fatal("the client's refused initialize was not answered 429")
	}
	r := postRaw(t, url, alice, "", initializeBody)
	if r.status != http.StatusTooManyRequests || r.code != "session.too_many" || !r.retriable || r.retryAfter == "" {
		t.Fatalf("initialize past the cap: %+v", r)
	}
	// The open sessions still work.
	if _, err := open[0].ListTools(context.Background(), nil); err != nil {
		t.Fatalf("an open session past the cap: %v", err)
	}
	// bob has sessions of his own.
	bob, err := connectTo(url, token(t, "acme", "bob", ""))
	if err != nil {
		t.Fatalf("another principal: %v", err)
	}
	_ = bob.Close()
	if want := int(refused.Load()) + 1; e.edgeRows(t, "acme", "alice", "session.too_many", want) != want {
		t.Fatalf("%d session.too_many rows for %d refusals", e.edgeRows(t, "acme", "alice", "session.too_many", want), want)
	}
	// A flood of concurrent initializes (the outside attack opened 2,000
	// sessions with one token) opens no more than the cap.
	carol := token(t, "acme", "carol", "")
	var wg sync.WaitGroup
	var opened, capped atomic.Int32
	for range 20 {
		wg.Go(func() {
			switch r := postRaw(t, url, carol, "", initializeBody); {
			case r.status == http.StatusOK:
				opened.Add(1)
			case r.status == http.StatusTooManyRequests && r.code == "session.too_many":
				capped.Add(1)
			default:
				t.Errorf("a concurrent initialize: %+v", r)
			}
		})
	}
	wg.Wait()
	if opened.Load() != 2 || capped.Load() != 18 {
		t.Fatalf("20 concurrent initializes: %d opened, %d refused; want 2 and 18", opened.Load(), capped.Load())
	}
	// One ends: a new one opens.
	_ = open[1].Close()
	open = open[:1]
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		cs, err := connectTo(url, alice)
		if err == nil {
			open = append(open, cs)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session after one ended: %v", err)
		}
	}
}

// TestEdgeRateLimit (issue 29 §2): past its burst, a principal's MCP
// requests are answered HTTP 429 rate.limited, retriable, with a
// Retry-After of at least a second, before they reach the executor or
// the catalog; each refusal leaves an audit row; another principal keeps
// its own bucket.
func TestEdgeRateLimit(t *testing.T) {
	e := start(t)
	url := e.edgeBridge(t, 0.5, 5, 100)
	alice := token(t, "acme", "alice", "support-bot")
	cs, err := connectTo(url, alice) // initialize and initialized: 2 requests
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.Close() }()
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}`
	var ok, limited int
	for range 10 {
		r := postRaw(t, url, alice, cs.ID(), list)
		switch {
		case r.status == http.StatusOK:
			ok++
		case r.status == http.StatusTooManyRequests && r.code == "rate.limited" && r.retriable:
			if s, err := strconv.Atoi(r.retryAfter); err != nil || s < 1 {
				t.Fatalf("Retry-After %q", r.retryAfter)
			}
			limited++
		default:
			t.Fatalf("tools/list: %+v", r)
		}
	}
	if ok > 3 || limited < 7 {
		t.Fatalf("%d answered, %d limited: want at most the burst's 3 left after the handshake", ok, limited)
	}
	bob, err := connectTo(url, token(t, "acme", "bob", ""))
	if err != nil {
		t.Fatalf("another principal was limited: %v", err)
	}
	_ = bob.Close()
	if n := e.edgeRows(t, "acme", "alice", "rate.limited", limited); n != limited {
		t.Fatalf("%d rate.limited rows for %d refusals", n, limited)
	}
}
