package executor

import "context"

// requestCheck: the attributes the caller sent besides the arguments
// (checkRequest).
func (e *Executor) requestCheck(ctx context.Context, inv *invocation) (*Result, error) {
	if fe := e.checkRequest(inv); fe != nil {
		return nil, e.refuseWith(ctx, inv, fe)
	}
	return nil, nil
}
