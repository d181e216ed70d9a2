package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	helpmem "github.com/mandate-dev/mandate/examples/helpdesk/memory"
	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/tooldesc"
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
// so the client sees the same schemas — whose handler decodes the arguments,
// calls the seeded in-memory helpdesk backend's Go method directly and
// returns its JSON. No token, no pipeline, no audit, no gRPC hop.
func runReference(ctx context.Context, statsAddr, mcpAddr string) error {
	stop, err := serveStats(ctx, statsAddr)
	if err != nil {
		return err
	}
	defer stop()
	store := helpmem.New()
	if err := helpdesk.Seed(ctx, store); err != nil {
		return err
	}
	backend, err := helpdesk.New(helpdesk.Config{Store: store, Gateway: helpdesk.NewGateway(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
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
			resp, err := backend.SearchTickets(identity.WithPrincipal(ctx, referencePrincipal), &in)
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
