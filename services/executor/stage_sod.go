package executor

import (
	"context"
	"strings"

	"github.com/mandate-dev/mandate/internal/failure"
)

// sodCheck: separation of duties — a user who executed a conflicting
// command on the same record may not run this one.
func (e *Executor) sodCheck(ctx context.Context, inv *invocation) (*Result, error) {
	sod := inv.cmd.SeparationOfDuties
	if sod == nil {
		return nil, nil
	}
	done, err := e.cfg.Store.Executed(ctx, inv.p.Tenant, inv.p.UserID, sod.ConflictsWith, subjectOf(inv.req, sod.Field))
	if err != nil {
		return nil, e.fault(ctx, inv, StageSoD, failure.CodeSoDUnavailable, err)
	}
	if done {
		return nil, e.refuse(ctx, inv, StageSoD, failure.CodeSoDConflict,
			"the same user may not also run "+strings.Join(sod.ConflictsWith, ", ")+" on this "+sod.Field, "escalate to a different user")
	}
	return nil, nil
}
