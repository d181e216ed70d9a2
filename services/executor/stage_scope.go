package executor

import (
	"context"

	"github.com/mandate-dev/mandate/internal/failure"
)

// scopeCheck: the call is bound to the principal's tenant.
func (e *Executor) scopeCheck(ctx context.Context, inv *invocation) (*Result, error) {
	if inv.call.Tenant != "" && inv.call.Tenant != inv.p.Tenant {
		return nil, e.refuse(ctx, inv, StageScope, failure.CodeScopeTenantMismatch, "the call names another tenant", "not retriable")
	}
	return nil, nil
}
