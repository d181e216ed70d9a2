package app

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/identity"
)

func run(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Run(context.Background(), args, IO{Stdout: &out, Stderr: &errOut, Env: func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}})
	return code, out.String(), errOut.String()
}

const testSecret = "0123456789abcdef0123456789abcdef-test"

func TestTokenPrintsOnlyAVerifiableToken(t *testing.T) {
	code, out, errOut := run(t, map[string]string{"MANDATE_DEV_SECRET": testSecret},
		"token", "--user", "alice", "--tenant", "acme", "--agent", "support-bot", "--model", "claude", "--model-version", "4.5", "--ttl", "5m")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	tok := strings.TrimSpace(out)
	if strings.Count(out, "\n") != 1 || strings.Count(tok, ".") != 2 {
		t.Fatalf("stdout is not exactly one token: %q", out)
	}
	v, err := identity.NewVerifier(t.Context(), identity.Config{
		Audience: []string{DefaultAudience}, Issuers: []string{DefaultIssuer}, DevSecret: []byte(testSecret),
	})
	if err != nil {
		t.Fatal(err)
	}
	p, err := v.Verify(t.Context(), tok)
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != identity.KindAgent || p.UserID != "alice" || p.AgentID != "support-bot" || p.Tenant != "acme" || p.Model != "claude" || p.ModelVersion != "4.5" {
		t.Fatalf("principal %+v", p)
	}
	if d := time.Until(p.ExpiresAt); d > 5*time.Minute || d < 4*time.Minute {
		t.Fatalf("expires in %v, want 5m", d)
	}
}

func TestTokenRefusesBadSettings(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no secret", nil, []string{"--user", "a", "--tenant", "t"}, "--dev-secret (MANDATE_DEV_SECRET) is required"},
		{"short secret", map[string]string{"MANDATE_DEV_SECRET": "short"}, []string{"--user", "a", "--tenant", "t"}, "must be at least 32 bytes"},
		{"no user", map[string]string{"MANDATE_DEV_SECRET": testSecret}, []string{"--tenant", "t"}, "--user (MANDATE_USER) is required"},
		{"model without agent", map[string]string{"MANDATE_DEV_SECRET": testSecret}, []string{"--user", "a", "--tenant", "t", "--model", "m"}, "only meaningful with --agent"},
		{"bad ttl", map[string]string{"MANDATE_DEV_SECRET": testSecret}, []string{"--user", "a", "--tenant", "t", "--ttl", "-1s"}, "--ttl"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := run(t, tc.env, append([]string{"token"}, tc.args...)...)
			if code == 0 || out != "" {
				t.Fatalf("exit %d, stdout %q", code, out)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Fatalf("stderr %q does not contain %q", errOut, tc.want)
			}
			if strings.Contains(errOut, "short") && tc.name == "short secret" && strings.Contains(errOut, "=short") {
				t.Fatal("the secret value was printed")
			}
		})
	}
}

func TestUnknownCommand(t *testing.T) {
	code, _, errOut := run(t, nil, "frobnicate")
	if code != 2 || !strings.Contains(errOut, `unknown command "frobnicate"`) {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}
