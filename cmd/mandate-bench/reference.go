package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpmem "github.com/mandate-dev/mandate/examples/helpdesk/memory"
	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/internal/app"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/tooldesc"
	"github.com/mandate-dev/mandate/services/executor"
)

// statelessRevision is the first MCP revision without sessions.
const statelessRevision = "2026-07-28"

// referencePrincipal is who the backend sees on every ungoverned call: the
// demo agent the governed runs use, as if the executor had relayed it.
var referencePrincipal = identity.Principal{
	Kind: identity.KindAgent, Tenant: "acme", Org: "support", UserID: "alice",
	AgentID: "support-bot", Via: "executor",
}

// runReference serves the ungoverned reference on mcpAddr: a plain go-sdk
// MCP server with the one tool ticket.search — the manifest's descriptor,
// so the client sees the same schemas — whose handler decodes the
// arguments, calls the helpdesk backend and returns its JSON. No pipeline,
// no audit, no catalog.
//
// With backendAddr empty, the backend is the seeded in-memory helpdesk,
// called as a Go method in this process: no token, no gRPC hop. With
// backendAddr, it is the helpdesk service listening there — the very
// process the separate topology's executor calls, over Postgres — called
// over gRPC as the executor calls it: with a service token of the
// executor's and, on behalf of the caller, the bearer token of the MCP
// request. That is the ungoverned version of the separate topology: what
// its backend costs before any governance.
func runReference(ctx context.Context, statsAddr, mcpAddr, backendAddr string) error {
	stop, err := serveStats(ctx, statsAddr)
	if err != nil {
		return err
	}
	defer stop()
	searchTickets, closeBackend, err := referenceBackend(ctx, backendAddr)
	if err != nil {
		return err
	}
	defer closeBackend()
	set, err := manifest.Embedded()
	if err != nil {
		return err
	}
	cmd, ok := set.ByCode("ticket.search")
	if !ok {
		return errors.New("the embedded manifest has no ticket.search")
	}
	d := tooldesc.FromCommand(cmd, tooldesc.Options{})
	s := mcp.NewServer(&mcp.Implementation{Name: "plain-helpdesk", Version: "1"}, &mcp.ServerOptions{Logger: slog.New(slog.DiscardHandler)})
	s.AddTool(&mcp.Tool{Name: d.Name, Title: d.Title, Description: d.Description, InputSchema: d.InputSchema, OutputSchema: d.OutputSchema},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var in helpdeskv1.SearchTicketsRequest
			if err := protojson.Unmarshal(req.Params.Arguments, &in); err != nil {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
			}
			resp, err := searchTickets(ctx, req, &in)
			if err != nil {
				res := &mcp.CallToolResult{}
				res.SetError(err)
				return res, nil
			}
			out, err := protojson.Marshal(resp)
			if err != nil {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
			}
			return &mcp.CallToolResult{
				Content:           []mcp.Content{&mcp.TextContent{Text: string(out)}},
				StructuredContent: json.RawMessage(out),
			}, nil
		})
	ln, err := net.Listen("tcp", mcpAddr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	// Like the bridge: the sessionless revision on the SDK's stateless
	// transport, older revisions on sessions.
	getServer := func(*http.Request) *mcp.Server { return s }
	stateful := mcp.NewStreamableHTTPHandler(getServer, nil)
	stateless := mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{Stateless: true})
	mux.HandleFunc("/mcp", func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("Mcp-Protocol-Version"); v != "" && v >= statelessRevision {
			stateless.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("reference server: %w", err)
	}
	return nil
}

// searchFunc calls the backend's SearchTickets for one MCP tool call.
type searchFunc func(ctx context.Context, call *mcp.CallToolRequest, in *helpdeskv1.SearchTicketsRequest) (*helpdeskv1.SearchTicketsResponse, error)

// referenceBackend is the reference's backend: the in-memory helpdesk in
// this process (addr empty), or the helpdesk service at addr.
func referenceBackend(ctx context.Context, addr string) (searchFunc, func(), error) {
	if addr == "" {
		store := helpmem.New()
		if err := helpdesk.Seed(ctx, store); err != nil {
			return nil, nil, err
		}
		backend, err := helpdesk.New(helpdesk.Config{Store: store, Gateway: helpdesk.NewGateway(), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, _ *mcp.CallToolRequest, in *helpdeskv1.SearchTicketsRequest) (*helpdeskv1.SearchTicketsResponse, error) {
			return backend.SearchTickets(identity.WithPrincipal(ctx, referencePrincipal), in)
		}, func() {}, nil
	}
	secret := os.Getenv("MANDATE_SERVICE_SECRET")
	if secret == "" {
		return nil, nil, errors.New("a reference over a backend service needs MANDATE_SERVICE_SECRET")
	}
	src, err := identity.NewServiceTokenSource([]byte(secret), app.DefaultIssuer, app.DefaultAudience, executor.ServiceName, time.Hour)
	if err != nil {
		return nil, nil, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)))
	if err != nil {
		return nil, nil, err
	}
	client := helpdeskv1.NewHelpdeskServiceClient(conn)
	return func(ctx context.Context, call *mcp.CallToolRequest, in *helpdeskv1.SearchTicketsRequest) (*helpdeskv1.SearchTicketsResponse, error) {
		// The caller's token, forwarded as the executor forwards it; the
		// backend verifies it (and the service token) itself.
		var h http.Header
		if call.Extra != nil {
			h = call.Extra.Header
		}
		raw, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
		if !ok {
			return nil, errors.New("no bearer token to call the backend on behalf of")
		}
		return client.SearchTickets(identity.WithRawToken(ctx, raw), in)
	}, func() { _ = conn.Close() }, nil
}
