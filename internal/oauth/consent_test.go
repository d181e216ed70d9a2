package oauth_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/directory"
)

// admitted verifies an access token and asks the directory about it the
// way every Mandate service does (Resolve, then Admit the token's iat).
func admitted(t *testing.T, h *harness, token string) directory.Resolution {
	t.Helper()
	p, err := h.verifier.Verify(context.Background(), token)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	res, err := directory.Resolve(context.Background(), h.dir, p.Tenant, p.UserID, p.AgentID)
	if err != nil {
		t.Fatal(err)
	}
	return res.Admit(p.IssuedAt)
}

// TestConsentOptIn: an app connected over OAuth is headless — its own
// answers to confirmation forms are not its user's — unless the user ticks
// the opt-in on the consent page, whose words name the trust ceiling and
// the approval page; each consent decides again.
func TestConsentOptIn(t *testing.T) {
	h := newHarness(t)
	client := h.register("Claude Code", cb)
	verifier, challenge := pkce("optin")
	b := h.browser()
	consent := b.signIn(b.start(authParams(client, cb, challenge, "st")), "carol")
	for _, words := range []string{
		`name="attest" value="yes"`, // unticked: no checked attribute
		"This app asks me in its own window, and my answer there counts as mine — for commands up to risk L2.",
		"Mandate asks you on its own approval page, where you sign in yourself. The application cannot answer for you there.",
		"Commands above L2, and anything another person must approve, are still approved only on Mandate's approval page, signed in.",
	} {
		if !strings.Contains(consent.body, words) {
			t.Errorf("the consent page does not say %q", words)
		}
	}
	for _, lie := range []string{"checked", "still ask you"} {
		if strings.Contains(consent.body, lie) {
			t.Errorf("the consent page says %q", lie)
		}
	}

	host := func(extra ...string) (directory.AgentHost, directory.Resolution) {
		t.Helper()
		_, tok := h.exchange(client, h.authorizeAs("carol", client, cb, challenge, extra...), cb, verifier)
		res := admitted(t, h, tok["access_token"].(string))
		for _, a := range snapshot(t, h).Agents {
			if a.ID == res.AgentID {
				return a.Host, res
			}
		}
		t.Fatalf("no agent %s", res.AgentID)
		return "", res
	}
	if got, res := host(); got != directory.HostHeadless || res.Interactive {
		t.Fatalf("without the opt-in: host %q interactive %v", got, res.Interactive)
	}
	if got, res := host("attest", "yes"); got != directory.HostInteractive || !res.Interactive || res.TrustCeiling != "L2" {
		t.Fatalf("with the opt-in: host %q interactive %v ceiling %q", got, res.Interactive, res.TrustCeiling)
	}
	if got, _ := host("attest", "on"); got != directory.HostHeadless {
		t.Fatalf("a forged opt-in value counted: host %q", got)
	}
}

// TestRevocationVoidsOldTokens: a token of a revoked app stays void after
// the user authorizes the same app again; the new token works. A replayed
// authorization code revokes the app, so the token its first exchange
// bought is void too.
func TestRevocationVoidsOldTokens(t *testing.T) {
	h := newHarness(t)
	client := h.register("returning app", cb)
	verifier, challenge := pkce("again")
	_, first := h.exchange(client, h.authorizeAs("carol", client, cb, challenge), cb, verifier)
	old := first["access_token"].(string)
	if res := admitted(t, h, old); !res.Active {
		t.Fatalf("fresh token: %+v", res)
	}
	if status, _ := h.postForm("/revoke", url.Values{"token": {first["refresh_token"].(string)}, "client_id": {client}}); status != http.StatusOK {
		t.Fatalf("revoke: %d", status)
	}
	_, second := h.exchange(client, h.authorizeAs("carol", client, cb, challenge), cb, verifier)
	if res := admitted(t, h, second["access_token"].(string)); !res.Active {
		t.Fatalf("the token of the new authorization: %+v", res)
	}
	if res := admitted(t, h, old); res.Active || res.Reason != directory.ReasonCredentialRevoked {
		t.Fatalf("the revoked token works again after re-authorizing: %+v", res)
	}

	code := h.authorizeAs("carol", client, cb, challenge)
	status, bought := h.exchange(client, code, cb, verifier)
	if status != http.StatusOK {
		t.Fatalf("exchange: %d %v", status, bought)
	}
	if status, _ := h.exchange(client, code, cb, verifier); status != http.StatusBadRequest {
		t.Fatalf("replayed code: %d", status)
	}
	if res := admitted(t, h, bought["access_token"].(string)); res.Active {
		t.Fatalf("the token a replayed code bought still works: %+v", res)
	}
}
