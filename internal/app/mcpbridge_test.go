package app

import (
	"strings"
	"testing"
)

// TestMCPBridgeRefusesBadSettings: the bridge keeps no data, so it needs
// no database, but it does need the secrets, its peers and a usable URL.
func TestMCPBridgeRefusesBadSettings(t *testing.T) {
	secrets := map[string]string{"MANDATE_DEV_SECRET": testSecret, "MANDATE_SERVICE_SECRET": testSecret + "-svc"}
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"no secrets", nil, nil, []string{"--dev-secret (MANDATE_DEV_SECRET)", "--service-secret (MANDATE_SERVICE_SECRET) is required"}},
		{"relative resource url", secrets, []string{"--resource-url", "/mcp"}, []string{"--resource-url (MANDATE_RESOURCE_URL) must be an absolute URL"}},
		{"no executor", secrets, []string{"--executor-addr", ""}, []string{"--executor-addr (MANDATE_EXECUTOR_ADDR) is required"}},
		{"no catalog", secrets, []string{"--catalog-addr", ""}, []string{"--catalog-addr (MANDATE_CATALOG_ADDR) is required"}},
		{"authorization server that is no URL", secrets, []string{"--authorization-server", "mandate-dev"},
			[]string{`--authorization-server (MANDATE_AUTHORIZATION_SERVER) "mandate-dev" is not an issuer URL`}},
		{"relative advertise url", secrets, []string{"--advertise-url", "10.0.0.5:8085"},
			[]string{"--advertise-url (MANDATE_ADVERTISE_URL) must be an absolute http(s) URL"}},
		{"advertise url with a query", secrets, []string{"--advertise-url", "http://10.0.0.5:8085/?to=elsewhere"},
			[]string{"--advertise-url (MANDATE_ADVERTISE_URL) must be an absolute http(s) URL"}},
		{"short state secret", map[string]string{
			"MANDATE_DEV_SECRET": testSecret, "MANDATE_SERVICE_SECRET": testSecret + "-svc", "MANDATE_STATE_SECRET": "too-short",
		}, nil, []string{"--state-secret (MANDATE_STATE_SECRET) must be at least 32 bytes"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := run(t, tc.env, append([]string{"mcpbridge"}, tc.args...)...)
			if code == 0 {
				t.Fatalf("exit 0: %s", errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Fatalf("stderr %q does not contain %q", errOut, w)
				}
			}
			if strings.Contains(errOut, "database-url") {
				t.Fatalf("the bridge asked for a database: %s", errOut)
			}
			if strings.Contains(errOut, testSecret) {
				t.Fatal("a secret was printed")
			}
		})
	}
}
