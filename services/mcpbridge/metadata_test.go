package mcpbridge_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// TestIsIssuerURL: only an RFC 8414 issuer may be named as an authorization
// server; a bare issuer name such as "mandate-dev" names nothing a client
// could discover.
func TestIsIssuerURL(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"http://127.0.0.1:8080", true},
		{"https://login.example.com/realms/acme", true},
		{"https://tenant.auth0.example/", true},
		{"mandate-dev", false},
		{"/oauth", false},
		{"ftp://issuer.test", false},
		{"https://issuer.test/?tenant=acme", false},
		{"https://issuer.test/#x", false},
		{"https://user@issuer.test", false},
		{"https://", false},
	} {
		if got := mcpbridge.IsIssuerURL(tc.in); got != tc.want {
			t.Errorf("IsIssuerURL(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestMetadataNamesTheAuthorizationServer: the protected-resource metadata
// names the configured issuer URL, and a bridge configured with a name
// that is no URL does not start.
func TestMetadataNamesTheAuthorizationServer(t *testing.T) {
	e := start(t)
	cfg := mcpbridge.Config{Catalog: mandatev1.NewCatalogServiceClient(e.local), Executor: mandatev1.NewExecutorServiceClient(e.local), Manifest: e.set, Verifier: e.users, ResourceURL: e.url + "/mcp"}

	bad := cfg
	bad.AuthorizationServers = []string{"mandate-dev"}
	if _, err := mcpbridge.New(bad); err == nil {
		t.Fatal("a bridge naming authorization server \"mandate-dev\" started")
	}

	cfg.AuthorizationServers = []string{"http://127.0.0.1:8080"}
	b, err := mcpbridge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rec := httptest.NewRecorder()
	b.MetadataHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, b.MetadataPath(), nil))
	var prm struct {
		Resource             string   `json:"resource"`
		AuthorizationServers []string `json:"authorization_servers"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &prm); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("metadata %d %s: %v", rec.Code, rec.Body, err)
	}
	if prm.Resource != e.url+"/mcp" || !slices.Equal(prm.AuthorizationServers, []string{"http://127.0.0.1:8080"}) {
		t.Fatalf("metadata %+v", prm)
	}
}
