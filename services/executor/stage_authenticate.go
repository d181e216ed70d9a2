package executor

import (
	"context"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// authenticate: the transport verified the token; the directory says
// whether the principal is still active, and whether the token was issued
// before its user or agent was last disabled.
func (e *Executor) authenticate(ctx context.Context, inv *invocation) (*Result, error) {
	p, ok := identity.FromContext(ctx)
	if !ok || p.UserID == "" || p.Tenant == "" {
		return nil, e.refuse(ctx, inv, StageAuthenticate, failure.CodeAuthenticationMissingCredentials, "a user or an agent acting for a user must call", "authenticate as a user, or as an agent acting for one")
	}
	inv.p = p
	if err := e.stage(ctx, StageAuthenticate, func(ctx context.Context) error {
		var err error
		inv.res, err = e.cfg.Directory.Resolve(ctx, p.Tenant, p.UserID, p.AgentID)
		inv.res = inv.res.Admit(p.IssuedAt)
		return err
	}); err != nil {
		return nil, e.fault(ctx, inv, StageAuthenticate, failure.CodeDirectoryUnavailable, err)
	}
	if !inv.res.Active {
		return nil, e.refuse(ctx, inv, StageAuthenticate, failure.CodeAuthorizationPrincipalInactive, "the principal is not active ("+inv.res.Reason+")", "ask an administrator")
	}
	return nil, nil
}
