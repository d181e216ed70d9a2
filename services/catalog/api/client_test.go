package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	genmanifest "github.com/mandate-dev/mandate/gen/manifest"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/tooldesc"
	"github.com/mandate-dev/mandate/services/catalog"
	"github.com/mandate-dev/mandate/services/catalog/api"
)

var aliceP = identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "alice", Issuer: "test"}

func TestClient(t *testing.T) {
	e := start(t, memoryDirectory)
	c, err := api.NewClient(e.svc, e.set)
	if err != nil {
		t.Fatal(err)
	}
	alice := relaying(token(t, "acme", "alice", ""))

	t.Run("tools are the catalog's, described by the same manifest", func(t *testing.T) {
		ts, err := c.Tools(alice, aliceP)
		if err != nil {
			t.Fatal(err)
		}
		if !ts.Active || !slices.Equal(ts.Names(), aliceTools) || ts.ManifestDigest != e.set.Digest() {
			t.Fatalf("set %+v names %v", ts, ts.Names())
		}
		for _, tl := range ts.Tools {
			local, err := catalog.NewTool(tl.Command, tooldesc.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if string(local.JSON) != string(tl.JSON) {
				t.Fatalf("%s described differently", tl.Name())
			}
		}
	})

	t.Run("refusals are failure errors", func(t *testing.T) {
		cases := []struct {
			name        string
			call        func() error
			stage, code string
		}{
			{"invisible slice", func() error { _, err := c.CommandSlice(alice, aliceP, "ticket.refund"); return err },
				catalog.StageLoad, failure.CodeCommandNotFound},
			{"manifest without ops.read", func() error { _, err := c.Manifest(alice, aliceP); return err },
				catalog.StagePermission, failure.CodeAuthorizationPermissionDenied},
			{"no caller token", func() error { _, err := c.Tools(context.Background(), aliceP); return err },
				identity.Stage, failure.CodeAuthenticationMissingCredentials},
			{"no caller token to watch", func() error {
				return c.Watch(context.Background(), aliceP, func(catalog.Event) error { return nil })
			}, identity.Stage, failure.CodeAuthenticationMissingCredentials},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				var fe *failure.Error
				if err := tc.call(); !errors.As(err, &fe) || fe.Stage != tc.stage || fe.Code != tc.code {
					t.Fatalf("got %v, want %s at %s", err, tc.code, tc.stage)
				}
			})
		}
	})

	t.Run("verbatim bytes", func(t *testing.T) {
		slice, err := c.CommandSlice(alice, aliceP, "ticket.search")
		if err != nil || !strings.Contains(string(slice), `"code": "ticket.search"`) {
			t.Fatalf("slice %s: %v", slice, err)
		}
		olive := relaying(token(t, "acme", "olive", ""))
		raw, err := c.Manifest(olive, identity.Principal{})
		if err != nil || string(raw) != string(e.set.Bytes()) {
			t.Fatalf("manifest differs: %v", err)
		}
	})

	t.Run("watch: snapshot, then the change", func(t *testing.T) {
		ctx, cancel := context.WithCancel(alice)
		events := make(chan catalog.Event, 4)
		done := make(chan error, 1)
		go func() {
			done <- c.Watch(ctx, aliceP, func(ev catalog.Event) error { events <- ev; return nil })
		}()
		first := <-events
		if first.Kind != catalog.EventSnapshot || !slices.Equal(first.Set.Names(), aliceTools) {
			t.Fatalf("first event %+v", first)
		}
		if err := directory.SetUserDisabled(context.Background(), e.dir, "acme", "alice", true); err != nil {
			t.Fatal(err)
		}
		var next catalog.Event
		select {
		case next = <-events:
		case <-time.After(10 * time.Second):
			t.Fatal("no change event")
		}
		if next.Kind != catalog.EventChanged || next.Set.Active || next.Set.Reason != directory.ReasonUserDisabled ||
			len(next.Set.Tools) != 0 || !slices.Equal(next.Removed, aliceTools) {
			t.Fatalf("change %+v", next)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Watch ended with %v after its context, want nil", err)
		}
	})

	t.Run("another manifest is refused", func(t *testing.T) {
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
		oc, err := api.NewClient(e.svc, other)
		if err != nil {
			t.Fatal(err)
		}
		bob := relaying(token(t, "acme", "bob", ""))
		if _, err := oc.Tools(bob, identity.Principal{}); err == nil || !strings.Contains(err.Error(), "deploy the same manifest") {
			t.Fatalf("a client with another manifest listed tools: %v", err)
		}
	})
}

// TestClientStatesTheCatalogsConfirmation: the client cannot know the
// catalog's --confirm-side-effects, so where the catalog's descriptor
// differs from the one rebuilt from the manifest, the catalog's is listed.
func TestClientStatesTheCatalogsConfirmation(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("confirm-side-effects=%v", on), func(t *testing.T) {
			e := startWith(t, memoryDirectory, catalog.Config{ConfirmSideEffects: on})
			c, err := api.NewClient(e.svc, e.set)
			if err != nil {
				t.Fatal(err)
			}
			alice := relaying(token(t, "acme", "alice", ""))
			for range 2 { // the second listing reuses what the first decoded
				ts, err := c.Tools(alice, aliceP)
				if err != nil {
					t.Fatal(err)
				}
				for _, tl := range ts.Tools {
					want := tl.Name() == "expense.report.submit" && on
					if got := tl.Descriptor.Meta[tooldesc.MetaConfirmationRequired]; got != want {
						t.Fatalf("%s: confirmation_required %v, want %v", tl.Name(), got, want)
					}
					if local, _ := catalog.NewTool(tl.Command, tooldesc.Options{ConfirmSideEffects: on}); string(local.JSON) != string(tl.JSON) {
						t.Fatalf("%s: listed %s, the catalog describes %s", tl.Name(), tl.JSON, local.JSON)
					}
				}
			}
		})
	}
}
