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
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpmem "github.com/mandate-dev/mandate/examples/helpdesk/memory"
	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/internal/app"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/tooldesc"
	"github.com/mandate-dev/mandate/services/executor"
	"github.com/mandate-dev/mandate/services/mcpbridge"
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
// MCP server with the tools the benchmark calls, ticket.search and
// expense.report.create — the manifest's descriptors, so the client sees
// the same schemas — whose handlers decode the arguments, call the
// helpdesk backend and return its JSON. No pipeline, no audit, no catalog.
//
// With backendAddr empty, the backend is the seeded in-memory helpdesk,
// called as a Go method in this process: no token, no gRPC hop. With
// backendAddr, it is the helpdesk service listening there — the very
// process the separate topology's executor calls, over Postgres — called
// over gRPC as the executor calls it: with a service token of the
// executor's and, on behalf of the caller, the bearer token of the MCP
// request. That is the ungoverned version of the separate topology: what
// its backend costs before any governance.
//
// A write carries what the executor would send with it, since the backend
// refuses an effectful call without it: a fresh invocation id and the
// caller's idempotency key (read from _meta as the bridge reads it).
func runReference(ctx context.Context, statsAddr, mcpAddr, backendAddr string) error {
	stop, err := serveStats(ctx, statsAddr)
	if err != nil {
		return err
	}
	defer stop()
	b, err := referenceBackend(ctx, backendAddr)
	if err != nil {
		return err
	}
	defer b.close()
	set, err := manifest.Embedded()
	if err != nil {
		return err
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "plain-helpdesk", Version: "1"}, &mcp.ServerOptions{Logger: slog.New(slog.DiscardHandler)})
	if err := addTool(s, set, searchCommand.tool, b.search); err != nil {
		return err
	}
	if err := addTool(s, set, writeCommand.tool, b.create); err != nil {
		return err
	}
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

// addTool adds the manifest's command code to s as a plain tool: its
// handler decodes the arguments into In, calls the backend and returns
// its reply as JSON.
func addTool[In, Out proto.Message](s *mcp.Server, set *manifest.Set, code string, call func(context.Context, *mcp.CallToolRequest, In) (Out, error)) error {
	cmd, ok := set.ByCode(code)
	if !ok {
		return fmt.Errorf("the embedded manifest has no %s", code)
	}
	d := tooldesc.FromCommand(cmd, tooldesc.Options{})
	var zero In
	s.AddTool(&mcp.Tool{Name: d.Name, Title: d.Title, Description: d.Description, InputSchema: d.InputSchema, OutputSchema: d.OutputSchema},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			in := zero.ProtoReflect().New().Interface().(In)
			if err := protojson.Unmarshal(req.Params.Arguments, in); err != nil {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
			}
			resp, err := call(ctx, req, in)
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
	return nil
}

// refBackend calls the helpdesk backend for the reference's tools.
type refBackend struct {
	search func(context.Context, *mcp.CallToolRequest, *helpdeskv1.SearchTicketsRequest) (*helpdeskv1.SearchTicketsResponse, error)
	create func(context.Context, *mcp.CallToolRequest, *helpdeskv1.CreateExpenseReportRequest) (*helpdeskv1.ExpenseReport, error)
	close  func()
}

// idempotencyKey is the key of a tool call, from _meta as the bridge
// reads it; "" when there is none.
func idempotencyKey(call *mcp.CallToolRequest) string {
	k, _ := call.Params.Meta[mcpbridge.MetaIdempotencyKey].(string)
	return k
}

// referenceBackend is the reference's backend: the in-memory helpdesk in
// this process (addr empty), or the helpdesk service at addr.
func referenceBackend(ctx context.Context, addr string) (refBackend, error) {
	if addr == "" {
		store := helpmem.New()
		if err := helpdesk.Seed(ctx, store); err != nil {
			return refBackend{}, err
		}
		backend, err := helpdesk.New(helpdesk.Config{Store: store, Gateway: helpdesk.NewGateway(), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return refBackend{}, err
		}
		return refBackend{
			search: func(ctx context.Context, _ *mcp.CallToolRequest, in *helpdeskv1.SearchTicketsRequest) (*helpdeskv1.SearchTicketsResponse, error) {
				return backend.SearchTickets(identity.WithPrincipal(ctx, referencePrincipal), in)
			},
			create: func(ctx context.Context, call *mcp.CallToolRequest, in *helpdeskv1.CreateExpenseReportRequest) (*helpdeskv1.ExpenseReport, error) {
				// The executor's metadata, as the backend's server would
				// find it on an incoming call.
				md := metadata.Pairs(executor.MetadataInvocationID, executor.NewInvocationID())
				if k := idempotencyKey(call); k != "" {
					md.Set(executor.MetadataIdempotencyKey, k)
				}
				ctx = metadata.NewIncomingContext(identity.WithPrincipal(ctx, referencePrincipal), md)
				return backend.CreateExpenseReport(ctx, in)
			},
			close: func() {},
		}, nil
	}
	secret := os.Getenv("MANDATE_SERVICE_SECRET")
	if secret == "" {
		return refBackend{}, errors.New("a reference over a backend service needs MANDATE_SERVICE_SECRET")
	}
	src, err := identity.NewServiceTokenSource([]byte(secret), app.DefaultIssuer, app.DefaultAudience, executor.ServiceName, time.Hour)
	if err != nil {
		return refBackend{}, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)))
	if err != nil {
		return refBackend{}, err
	}
	client := helpdeskv1.NewHelpdeskServiceClient(conn)
	return refBackend{
		search: func(ctx context.Context, call *mcp.CallToolRequest, in *helpdeskv1.SearchTicketsRequest) (*helpdeskv1.SearchTicketsResponse, error) {
			ctx, err := onBehalf(ctx, call)
			if err != nil {
				return nil, err
			}
			return client.SearchTickets(ctx, in)
		},
		create: func(ctx context.Context, call *mcp.CallToolRequest, in *helpdeskv1.CreateExpenseReportRequest) (*helpdeskv1.ExpenseReport, error) {
			ctx, err := onBehalf(ctx, call)
			if err != nil {
				return nil, err
			}
			// The executor's metadata, as its dispatch sends it.
			ctx = metadata.AppendToOutgoingContext(ctx, executor.MetadataInvocationID, executor.NewInvocationID())
			if k := idempotencyKey(call); k != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, executor.MetadataIdempotencyKey, k)
			}
			return client.CreateExpenseReport(ctx, in)
		},
		close: func() { _ = conn.Close() },
	}, nil
}

// onBehalf returns ctx carrying the bearer token of the MCP request, which
// the backend's call forwards as the executor forwards the caller's; the
// backend verifies it (and the service token) itself.
func onBehalf(ctx context.Context, call *mcp.CallToolRequest) (context.Context, error) {
	var h http.Header
	if call.Extra != nil {
		h = call.Extra.Header
	}
	raw, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	if !ok {
		return nil, errors.New("no bearer token to call the backend on behalf of")
	}
	return identity.WithRawToken(ctx, raw), nil
}
