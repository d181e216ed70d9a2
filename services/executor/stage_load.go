package executor

import (
	"context"

	"github.com/mandate-dev/mandate/internal/failure"
)

// loadDefinition: only a published command of the manifest runs.
func (e *Executor) loadDefinition(ctx context.Context, inv *invocation) (*Result, error) {
	cmd, ok := e.cfg.Manifest.ByCode(inv.call.Code)
	if !ok || !cmd.Published() {
		return nil, e.refuse(ctx, inv, StageLoad, failure.CodeCommandNotFound, "no published command has this code", "pick another tool")
	}
	inv.cmd = cmd
	inv.method, _ = e.cfg.Manifest.Method(cmd.Code)
	return nil, nil
}
