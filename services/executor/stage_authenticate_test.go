package executor

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// TestStageAuthenticate runs authenticate alone. An active user, or an
// agent acting for its user, is handed on with the principal and the
// directory's resolution (the user's permissions, the tenant's features);
// a call with no principal, or none with a user and a tenant, is refused
// as missing credentials; a disabled user, an agent not registered, of
// another user or disabled, and a token issued before a revocation are
// refused as inactive, naming the reason; a directory that cannot be
// reached is a fault.
func TestStageAuthenticate(t *testing.T) {
	search := Call{Code: "ticket.search", Input: []byte(searchArgs), Channel: "grpc"}

	t.Run("active user", func(t *testing.T) {
		h := newStageHarness(t)
		inv := h.invocation(search)
		h.passes(t, callAs(t, testPrincipal("acme", "carol", "")), inv, StageAuthenticate)
		if inv.p.Tenant != "acme" || inv.p.UserID != "carol" || inv.p.AgentID != "" {
			t.Errorf("principal %+v, want carol of acme", inv.p)
		}
		if !inv.res.Active || !inv.res.HasPermission("payment.refund") || !inv.res.HasFeature("refunds") {
			t.Errorf("resolution %+v, want active with carol's permissions and acme's features", inv.res)
		}
	})

	t.Run("agent acting for its user", func(t *testing.T) {
		h := newStageHarness(t)
		inv := h.invocation(search)
		h.passes(t, callAs(t, testPrincipal("acme", "alice", "support-bot")), inv, StageAuthenticate)
		if inv.p.AgentID != "support-bot" || inv.p.Kind != identity.KindAgent {
			t.Errorf("principal %+v, want support-bot acting for alice", inv.p)
		}
		// An agent holds exactly its user's permissions.
		if !inv.res.Active || !inv.res.HasPermission("ticket.read") || inv.res.HasPermission("payment.refund") {
			t.Errorf("resolution %+v, want alice's permissions", inv.res)
		}
	})

	inactive := func(reason string) func(*testing.T, *stageHarness, *invocation, *failure.Error) {
		return func(t *testing.T, _ *stageHarness, inv *invocation, fe *failure.Error) {
			if !strings.Contains(fe.Message, reason) || inv.res.Reason != reason {
				t.Errorf("refused with %q (resolution reason %q), want the reason %s", fe.Message, inv.res.Reason, reason)
			}
		}
	}
	stageRefuses(t, StageAuthenticate, []stageRefusal{
		{name: "no principal", anonymous: true, call: search,
			stage: StageAuthenticate, code: failure.CodeAuthenticationMissingCredentials},
		{name: "principal without a tenant", p: identity.Principal{Kind: identity.KindUser, UserID: "alice"}, call: search,
			stage: StageAuthenticate, code: failure.CodeAuthenticationMissingCredentials},
		{name: "principal without a user", p: identity.Principal{Kind: identity.KindService, Tenant: "acme", ServiceName: "catalog"}, call: search,
			stage: StageAuthenticate, code: failure.CodeAuthenticationMissingCredentials},
		{name: "disabled user", p: testPrincipal("acme", "olga", ""), call: search,
			stage: StageAuthenticate, code: failure.CodeAuthorizationPrincipalInactive, check: inactive(directory.ReasonUserDisabled)},
		{name: "unknown user", p: testPrincipal("acme", "mallory", ""), call: search,
			stage: StageAuthenticate, code: failure.CodeAuthorizationPrincipalInactive, check: inactive(directory.ReasonUserUnknown)},
		{name: "agent not registered", p: testPrincipal("acme", "alice", "rogue-bot"), call: search,
			stage: StageAuthenticate, code: failure.CodeAuthorizationPrincipalInactive, check: inactive(directory.ReasonAgentNotRegistered)},
		{name: "agent of another user", p: testPrincipal("acme", "alice", "finance-bot"), call: search,
			stage: StageAuthenticate, code: failure.CodeAuthorizationPrincipalInactive, check: inactive(directory.ReasonAgentWrongUser)},
		{name: "disabled agent", p: testPrincipal("acme", "alice", "retired-bot"), call: search,
			stage: StageAuthenticate, code: failure.CodeAuthorizationPrincipalInactive, check: inactive(directory.ReasonAgentDisabled)},
		{name: "token issued before a revocation",
			p: func() identity.Principal {
				p := testPrincipal("acme", "alice", "")
				p.IssuedAt = time.Now().Add(-time.Hour)
				return p
			}(),
			call: search,
			arrange: func(h *stageHarness) {
				h.dir.mu.Lock()
				defer h.dir.mu.Unlock()
				// alice was disabled and enabled again a minute ago.
				h.dir.with = func(r directory.Resolution) directory.Resolution {
					r.RevokedAt = time.Now().Add(-time.Minute)
					return r
				}
			},
			stage: StageAuthenticate, code: failure.CodeAuthorizationPrincipalInactive, check: inactive(directory.ReasonCredentialRevoked)},
		{name: "directory unreachable", p: testPrincipal("acme", "alice", ""), call: search,
			arrange: func(h *stageHarness) {
				h.dir.mu.Lock()
				defer h.dir.mu.Unlock()
				h.dir.err = errors.New("connection refused")
			},
			stage: StageAuthenticate, code: failure.CodeDirectoryUnavailable, failed: true,
			check: func(t *testing.T, _ *stageHarness, _ *invocation, fe *failure.Error) {
				if strings.Contains(fe.Message, "connection refused") {
					t.Errorf("the fault shows its cause to the caller: %q", fe.Message)
				}
			}},
	})
}
