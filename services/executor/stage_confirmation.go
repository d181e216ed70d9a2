package executor

import "context"

// confirmationCheck asks a human where the declaration (or the
// deployment, for side effects) says so: it opens a challenge, or redeems
// the grant the call carries (confirm).
func (e *Executor) confirmationCheck(ctx context.Context, inv *invocation) (*Result, error) {
	if !inv.cmd.ConfirmationRequired && (!e.cfg.ConfirmSideEffects || len(inv.cmd.SideEffects) == 0) {
		return nil, nil
	}
	return nil, e.confirm(ctx, inv, inv.canon)
}
