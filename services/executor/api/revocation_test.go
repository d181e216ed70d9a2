package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/audit"
)

// TestRevokedTokenStaysVoid: a token issued before its agent was disabled
// is refused at authenticate after the agent is enabled again
// (principal_inactive, reason credential.revoked), with one refused row;
// a token issued after the revocation runs the same call.
func TestRevokedTokenStaysVoid(t *testing.T) { eachStore(t, testRevokedTokenStaysVoid) }

func testRevokedTokenStaysVoid(t *testing.T, st stores) {
	e := start(t, st)
	ctx := context.Background()
	old := token(t, "acme", "alice", "support-bot")
	if _, err := e.execute(t, as(old), "ticket.search", `{}`); err != nil {
		t.Fatalf("before the revocation: %v", err)
	}
	for _, disabled := range []bool{true, false} {
		if err := directory.SetAgentDisabled(ctx, e.dir, "acme", "support-bot", disabled); err != nil {
			t.Fatal(err)
		}
	}
	_, err := e.execute(t, as(old), "ticket.search", `{}`)
	ce := refusal(err)
	if ce == nil || ce.GetStage() != "authenticate" || ce.GetCode() != "authorization.principal_inactive" ||
		status.Code(err) != codes.PermissionDenied || !strings.Contains(ce.GetMessage(), directory.ReasonCredentialRevoked) {
		t.Fatalf("the revoked token after re-enabling: %v (%v)", err, ce)
	}
	rows := e.rows(t, "acme", ce.GetInvocationId(), 1)
	if len(rows) != 1 || rows[0].Outcome != audit.OutcomeRefused || rows[0].Stage != "authenticate" {
		t.Fatalf("rows of the refusal: %+v", rows)
	}

	res, err := directory.Direct(e.dir).Resolve(ctx, "acme", "alice", "support-bot")
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := identity.MintDev(devSecret, identity.MintRequest{
		Issuer: "test", Audience: "mandate", User: "alice", Tenant: "acme", Agent: "support-bot", Model: "test-model",
		TTL: time.Hour, Now: res.NotBefore(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.execute(t, as(fresh), "ticket.search", `{}`); err != nil {
		t.Fatalf("a token issued after the revocation: %v", err)
	}
}
