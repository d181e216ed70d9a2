package executor

import (
	"strings"

	"github.com/mandate-dev/mandate/internal/failure"
)

// ServiceName is the executor's service identity.
const ServiceName = "executor"

// confirmError keeps a refusal of the confirm service (its code, message,
// retriability and remedy) under stage confirmation_check. Anything else
// (the service unreachable, an internal fault, a transport error) is
// returned as it is: a fault, reported by the pipeline as
// confirmation.unavailable.
func confirmError(err error) error {
	if err == nil {
		return nil
	}
	p := failure.Problem(failure.ToStatus(err), "")
	if p.Code == "" || p.Code == "internal.error" || p.Code == failure.CodeServiceUnavailable || strings.HasPrefix(p.Code, "grpc.") {
		return err
	}
	fe := failure.New(StageConfirmation, p.Code, p.Detail)
	fe.Retriable, fe.Remedy = p.Retriable, p.Remedy
	return fe
}
