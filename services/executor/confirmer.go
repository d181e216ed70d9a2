package executor

import (
	"github.com/mandate-dev/mandate/internal/failure"
)

// ServiceName is the executor's service identity.
const ServiceName = "executor"

// confirmError keeps a refusal of the confirm service (its code, message,
// retriability and remedy) under stage confirmation_check. Anything else
// (the service unreachable, an internal fault, a transport error: a status
// without a Mandate code) is returned as it is: a fault, reported by the
// pipeline as confirmation.unavailable.
func confirmError(err error) error {
	if err == nil {
		return nil
	}
	st := failure.ToStatus(err)
	if !failure.CarriesCode(st) {
		return err
	}
	p := failure.Problem(st, "")
	if p.Code == "" || p.Code == failure.CodeInternalError || p.Code == failure.CodeServiceUnavailable {
		return err
	}
	fe := failure.New(StageConfirmation, p.Code, p.Detail)
	fe.Retriable, fe.Remedy = p.Retriable, p.Remedy
	return fe
}
