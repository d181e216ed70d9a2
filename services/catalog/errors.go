package catalog

import (
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// Pipeline stages (mandate.v1.Stage; docs/architecture/pipeline.md) the catalog refuses at.
const (
	// StageAuthenticate refuses a caller the directory does not know as active.
	StageAuthenticate = identity.Stage
	// StageLoad refuses a command that does not exist for the caller.
	StageLoad = failure.StageLoad
	// StagePermission refuses a caller lacking a permission.
	StagePermission = failure.StagePermission
	// StageScope refuses a review that did not come through a Mandate service.
	StageScope = failure.StageScope
)

// The catalog refuses with failure.CodeCommandNotFound,
// CodeAuthorizationPermissionDenied, CodeAuthorizationPrincipalInactive,
// CodeScopeNotViaExecutor and CodeDirectoryUnavailable.

func notFound() *failure.Error {
	e := failure.New(StageLoad, failure.CodeCommandNotFound, "no published command with this code is visible to the caller")
	e.Remedy = "pick another tool"
	return e
}

func permissionDenied(perm, what string) *failure.Error {
	e := failure.New(StagePermission, failure.CodeAuthorizationPermissionDenied, what+" needs "+perm)
	e.Remedy = "escalate to a user who holds " + perm
	return e
}

func notViaExecutor() *failure.Error {
	e := failure.New(StageScope, failure.CodeScopeNotViaExecutor, "ops.review is a governed command; call it through the executor")
	e.Remedy = "call ops.review through the executor"
	return e
}

func inactive(reason string) *failure.Error {
	e := failure.New(StageAuthenticate, failure.CodeAuthorizationPrincipalInactive, "the principal is not active ("+reason+")")
	e.Remedy = "ask an administrator"
	return e
}

func directoryUnavailable(cause error) *failure.Error {
	e := failure.Wrap(StageAuthenticate, failure.CodeDirectoryUnavailable, "the directory is unavailable", cause)
	e.Retriable, e.Remedy = true, "retry later"
	return e
}
