package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
)

var devSecret = []byte("dev-secret-0123456789abcdef0123456789")

// fakeAudit is an AuditService whose handlers record the requests that
// reached them.
type fakeAudit struct {
	mandatev1.UnimplementedAuditServiceServer
	mu    sync.Mutex
	calls []string
}

func (f *fakeAudit) record(what string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, what)
}

func (f *fakeAudit) reached() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeAudit) Get(_ context.Context, req *mandatev1.GetRequest) (*mandatev1.GetResponse, error) {
	f.record("get " + req.GetInvocationId())
	return &mandatev1.GetResponse{}, nil
}

func (f *fakeAudit) Query(_ context.Context, req *mandatev1.QueryRequest) (*mandatev1.QueryResponse, error) {
	f.record("query " + req.GetCommand())
	return &mandatev1.QueryResponse{}, nil
}

func (f *fakeAudit) Append(_ context.Context, req *mandatev1.AppendRequest) (*mandatev1.AppendResponse, error) {
	f.record("append " + req.GetRecords()[0].GetCommand())
	return &mandatev1.AppendResponse{}, nil
}

// refusingAudit refuses gateway faults itself, as the executor does in
// its pipeline: here with a marker stage, so the test can tell who refused.
type refusingAudit struct{ fakeAudit }

func (*refusingAudit) RefusesGatewayInput() bool  { return true }
func (*refusingAudit) ValidatesOwnRequests() bool { return true }

func (f *refusingAudit) refuse(ctx context.Context, what string) error {
	ie := server.GatewayInputError(ctx)
	if ie == nil {
		return nil
	}
	f.record("refused " + what)
	e := failure.New("fake_pipeline", "schema.invalid", "refused by the service")
	for _, v := range ie.Violations {
		e.Violations = append(e.Violations, failure.Violation{Pointer: v.Pointer, Rule: v.Rule, Message: v.Message})
	}
	return e
}

func (f *refusingAudit) Get(ctx context.Context, req *mandatev1.GetRequest) (*mandatev1.GetResponse, error) {
	if err := f.refuse(ctx, "get"); err != nil {
		return nil, err
	}
	return f.fakeAudit.Get(ctx, req)
}

func (f *refusingAudit) Query(ctx context.Context, req *mandatev1.QueryRequest) (*mandatev1.QueryResponse, error) {
	if err := f.refuse(ctx, "query"); err != nil {
		return nil, err
	}
	return f.fakeAudit.Query(ctx, req)
}

func (f *refusingAudit) Append(ctx context.Context, req *mandatev1.AppendRequest) (*mandatev1.AppendResponse, error) {
	if err := f.refuse(ctx, "append"); err != nil {
		return nil, err
	}
	return f.fakeAudit.Append(ctx, req)
}

type reacher interface {
	mandatev1.AuditServiceServer
	reached() []string
}

