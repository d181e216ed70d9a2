package mcpbridgecmd

import (
	"slices"
	"testing"
)

// TestDeriveStateKey: the default requestState key is stable for a service
// secret, differs between secrets, and is not the service secret.
func TestDeriveStateKey(t *testing.T) {
	a, b := deriveStateKey([]byte("secret-a")), deriveStateKey([]byte("secret-b"))
	if string(a) != string(deriveStateKey([]byte("secret-a"))) || string(a) == string(b) || len(a) != 32 || string(a) == "secret-a" {
		t.Fatalf("derived keys %x, %x", a, b)
	}
}

// TestDefaultAuthorizationServers: without --authorization-server the
// protected-resource metadata names the OIDC issuer, else only the accepted
// issuers that are URLs — never a bare name like "mandate-dev".
func TestDefaultAuthorizationServers(t *testing.T) {
	cases := []struct {
		name    string
		oidc    string
		issuers []string
		want    []string
	}{
		{"oidc issuer wins, verbatim", "https://tenant.auth0.example/", []string{"mandate-dev"}, []string{"https://tenant.auth0.example/"}},
		{"issuer URLs only", "", []string{"mandate-dev", "https://id.example.com"}, []string{"https://id.example.com"}},
		{"no URL at all", "", []string{"mandate-dev"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := defaultAuthorizationServers(tc.oidc, tc.issuers); !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
