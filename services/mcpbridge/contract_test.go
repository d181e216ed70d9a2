package mcpbridge_test

import (
	"context"
	"encoding/json"
	"go/build"
	"slices"
	"strings"
	"testing"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	genmanifest "github.com/mandate-dev/mandate/gen/manifest"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/tooldesc"
	"github.com/mandate-dev/mandate/services/catalog"
	catalogapi "github.com/mandate-dev/mandate/services/catalog/api"
	"github.com/mandate-dev/mandate/services/executor"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// TestBridgeImportsNoService: the bridge knows the other services only by
// their API (the mandatev1 messages and clients), never by their Go
// packages. Its own subpackages (services/mcpbridge/internal/...) are
// part of it.
func TestBridgeImportsNoService(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, "github.com/mandate-dev/mandate/services/") &&
			!strings.HasPrefix(imp, "github.com/mandate-dev/mandate/services/mcpbridge/") {
			t.Errorf("the bridge imports %s", imp)
		}
	}
}

// TestToolsFromAnotherManifest: a catalog serving another manifest than
// the bridge's is not believed — the bridge tells commands from unknown
// names by its own manifest — so the caller lists no tools.
func TestToolsFromAnotherManifest(t *testing.T) {
	var m manifest.Manifest
	if err := json.Unmarshal(genmanifest.Manifest, &m); err != nil {
		t.Fatal(err)
	}
	m.Commands[0].Description += " (edited)"
	raw, err := manifest.Encode(&m)
	if err != nil {
		t.Fatal(err)
	}
	other, err := manifest.Load(raw, genmanifest.DescriptorSet)
	if err != nil {
		t.Fatal(err)
	}
	base := start(t)
	if got := names(t, base.connect(t, token(t, "acme", "alice", ""))); len(got) == 0 {
		t.Fatal("alice lists no tools from the bridge with the catalog's manifest")
	}
	e := startBridge(t, base, mcpbridge.Config{Manifest: other})
	if got := names(t, e.connect(t, token(t, "acme", "alice", ""))); len(got) != 0 {
		t.Fatalf("a bridge with another manifest lists %v", got)
	}
}

// TestToolsStateTheCatalogsConfirmation: the bridge cannot know the
// catalog's --confirm-side-effects, so it lists each tool as the catalog
// describes it.
func TestToolsStateTheCatalogsConfirmation(t *testing.T) {
	base := start(t)
	for _, on := range []bool{false, true} {
		cat, err := catalog.New(catalog.Config{Manifest: base.set, Directory: base.dir, ConfirmSideEffects: on, TrustedServices: []string{executor.ServiceName}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cat.Close)
		srv, err := server.New(server.Config{Name: "catalog", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: base.authn})
		if err != nil {
			t.Fatal(err)
		}
		catalogapi.New(cat, nil).Register(srv)
		ctx, cancel := context.WithCancel(context.Background())
		serve(t, ctx, srv)
		t.Cleanup(cancel) // before serve's cleanup, which waits for the server to stop
		e := startBridge(t, base, mcpbridge.Config{Catalog: mandatev1.NewCatalogServiceClient(bridgeChannel(t, srv))})
		res, err := e.connect(t, token(t, "acme", "alice", "")).ListTools(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var listed []string
		for _, tl := range res.Tools {
			listed = append(listed, tl.Name)
			want := tl.Name == "expense.report.submit" && on
			if got := tl.Meta[tooldesc.MetaConfirmationRequired]; got != want {
				t.Fatalf("confirm-side-effects=%v: %s lists confirmation_required %v, want %v", on, tl.Name, got, want)
			}
		}
		if !slices.Contains(listed, "expense.report.submit") {
			t.Fatalf("alice lists %v", listed)
		}
	}
}
