package executor

import (
	"context"
	"strings"

	"github.com/mandate-dev/mandate/internal/failure"
)

// permissionCheck: the caller's user holds every permission the command
// declares. It runs before the arguments are parsed, so a caller who may
// not run a command learns nothing about its schema, and before any human
// is asked.
func (e *Executor) permissionCheck(ctx context.Context, inv *invocation) (*Result, error) {
	var missing []string
	for _, perm := range inv.cmd.Permissions {
		if !inv.res.HasPermission(perm) {
			missing = append(missing, perm)
		}
	}
	if len(missing) > 0 {
		return nil, e.refuse(ctx, inv, StagePermission, failure.CodeAuthorizationPermissionDenied,
			"the caller lacks "+strings.Join(missing, ", "), "escalate to a user who holds "+strings.Join(missing, ", "))
	}
	return nil, nil
}
