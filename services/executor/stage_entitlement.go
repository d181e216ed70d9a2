package executor

import (
	"context"

	"github.com/mandate-dev/mandate/internal/failure"
)

// entitlementCheck: the tenant holds the command's required feature.
func (e *Executor) entitlementCheck(ctx context.Context, inv *invocation) (*Result, error) {
	if f := inv.cmd.RequiredFeature; f != "" && !inv.res.HasFeature(f) {
		return nil, e.refuse(ctx, inv, StageEntitlement, failure.CodeEntitlementMissing, "the tenant is not entitled to "+f, "this command is not available to the tenant")
	}
	return nil, nil
}
