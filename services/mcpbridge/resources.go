package mcpbridge

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/catalog"
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
		Description: "Every command's declaration and schemas, verbatim. Requires " + catalog.OpsReadPermission + ".",
	}, b.readManifest)
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: CommandURITemplate, Name: "command", Title: "Mandate command", MIMEType: "application/json",
		Description: "One command's entry of the manifest, for a command you may run.",
	}, b.readCommand)
}

func (b *Bridge) readManifest(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	ctx, p, ok := callerOf(ctx, req)
	if !ok {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "request is not authenticated"}
	}
	data, err := b.cfg.Catalog.Manifest(ctx, p)
	if err != nil {
		return nil, b.resourceError(ctx, ManifestURI, err)
	}
	return contents(ManifestURI, data), nil
}

func (b *Bridge) readCommand(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	code, found := strings.CutPrefix(uri, commandURIPrefix)
	if !found || code == "" || strings.ContainsAny(code, "/?#") {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	ctx, p, ok := callerOf(ctx, req)
	if !ok {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "request is not authenticated"}
	}
	data, err := b.cfg.Catalog.CommandSlice(ctx, p, code)
	if err != nil {
		return nil, b.resourceError(ctx, uri, err)
	}
	return contents(uri, data), nil
}

func callerOf(ctx context.Context, req *mcp.ReadResourceRequest) (context.Context, identity.Principal, bool) {
	if req.Extra == nil {
		return ctx, identity.Principal{}, false
	}
	return withCaller(ctx, req.Extra.TokenInfo)
}

func contents(uri string, data []byte) *mcp.ReadResourceResult {
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(data)}}}
}

// resourceError maps a catalog refusal: an invisible command is "not
// found" (-32602), a missing permission is CodeForbidden, a directory
// failure is an internal error. Data carries the refusal's code.
func (b *Bridge) resourceError(ctx context.Context, uri string, err error) error {
	var fe *failure.Error
	if !errors.As(err, &fe) {
		b.log.ErrorContext(ctx, "mcpbridge: reading resource", "uri", uri, "error", err)
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "reading " + uri + " failed"}
	}
	data, _ := json.Marshal(Refusal{Code: fe.Code, Stage: fe.Stage, Message: fe.Message, Retriable: fe.Retriable, Remedy: fe.Remedy})
	switch fe.Code {
	case catalog.CodeCommandNotFound:
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "resource not found: " + uri, Data: data}
	case catalog.CodeDirectoryUnavailable:
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fe.Message, Data: data}
	default:
		return &jsonrpc.Error{Code: CodeForbidden, Message: fe.Message, Data: data}
	}
}
