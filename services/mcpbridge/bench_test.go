package mcpbridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/executor"
)

// BenchmarkToolsCall measures MCP tools/call of ticket.search, with the
// real go-sdk client over Streamable HTTP, through the governed bridge
// (bearer auth, the executor's pipeline, intent and outcome rows in
// Postgres) and through a plain go-sdk server whose one tool calls the same
// helpdesk backend directly: same machine, same run, same client.
//
// Each case reports calls/s, p50 and p99 latency; the governed case also
// reports its throughput as a fraction of the ungoverned one (target ≥ 0.6).
//
//	MANDATE_REQUIRE_POSTGRES=1 go test ./services/mcpbridge -run '^$' -bench ToolsCall -benchtime 2000x
func BenchmarkToolsCall(b *testing.B) {
	// The servers' per-session logs would split the result lines.
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.DiscardHandler))
	b.Cleanup(func() { slog.SetDefault(prev) })
	e := start(b)
	plain := e.ungoverned(b)
	tok := token(b, "acme", "alice", "support-bot")
	const args = `{"query":"charged twice"}`

	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			var ungoverned float64
			b.Run("ungoverned", func(b *testing.B) {
				ungoverned = runCalls(b, plain, tok, callers, args).report(b)
			})
			b.Run("governed", func(b *testing.B) {
				governed := runCalls(b, e.url+"/mcp", tok, callers, args).report(b)
				if ungoverned > 0 {
					b.ReportMetric(governed/ungoverned, "x-ungoverned")
				}
			})
		})
	}
}

// ungoverned serves a plain go-sdk MCP server with one tool, ticket.search,
// that calls the helpdesk backend over gRPC with the executor's service
// credentials and the caller's token: no authorisation, no validation
// beyond the SDK's, no audit. It returns the endpoint URL.
func (e *env) ungoverned(tb testing.TB) string {
	tb.Helper()
	src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", executor.ServiceName, time.Hour)
	if err != nil {
		tb.Fatal(err)
	}
	conn, err := grpc.NewClient(e.helpdeskAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)))
	if err != nil {
		tb.Fatal(err)
	}
	helpdesk := helpdeskv1.NewHelpdeskServiceClient(conn)

	type searchInput struct {
		Query string `json:"query" jsonschema:"free text matched against the subject"`
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "plain-helpdesk", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "ticket.search", Description: "Search tickets."},
		func(ctx context.Context, req *mcp.CallToolRequest, in searchInput) (*mcp.CallToolResult, any, error) {
			tok, ok := strings.CutPrefix(req.Extra.Header.Get("Authorization"), "Bearer ")
			if !ok {
				return nil, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "no bearer token"}
			}
			resp, err := helpdesk.SearchTickets(identity.WithRawToken(ctx, tok), &helpdeskv1.SearchTicketsRequest{Query: in.Query})
			if err != nil {
				res := &mcp.CallToolResult{}
				res.SetError(err)
				return res, nil, nil
			}
			out, err := protojson.Marshal(resp)
			if err != nil {
				return nil, nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
			}
			return &mcp.CallToolResult{
				Content:           []mcp.Content{&mcp.TextContent{Text: string(out)}},
				StructuredContent: json.RawMessage(out),
			}, nil, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	tb.Cleanup(func() {
		srv.Close()
		_ = conn.Close()
	})
	return srv.URL
}

// calls is one measured run: b.N calls spread over the callers.
type calls struct {
	n         int
	elapsed   time.Duration
	latencies []time.Duration
}

// runCalls opens one session per caller (outside the timer), warms each
// up with one call, then makes b.N calls of ticket.search in total.
func runCalls(b *testing.B, endpoint, tok string, callers int, args string) calls {
	b.Helper()
	ctx := context.Background()
	// One HTTP transport per run, with room for every caller's connection.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = callers * 2
	client := &http.Client{Transport: bearerOver{tok, transport}}
	defer transport.CloseIdleConnections()

	sessions := make([]*mcp.ClientSession, callers)
	defer func() {
		for _, cs := range sessions {
			if cs != nil {
				_ = cs.Close()
			}
		}
	}()
	for i := range sessions {
		c := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: client, DisableStandaloneSSE: true}, nil)
		if err != nil {
			b.Fatalf("connect %s: %v", endpoint, err)
		}
		sessions[i] = cs
		if err := search(ctx, cs, args); err != nil {
			b.Fatalf("warm-up call to %s: %v", endpoint, err)
		}
	}

	var (
		next      atomic.Int64
		wg        sync.WaitGroup
		failed    atomic.Pointer[error]
		latencies = make([][]time.Duration, callers)
	)
	b.ResetTimer()
	began := time.Now()
	for i, cs := range sessions {
		wg.Go(func() {
			own := make([]time.Duration, 0, b.N/callers+1)
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				if err := search(ctx, cs, args); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				own = append(own, time.Since(t0))
			}
			latencies[i] = own
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatalf("ticket.search via %s: %v", endpoint, *err)
	}
	return calls{n: b.N, elapsed: elapsed, latencies: slices.Concat(latencies...)}
}

// report records calls/s, p50 and p99 (milliseconds) and returns calls/s.
func (c calls) report(b *testing.B) float64 {
	slices.Sort(c.latencies)
	pct := func(p float64) float64 {
		if len(c.latencies) == 0 {
			return 0
		}
		i := int(p * float64(len(c.latencies)-1))
		return float64(c.latencies[i].Microseconds()) / 1000
	}
	rate := float64(c.n) / c.elapsed.Seconds()
	b.ReportMetric(rate, "calls/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	return rate
}

// search calls ticket.search and fails on anything but a result that
// found T-1001.
func search(ctx context.Context, cs *mcp.ClientSession, args string) error {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "ticket.search", Arguments: json.RawMessage(args)})
	if err != nil {
		return err
	}
	if res.IsError || len(res.Content) == 0 {
		return fmt.Errorf("tool error: %+v", res.Content)
	}
	if text, ok := res.Content[0].(*mcp.TextContent); !ok || !strings.Contains(text.Text, "T-1001") {
		return fmt.Errorf("unexpected result: %+v", res.Content)
	}
	return nil
}

// bearerOver adds a bearer token to every request sent through base.
type bearerOver struct {
	token string
	base  http.RoundTripper
}

func (t bearerOver) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.base.RoundTrip(r)
}
