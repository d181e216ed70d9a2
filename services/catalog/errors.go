package catalog

import (
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// Pipeline stages (DESIGN §5) the catalog refuses at.
const (
	// StageAuthenticate refuses a caller the directory does not know as active.
	StageAuthenticate = identity.Stage
	// StageLoad refuses a command that does not exist for the caller.
	StageLoad = "load_definition"
	// StagePermission refuses a caller lacking a permission.
	StagePermission = "permission_check"
	// StageScope refuses a review that did not come through a Mandate service.
	StageScope = "scope_check"
)

// Stable refusal codes. Clients, often agents, branch on them.
const (
	// CodeCommandNotFound: no published command with this code is visible to
	// the caller (it does not exist, is a draft, or the caller may not run it).
	CodeCommandNotFound = "command.not_found"
	// CodePermissionDenied: the caller lacks a permission the operation needs.
	CodePermissionDenied = "authorization.permission_denied"
	// CodePrincipalInactive: the directory says the caller may do nothing.
	CodePrincipalInactive = "authorization.principal_inactive"
	// CodeNotViaExecutor: ops.review was called directly instead of through
	// the executor.
	CodeNotViaExecutor = "scope.not_via_executor"
	// CodeDirectoryUnavailable: the directory could not be read; retrying may
	// help.
	CodeDirectoryUnavailable = "directory.unavailable"
)

func notFound() *failure.Error {
	e := failure.New(StageLoad, CodeCommandNotFound, "no published command with this code is visible to the caller")
	e.Remedy = "pick another tool"
	return e
}

func permissionDenied(perm, what string) *failure.Error {
	e := failure.New(StagePermission, CodePermissionDenied, what+" needs "+perm)
	e.Remedy = "escalate to a user who holds " + perm
	return e
}

func notViaExecutor() *failure.Error {
	e := failure.New(StageScope, CodeNotViaExecutor, "ops.review is a governed command; call it through the executor")
	e.Remedy = "call ops.review through the executor"
	return e
}

func inactive(reason string) *failure.Error {
	e := failure.New(StageAuthenticate, CodePrincipalInactive, "the principal is not active ("+reason+")")
	e.Remedy = "ask an administrator"
	return e
}

func directoryUnavailable(cause error) *failure.Error {
	e := failure.Wrap(StageAuthenticate, CodeDirectoryUnavailable, "the directory is unavailable", cause)
	e.Retriable, e.Remedy = true, "retry later"
	return e
}
