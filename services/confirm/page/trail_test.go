package page_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/services/confirm/page"
)

// TestTrailPageNeedsAnAuditService: without an audit service there is no
// trail page (404, and no link to it), and one with an audit service but
// no token audience is refused at construction. The page over a real
// audit service is tested in internal/app (TestTrailPage*).
func TestTrailPageNeedsAnAuditService(t *testing.T) {
	f := newFixture(t, nil)
	if r := do(t, browser(t), http.MethodGet, f.srv.URL+page.TrailPath, nil, nil); r.status != http.StatusUnauthorized || !strings.Contains(r.body, "Sign in with your link") {
		t.Fatalf("without a session: %d %s", r.status, r.body)
	}
	alice, _ := f.signIn(t, "alice", "acme")
	if r := do(t, alice, http.MethodGet, f.srv.URL+page.TrailPath, nil, nil); r.status != http.StatusNotFound || !strings.Contains(r.body, "no audit trail page") {
		t.Fatalf("without an audit service: %d %s", r.status, r.body)
	}
	if r := do(t, alice, http.MethodGet, f.srv.URL+page.Pattern, nil, nil); strings.Contains(r.body, "trail-link") {
		t.Fatal("the inbox links a trail page that is not there")
	}
	_, err := page.New(page.Config{
		Confirm: f.confirm, Sessions: f.store, Directory: directory.Direct(dirmem.New()), LoginSecret: devSecret, Issuers: []string{issuer},
		Logger: slog.New(slog.DiscardHandler), Audit: mandatev1.NewAuditServiceClient(nil),
	})
	if err == nil || !strings.Contains(err.Error(), "TokenAudience") {
		t.Fatalf("an audit service without a token audience: %v", err)
	}
}
