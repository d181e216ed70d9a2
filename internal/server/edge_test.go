package server_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/edgelimit"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
)

// appended is an edgelimit.Appender that keeps the rows.
type appended struct {
	mu   sync.Mutex
	recs []*mandatev1.AuditRecord
}

func (a *appended) Append(_ context.Context, in *mandatev1.AppendRequest, _ ...grpc.CallOption) (*mandatev1.AppendResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.recs = append(a.recs, in.GetRecords()...)
	return &mandatev1.AppendResponse{}, nil
}

// serveLimited runs serve's server with an edge limit.
func serveLimited(t *testing.T, svc reacher, limit *edgelimit.Limiter, rec *edgelimit.Recorder) string {
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
	srv, err := server.New(server.Config{Name: "test", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth, EdgeLimit: limit, EdgeRecorder: rec})
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

func mintFor(t *testing.T, tenant, user, agent string) string {
	t.Helper()
	req := identity.MintRequest{Issuer: "test", Audience: "mandate", User: user, Tenant: tenant, Agent: agent, TTL: time.Hour, Now: time.Now()}
	if agent != "" {
		req.Model = "test-model"
	}
	tok, err := identity.MintDev(devSecret, req)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

type limited struct {
	Code       string `json:"code"`
	Stage      string `json:"stage"`
	Retriable  bool   `json:"retriable"`
	RetryAfter int    `json:"retry_after"`
	Remedy     string `json:"remedy"`
}

// get sends GET path with the Authorization header given (raw), and
// returns the status, Retry-After and the problem.
func get(t *testing.T, url, authorization string) (int, string, limited) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var p limited
	_ = json.NewDecoder(resp.Body).Decode(&p)
	return resp.StatusCode, resp.Header.Get("Retry-After"), p
}

// TestRESTEdgeLimit: a principal that floods a REST route gets its burst,
// then 429 rate.limited at request_check with Retry-After and the same
// seconds in retry_after, before the service is reached; each refusal is
// one audit row of its principal; another principal is unaffected.
func TestRESTEdgeLimit(t *testing.T) {
	svc := &fakeAudit{}
	trail := &appended{}
	rec, err := edgelimit.NewRecorder(edgelimit.RecorderConfig{Audit: trail})
	if err != nil {
		t.Fatal(err)
	}
	// One token a minute: none comes back during the flood.
	limit := edgelimit.New(edgelimit.Config{Rate: 1.0 / 60, Burst: 5})
	base := serveLimited(t, svc, limit, rec)
	bot := "Bearer " + mintFor(t, "acme", "carol", "payout-bot")
	const flood = 30
	passed, refused := 0, 0
	for range flood {
		code, retry, p := get(t, base+"/v1/audit/records", bot)
		switch code {
		case http.StatusOK:
			passed++
		case http.StatusTooManyRequests:
			refused++
			secs, err := strconv.Atoi(retry)
			if err != nil || secs < 1 || secs > 60 || p.RetryAfter != secs || p.Code != failure.CodeRateLimited || p.Stage != failure.StageRequest ||
				!p.Retriable || p.Remedy == "" {
				t.Fatalf("refusal: Retry-After %q, %+v", retry, p)
			}
		default:
			t.Fatalf("status %d", code)
		}
	}
	if passed != 5 || refused != flood-5 {
		t.Fatalf("%d passed, %d refused; want 5 and %d", passed, refused, flood-5)
	}
	if n := len(svc.reached()); n != 5 {
		t.Fatalf("the service was reached %d times, want 5", n)
	}
	if code, _, _ := get(t, base+"/v1/audit/records", "Bearer "+mintFor(t, "acme", "alice", "")); code != http.StatusOK {
		t.Fatalf("another principal: %d, want 200", code)
	}
	if err := rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, r := range trail.recs {
		if r.GetTenant() != "acme" || r.GetUserId() != "carol" || r.GetAgentId() != "payout-bot" || r.GetCode() != failure.CodeRateLimited ||
			r.GetChannel() != "rest" || r.GetOutcome() != "refused" || r.GetStage() != failure.StageRequest {
			t.Fatalf("row %v", r)
		}
		rows++
	}
	if rows != refused {
		t.Fatalf("%d audit rows for %d refusals", rows, refused)
	}
}

// TestRESTEdgeLimitBoundsKeys: a flood of requests with random
// credentials, and with valid tokens of many principals, leaves at most
// the configured number of buckets; the unauthenticated ones share one
// anonymous bucket per client address, are refused 429 once it is empty
// (instead of 401) and leave no audit row.
func TestRESTEdgeLimitBoundsKeys(t *testing.T) {
	svc := &fakeAudit{}
	trail := &appended{}
	rec, err := edgelimit.NewRecorder(edgelimit.RecorderConfig{Audit: trail})
	if err != nil {
		t.Fatal(err)
	}
	limit := edgelimit.New(edgelimit.Config{Rate: 1.0 / 60, Burst: 3, MaxKeys: 50})
	base := serveLimited(t, svc, limit, rec)
	statuses := map[int]int{}
	for range 300 {
		var b [24]byte
		_, _ = rand.Read(b[:])
		code, _, _ := get(t, base+"/v1/audit/records", "Bearer "+hex.EncodeToString(b[:]))
		statuses[code]++
	}
	if statuses[http.StatusUnauthorized] != 3 || statuses[http.StatusTooManyRequests] != 297 {
		t.Fatalf("random tokens: %v, want 3 × 401 then 297 × 429", statuses)
	}
	if n := limit.Keys(); n != 1 {
		t.Fatalf("%d buckets after 300 random tokens from one address, want 1", n)
	}
	for i := range 200 {
		get(t, base+"/v1/audit/records", "Bearer "+mintFor(t, "acme", fmt.Sprintf("user-%d", i), ""))
	}
	if n := limit.Keys(); n != 50 {
		t.Fatalf("%d buckets after 200 principals, want the bound, 50", n)
	}
	if err := rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(trail.recs) != 0 {
		t.Fatalf("%d audit rows for refusals without a tenant", len(trail.recs))
	}
}
