package mcpbridge

import (
	"context"
	"errors"
	"fmt"
	"io"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// toolSet is a caller's tools as the catalog listed them, sorted by name:
// each descriptor as the catalog states it, deployment options
// (--confirm-side-effects) included, so that agents are told what the
// catalog and the executor hold.
type toolSet []*mandatev1.Tool

// checkTools accepts the tools of a catalog answer when they come from the
// bridge's own manifest: one naming another manifest digest, or a tool the
// manifest does not declare, is an error (the bridge tells published
// commands from unknown names by its manifest).
func (b *Bridge) checkTools(tools []*mandatev1.Tool, digest string) (toolSet, error) {
	if want := b.cfg.Manifest.Digest(); digest != want {
		return nil, fmt.Errorf("mcpbridge: the catalog serves manifest %s, the bridge has %s; deploy the same manifest to both", digest, want)
	}
	for _, t := range tools {
		if _, ok := b.cfg.Manifest.ByCode(t.GetName()); !ok {
			return nil, fmt.Errorf("mcpbridge: the catalog lists %q, which manifest %s does not declare", t.GetName(), digest)
		}
	}
	return tools, nil
}

// listTools reads the caller's tools (ctx carries the caller's raw token).
func (b *Bridge) listTools(ctx context.Context) (toolSet, error) {
	resp, err := b.cfg.Catalog.ListTools(ctx, &mandatev1.ListToolsRequest{})
	if err != nil {
		return nil, err
	}
	return b.checkTools(resp.GetTools(), resp.GetManifestDigest())
}

// watchTools calls deliver with the caller's tool set, then with every
// change, until ctx ends (nil), the stream fails (that error) or the
// catalog ends it: an error too, so that the watch reconnects and starts
// over with a fresh snapshot.
func (b *Bridge) watchTools(ctx context.Context, deliver func(toolSet)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := b.cfg.Catalog.Watch(ctx, &mandatev1.CatalogServiceWatchRequest{})
	if err != nil {
		return streamEnd(ctx, err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return streamEnd(ctx, err)
		}
		if ev.GetKind() == mandatev1.CatalogEventKind_CATALOG_EVENT_KIND_UNSPECIFIED {
			return errors.New("mcpbridge: a catalog event of no kind")
		}
		ts, err := b.checkTools(ev.GetTools(), ev.GetManifestDigest())
		if err != nil {
			return err
		}
		deliver(ts)
	}
}

// streamEnd is how a watch stream ended: nil when the watch's context
// ended, an error naming the end of the stream when the catalog closed it.
func streamEnd(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	if errors.Is(err, io.EOF) {
		return errors.New("mcpbridge: the catalog ended the watch stream")
	}
	return err
}