// serve runs a server with svc behind its gateway and returns its base URL.
func serve(t *testing.T, svc reacher) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{"mandate"}, Issuers: []string{"test"}, DevSecret: devSecret})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Name: "test", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth, MaxRecvBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	mandatev1.RegisterAuditServiceServer(srv.GRPC(), svc)
	srv.HandleGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return mandatev1.RegisterAuditServiceHandler(ctx, mux, conn)
	})
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	base := "http://" + srv.HTTPAddr()
	for range 100 {
		if resp, err := http.Get(base + "/healthz"); err == nil { //nolint:noctx // test polling
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("server never became healthy")
	return ""
}

func mint(t *testing.T) string {
	t.Helper()
	tok, err := identity.MintDev(devSecret, identity.MintRequest{Issuer: "test", Audience: "mandate", User: "olive", Tenant: "acme", TTL: time.Hour, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

type problem struct {
	Status int    `json:"status"`
	Code   string `json:"code"`
	Stage  string `json:"stage"`
	Errors []struct {
		Pointer string `json:"pointer"`
		Rule    string `json:"rule"`
		Detail  string `json:"detail"`
	} `json:"errors"`
}

// send makes one raw request.
func send(t *testing.T, method, url, tok string, body io.Reader) (int, problem, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	var p problem
	_ = json.Unmarshal(b, &p)
	return resp.StatusCode, p, string(b)
}

var hostile = []struct {
	name, method, path, body string
	rule, pointer            string
}{
	{"query %ff", http.MethodGet, "/v1/audit/records?command=%ff", "", "schema.utf8", "/command"},
	{"query name %ff", http.MethodGet, "/v1/audit/records?%ff=1", "", "schema.utf8", ""},
	{"query not percent-encoding", http.MethodGet, "/v1/audit/records?command=%zz", "", "schema.syntax", ""},
	{"path %ff", http.MethodGet, "/v1/audit/invocations/%ff", "", "schema.utf8", "/invocation_id"},
	{"path overlong NUL", http.MethodGet, "/v1/audit/invocations/%c0%80", "", "schema.utf8", "/invocation_id"},
	{"body 5000 deep", http.MethodPost, "/v1/audit/records:append", `{"records":[` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `]}`, "schema.too_deep", ""},
	{"body 5000 deep, unterminated", http.MethodPost, "/v1/audit/records:append", strings.Repeat("[", 5000), "schema.too_deep", ""},
	{"body trailing bytes", http.MethodPost, "/v1/audit/records:append", `{"records":[{"command":"a"}]} xyz`, "schema.syntax", ""},
	{"body two values", http.MethodPost, "/v1/audit/records:append", `{}{}`, "schema.syntax", ""},
	{"body duplicate key", http.MethodPost, "/v1/audit/records:append", `{"records":[{"command":"a","command":"b"}]}`, "schema.duplicate_key", "/records/0/command"},
	{"body invalid UTF-8", http.MethodPost, "/v1/audit/records:append", "{\"records\":[{\"command\":\"\xff\"}]}", "schema.utf8", ""},
	{"body of the wrong shape", http.MethodPost, "/v1/audit/records:append", `{"records":"x"}`, "schema.decode", ""},
}

// TestHostileInputRefusedByTheServer: a service that does not refuse
// gateway faults itself never sees the request; the caller gets 400
// schema.invalid at schema_validate with the violation, never a 5xx.
func TestHostileInputRefusedByTheServer(t *testing.T) {
	svc := &fakeAudit{}
	base := serve(t, svc)
	tok := mint(t)
	for _, tc := range hostile {
		t.Run(tc.name, func(t *testing.T) {
			status, p, raw := send(t, tc.method, base+tc.path, tok, strings.NewReader(tc.body))
			if status != http.StatusBadRequest || p.Code != "schema.invalid" || p.Stage != "schema_validate" {
				t.Fatalf("HTTP %d %s, want 400 schema.invalid at schema_validate", status, raw)
			}
			if len(p.Errors) != 1 || p.Errors[0].Rule != tc.rule || (tc.pointer != "" && p.Errors[0].Pointer != tc.pointer) || p.Errors[0].Detail == "" {
				t.Fatalf("violations %s, want rule %s pointer %q", raw, tc.rule, tc.pointer)
			}
		})
	}
	if got := svc.reached(); len(got) != 0 {
		t.Fatalf("hostile requests reached the handler: %v", got)
	}
	// Well-formed requests still work.
	for _, path := range []string{"/v1/audit/records?command=ticket.search", "/v1/audit/invocations/inv_1", "/v1/audit/invocations/%C3%A9t%C3%A9"} {
		if status, _, raw := send(t, http.MethodGet, base+path, tok, nil); status != http.StatusOK {
			t.Fatalf("GET %s: HTTP %d %s", path, status, raw)
		}
	}
	if status, _, raw := send(t, http.MethodPost, base+"/v1/audit/records:append", tok, strings.NewReader(` {"records":[{"command":"ticket.search"}]}`+"\n")); status != http.StatusOK {
		t.Fatalf("append: HTTP %d %s", status, raw)
	}
	if got := strings.Join(svc.reached(), ","); got != "query ticket.search,get inv_1,get été,append ticket.search" {
		t.Fatalf("handler saw %s", got)
	}
}

// TestHostileInputRefusedByTheService: a GatewayInputRefuser gets the call,
// with the faults, and refuses it itself (the executor does so in its
// pipeline, which audits the attempt).
func TestHostileInputRefusedByTheService(t *testing.T) {
	svc := &refusingAudit{}
	base := serve(t, svc)
	tok := mint(t)
	for _, tc := range hostile {
		t.Run(tc.name, func(t *testing.T) {
			status, p, raw := send(t, tc.method, base+tc.path, tok, strings.NewReader(tc.body))
			if status != http.StatusBadRequest || p.Code != "schema.invalid" || p.Stage != "fake_pipeline" {
				t.Fatalf("HTTP %d %s, want 400 schema.invalid from the service", status, raw)
			}
			if len(p.Errors) != 1 || p.Errors[0].Rule != tc.rule || (tc.pointer != "" && p.Errors[0].Pointer != tc.pointer) {
				t.Fatalf("violations %s, want rule %s pointer %q", raw, tc.rule, tc.pointer)
			}
		})
	}
	if got := svc.reached(); len(got) != len(hostile) {
		t.Fatalf("the service refused %d calls, want %d: %v", len(got), len(hostile), got)
	}
	// Without faults the service is not told of any.
	if status, _, raw := send(t, http.MethodGet, base+"/v1/audit/invocations/inv_2", tok, nil); status != http.StatusOK {
		t.Fatalf("HTTP %d %s", status, raw)
	}
}

// TestGatewayAuthenticatesFirst: without a valid token the answer is 401,
// whatever the body holds.
func TestGatewayAuthenticatesFirst(t *testing.T) {
	svc := &fakeAudit{}
	base := serve(t, svc)
	for _, tok := range []string{"", "not-a-token"} {
		// Parsing this body would answer 400 (too deep), not 401.
		status, p, raw := send(t, http.MethodPost, base+"/v1/audit/records:append", tok, strings.NewReader(strings.Repeat("[", 5000)))
		if status != http.StatusUnauthorized || !strings.HasPrefix(p.Code, "authentication.") {
			t.Fatalf("token %q: HTTP %d %s, want 401", tok, status, raw)
		}
		if got := svc.reached(); len(got) != 0 {
			t.Fatalf("reached the handler: %v", got)
		}
	}
	// A caller cannot plant faults under the gateway's metadata name (the
	// header matcher does not forward it, and the gateway overwrites it).
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, base+"/v1/audit/invocations/inv_3", nil)
	req.Header.Set("Authorization", "Bearer "+mint(t))
	req.Header.Set("Grpc-Metadata-X-Mandate-Gateway-Input-Bin", "W3sicnVsZSI6InNjaGVtYS5zeW50YXgiLCJtZXNzYWdlIjoieCJ9XQ==") // base64, as -bin values travel
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("smuggled fault header: HTTP %d", resp.StatusCode)
	}
}

// TestOversizedBody: a body over MaxRecvBytes is 413, not read.
func TestOversizedBody(t *testing.T) {
	base := serve(t, &fakeAudit{})
	status, p, raw := send(t, http.MethodPost, base+"/v1/audit/records:append", mint(t), strings.NewReader(strings.Repeat(" ", 2<<20)))
	if status != http.StatusRequestEntityTooLarge || p.Code != "request.too_large" {
		t.Fatalf("HTTP %d %.200s, want 413", status, raw)
	}
}
