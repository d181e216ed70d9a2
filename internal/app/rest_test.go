package app

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/manifest/manifesttest"
)

// TestDevServesTheRoutesOfAnotherManifest: with a manifest that is not the
// sample, a command's own google.api.http route is served from the
// descriptors and governed (peter may read tickets: the call passes the
// pipeline and fails only at dispatch, the backend being unreachable),
// and /openapi.json describes that manifest's routes.
func TestDevServesTheRoutesOfAnotherManifest(t *testing.T) {
	dir := t.TempDir()
	v := manifesttest.Variant(t, dir)
	polFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(polFile, []byte(ownPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	d := devSettings{httpAddr: "127.0.0.1:0", grpcAddr: "127.0.0.1:0", tokensFile: filepath.Join(dir, "tokens.json"),
		manifest: clicore.ManifestFiles(v.Manifest, v.Descriptors), policyFile: polFile,
		backends: []string{"examples.helpdesk.v1.HelpdeskService=127.0.0.1:1"}}
	d.events.Keep, d.events.PurgeInterval = time.Hour, time.Hour
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var out strings.Builder
	var cl clicore.Closers
	defer cl.Close()
	p, err := startDev(t.Context(), d, log, IO{Stdout: &out, Stderr: io.Discard, Env: func(string) (string, bool) { return "", false }}, &cl)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("mandate dev: %v", err)
		}
	}()
	base := "http://" + strings.Fields(strings.SplitN(out.String(), "health http://", 2)[1])[0]
	base = strings.TrimSuffix(base, "/healthz")
	b, err := os.ReadFile(d.tokensFile)
	if err != nil {
		t.Fatal(err)
	}
	var tokens map[string]string
	if err := json.Unmarshal(b, &tokens); err != nil {
		t.Fatal(err)
	}
	get := func(path, tok string) (int, map[string]any) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tok != "" {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				var body map[string]any
				_ = json.NewDecoder(resp.Body).Decode(&body)
				_ = resp.Body.Close()
				return resp.StatusCode, body
			}
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	code, body := get("/v1/tickets/T-1001", tokens["peter"])
	if code == http.StatusNotFound || body["stage"] != "dispatch" {
		t.Fatalf("GET /v1/tickets/T-1001: %d %v, want a governed call refused at dispatch", code, body)
	}
	code, body = get("/v1/nope", tokens["peter"])
	if code != http.StatusNotFound || body["code"] != "request.route_not_found" {
		t.Fatalf("an unknown route: %d %v", code, body)
	}
	code, doc := get("/openapi.json", "")
	paths, _ := doc["paths"].(map[string]any)
	if code != http.StatusOK || paths["/v1/tickets/{ticket_id}:refund"] == nil || paths["/v1/commands/{code}:execute"] == nil || paths["/v1/audit/records"] == nil {
		t.Fatalf("/openapi.json: %d, paths %v", code, paths)
	}
}
