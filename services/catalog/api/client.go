package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/tooldesc"
	"github.com/mandate-dev/mandate/services/catalog"
)

// Client reads the catalog over gRPC for a service that relays its callers
// (the MCP bridge): it has the methods of *catalog.Catalog the bridge uses,
// so either can serve it.
//
// The connection must carry the relaying service's credentials
// (identity.UnaryClientInterceptor and StreamClientInterceptor), which
// forward the caller's raw token from the context
// (identity.WithRawToken): the catalog answers for the principal of that
// token, not for the principal argument, which only has to name the same
// caller. A context without a raw token is refused before any call.
//
// Tools are rebuilt from the client's own manifest (catalog.NewTool), which
// must be the catalog's: a response naming another manifest digest is an
// error, and so is a tool the manifest does not declare. A descriptor also
// states the catalog's deployment options (--confirm-side-effects), which
// the client cannot know: where the catalog's descriptor differs from the
// rebuilt one, the catalog's is listed (catalog.DecodeTool), so the bridge
// tells agents what the catalog and the executor hold.
// Refusals come back as *failure.Error with the catalog's stage and code.
type Client struct {
	rpc mandatev1.CatalogServiceClient
	set *manifest.Set

	mu    sync.Mutex
	tools map[string]*catalog.Tool // by code: as the catalog last described it
}

// NewClient returns a client over conn that describes tools with set.
func NewClient(conn grpc.ClientConnInterface, set *manifest.Set) (*Client, error) {
	if conn == nil || set == nil {
		return nil, errors.New("catalog client: a connection and a manifest are required")
	}
	c := &Client{rpc: mandatev1.NewCatalogServiceClient(conn), set: set, tools: map[string]*catalog.Tool{}}
	for _, cmd := range set.Commands() {
		t, err := catalog.NewTool(cmd, tooldesc.Options{})
		if err != nil {
			return nil, err
		}
		c.tools[cmd.Code] = t
	}
	return c, nil
}

// Tools returns the tools the caller may see; an inactive caller gets an
// inactive, empty set.
func (c *Client) Tools(ctx context.Context, _ identity.Principal) (catalog.ToolSet, error) {
	if err := relayed(ctx); err != nil {
		return catalog.ToolSet{}, err
	}
	resp, err := c.rpc.ListTools(ctx, &mandatev1.ListToolsRequest{})
	if err != nil {
		return catalog.ToolSet{}, remoteError(err)
	}
	return c.toolSet(resp.GetTools(), resp.GetManifestDigest(), resp.GetPrincipalActive(), resp.GetInactiveReason())
}

// Watch calls send with the caller's tool set, then with every change,
// until ctx ends (nil), the stream fails or send fails (that error). A
// stream the catalog ends (it is shutting down) is an error too, so that
// the caller reconnects; the new stream starts with a fresh snapshot.
func (c *Client) Watch(ctx context.Context, _ identity.Principal, send func(catalog.Event) error) error {
	if err := relayed(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.Watch(ctx, &mandatev1.CatalogServiceWatchRequest{})
	if err != nil {
		return streamError(ctx, err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return streamError(ctx, err)
		}
		set, err := c.toolSet(ev.GetTools(), ev.GetManifestDigest(), ev.GetPrincipalActive(), ev.GetInactiveReason())
		if err != nil {
			return err
		}
		out := catalog.Event{Kind: eventKind(ev.GetKind()), Set: set, Added: ev.GetAdded(), Removed: ev.GetRemoved()}
		if out.Kind == 0 {
			return fmt.Errorf("catalog client: event of unknown kind %v", ev.GetKind())
		}
		if err := send(out); err != nil {
			return err
		}
	}
}

// Manifest returns the manifest verbatim (it takes ops.read).
func (c *Client) Manifest(ctx context.Context, _ identity.Principal) ([]byte, error) {
	if err := relayed(ctx); err != nil {
		return nil, err
	}
	resp, err := c.rpc.GetManifest(ctx, &mandatev1.GetManifestRequest{})
	if err != nil {
		return nil, remoteError(err)
	}
	return resp.GetManifest(), nil
}

// CommandSlice returns one command's entry of the manifest verbatim.
func (c *Client) CommandSlice(ctx context.Context, _ identity.Principal, code string) ([]byte, error) {
	if err := relayed(ctx); err != nil {
		return nil, err
	}
	resp, err := c.rpc.GetCommandSlice(ctx, &mandatev1.GetCommandSliceRequest{Code: code})
	if err != nil {
		return nil, remoteError(err)
	}
	return resp.GetCommand(), nil
}

// toolSet rebuilds a response's tools from the client's manifest.
func (c *Client) toolSet(tools []*mandatev1.Tool, digest string, active bool, reason string) (catalog.ToolSet, error) {
	if digest != c.set.Digest() {
		return catalog.ToolSet{}, fmt.Errorf("catalog client: the catalog serves manifest %s, this process has %s; deploy the same manifest to both", digest, c.set.Digest())
	}
	ts := catalog.ToolSet{Active: active, Reason: reason, ManifestDigest: digest, Tools: make([]*catalog.Tool, 0, len(tools))}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range tools {
		tool, ok := c.tools[t.GetName()]
		if !ok {
			return catalog.ToolSet{}, fmt.Errorf("catalog client: the catalog lists %q, which manifest %s does not declare", t.GetName(), digest)
		}
		if js := t.GetDescriptorJson(); js != string(tool.JSON) {
			var err error
			if tool, err = catalog.DecodeTool(tool.Command, []byte(js)); err != nil {
				return catalog.ToolSet{}, fmt.Errorf("catalog client: %w", err)
			}
			c.tools[t.GetName()] = tool
		}
		ts.Tools = append(ts.Tools, tool)
	}
	return ts, nil
}

func eventKind(k mandatev1.CatalogEventKind) catalog.EventKind {
	switch k {
	case mandatev1.CatalogEventKind_CATALOG_EVENT_KIND_SNAPSHOT:
		return catalog.EventSnapshot
	case mandatev1.CatalogEventKind_CATALOG_EVENT_KIND_CHANGED:
		return catalog.EventChanged
	}
	return 0
}

// relayed refuses a call that would reach the catalog as the service
// itself: the catalog must see the caller.
func relayed(ctx context.Context) error {
	if _, ok := identity.RawTokenFromContext(ctx); !ok {
		return failure.New(identity.Stage, failure.CodeAuthenticationMissingCredentials, "no caller token to relay to the catalog")
	}
	return nil
}

// remoteError turns a status carrying a Mandate error back into that
// *failure.Error; anything else (transport failures) passes unchanged.
func remoteError(err error) error {
	if fe, ok := failure.FromStatus(status.Convert(err)); ok {
		return fe
	}
	return err
}

// streamError ends a Watch: nil when the caller's context ended, an error
// naming the end of the stream when the catalog closed it.
func streamError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	if errors.Is(err, io.EOF) {
		return errors.New("catalog client: the catalog ended the watch stream")
	}
	return remoteError(err)
}
