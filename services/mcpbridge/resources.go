package mcpbridge

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
)

// Resource URIs.
const (
	// ManifestURI is the whole manifest; reading it takes ops.read.
	ManifestURI = "mandate://manifest"
	// CommandURITemplate is one command's entry of the manifest (RFC 6570).
	CommandURITemplate = "mandate://command/{code}"
	commandURIPrefix   = "mandate://command/"
)

// CodeForbidden is the JSON-RPC error code of a resource read the caller
// is not permitted; its data holds the Refusal. It is in the
// implementation-defined range, clear of the codes the SDK and the spec
// use (-32001 to -32004, -32020 to -32022, -32042).
const CodeForbidden = -32030

func (b *Bridge) addResources(s *mcp.Server) {
	s.AddResource(&mcp.Resource{
		URI: ManifestURI, Name: "manifest", Title: "Mandate manifest", MIMEType: "application/json",
		Description: "Every command's declaration and schemas, verbatim. Requires " + opsReadPermission + ".",
	}, b.readManifest)
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: CommandURITemplate, Name: "command", Title: "Mandate command", MIMEType: "application/json",
		Description: "One command's entry of the manifest, for a command you may run.",
	}, b.readCommand)
}

func (b *Bridge) readManifest(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	ctx, ok := callerOf(ctx, req)
	if !ok {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "request is not authenticated"}
	}
	resp, err := b.cfg.Catalog.GetManifest(ctx, &mandatev1.GetManifestRequest{})
	if err != nil {
		return nil, b.resourceError(ctx, ManifestURI, err)
	}
	return contents(ManifestURI, resp.GetManifest()), nil
}

func (b *Bridge) readCommand(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	code, found := strings.CutPrefix(uri, commandURIPrefix)
	if !found || code == "" || strings.ContainsAny(code, "/?#") {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	ctx, ok := callerOf(ctx, req)
	if !ok {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "request is not authenticated"}
	}
	resp, err := b.cfg.Catalog.GetCommandSlice(ctx, &mandatev1.GetCommandSliceRequest{Code: code})
	if err != nil {
		return nil, b.resourceError(ctx, uri, err)
	}
	return contents(uri, resp.GetCommand()), nil
}

// callerOf returns ctx carrying the reader's principal and raw token, which
// the catalog answers for.
func callerOf(ctx context.Context, req *mcp.ReadResourceRequest) (context.Context, bool) {
	if req.Extra == nil {
		return ctx, false
	}
	ctx, _, ok := withCaller(ctx, req.Extra.TokenInfo)
	return ctx, ok
}

func contents(uri string, data []byte) *mcp.ReadResourceResult {
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(data)}}}
}

// resourceError maps a catalog refusal: an invisible command is "not
// found" (-32602), a missing permission is CodeForbidden, a directory
// failure is an internal error. Data carries the refusal's code.
func (b *Bridge) resourceError(ctx context.Context, uri string, err error) error {
	fe, ok := refusalOf(err)
	if !ok {
		b.log.ErrorContext(ctx, "mcpbridge: reading resource", "uri", uri, "error", err)
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "reading " + uri + " failed"}
	}
	data, _ := json.Marshal(Refusal{Code: fe.Code, Stage: fe.Stage, Message: fe.Message, Retriable: fe.Retriable, Remedy: fe.Remedy})
	switch fe.Code {
	case failure.CodeCommandNotFound:
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "resource not found: " + uri, Data: data}
	case failure.CodeDirectoryUnavailable:
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fe.Message, Data: data}
	default:
		return &jsonrpc.Error{Code: CodeForbidden, Message: fe.Message, Data: data}
	}
}
