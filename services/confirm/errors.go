package confirm

import (
	"errors"

	"github.com/mandate-dev/mandate/internal/failure"
)

// Error is a refusal with a stable code and a client-safe message. Two
// errors match (errors.Is) when their codes are equal, so callers compare
// against the sentinels below whatever the message says.
type Error struct {
	// Code is one of the failure.CodeConfirmation* codes, or
	// failure.CodeSchemaInvalid, CodeAuthorizationPermissionDenied,
	// CodeAuthorizationPrincipalInactive, CodeCommandNotFound or
	// CodeAuthenticationLoginTokenUsed.
	Code string
	// Message explains the refusal to a human; it never carries driver text,
	// argument values or secrets.
	Message string
	cause   error
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Unwrap returns the internal cause (for logs), if any.
func (e *Error) Unwrap() error { return e.cause }

// Is matches any *Error with the same code.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t != nil && t.Code == e.Code
}

// Sentinels for errors.Is. Returned errors carry more specific messages.
var (
	ErrNotFound           = &Error{Code: failure.CodeConfirmationNotFound, Message: "no such challenge"}
	ErrApproverNotAllowed = &Error{Code: failure.CodeConfirmationApproverNotAllowed, Message: "the caller may not decide this challenge"}
	ErrAlreadyDecided     = &Error{Code: failure.CodeConfirmationAlreadyDecided, Message: "the challenge was already decided"}
	ErrExpired            = &Error{Code: failure.CodeConfirmationExpired, Message: "the challenge expired before it was decided or used; ask again"}
	ErrAlreadyRedeemed    = &Error{Code: failure.CodeConfirmationAlreadyRedeemed, Message: "the grant was already used; an approval is good for one call"}
	ErrGrantMismatch      = &Error{Code: failure.CodeConfirmationGrantMismatch, Message: "the grant was given for another invocation (other arguments, principal or idempotency key); consent does not carry over"}
	ErrDeclarationChanged = &Error{Code: failure.CodeConfirmationDeclarationChanged, Message: "the command's declaration changed since the approval; an approval holds for the declaration it was given under — ask again"}
	ErrRevoked            = &Error{Code: failure.CodeConfirmationRevoked, Message: "the call was asked for before its user's or agent's access was last revoked; ask again"}
	ErrTooManyOpen        = &Error{Code: failure.CodeConfirmationTooManyOpen, Message: "too many approvals requested by this caller are still waiting"}
	ErrRefused            = &Error{Code: failure.CodeConfirmationRefused, Message: "the approver declined the call"}
	ErrPending            = &Error{Code: failure.CodeConfirmationPending, Message: "nobody has decided yet; wait for the approver"}
	ErrUnavailable        = &Error{Code: failure.CodeConfirmationUnavailable, Message: "the confirmation store is unavailable"}
	ErrInvalid            = &Error{Code: failure.CodeSchemaInvalid, Message: "invalid request"}
	ErrPermissionDenied   = &Error{Code: failure.CodeAuthorizationPermissionDenied, Message: "permission denied"}
	ErrPrincipalInactive  = &Error{Code: failure.CodeAuthorizationPrincipalInactive, Message: "the principal is not active"}
	ErrCommandNotFound    = &Error{Code: failure.CodeCommandNotFound, Message: "no such command"}
	ErrLoginTokenUsed     = &Error{Code: failure.CodeAuthenticationLoginTokenUsed, Message: "the sign-in link was already used"}
)

// refuse returns an error matching base with a specific message.
func refuse(base *Error, message string) *Error { return &Error{Code: base.Code, Message: message} }

// Invalid reports a field that breaks a rule.
func Invalid(field, reason string) error { return refuse(ErrInvalid, field+": "+reason) }

// Unavailable wraps a store failure: the message is generic, cause is kept
// for operators' logs (errors.Unwrap) and never shown to clients.
func Unavailable(op string, cause error) error {
	return &Error{Code: failure.CodeConfirmationUnavailable, Message: op + ": the confirmation store is unavailable", cause: cause}
}
