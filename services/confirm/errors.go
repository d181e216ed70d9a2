package confirm

import "errors"

// Stable refusal codes. Clients — often agents — branch on them, so they are
// part of the API and never change meaning.
const (
	// CodeNotFound: no challenge with this id is visible to the caller (it
	// does not exist, belongs to another tenant, or the caller may neither
	// read nor decide it).
	CodeNotFound = "confirmation.not_found"
	// CodeApproverNotAllowed: the caller may not decide this challenge
	// (agents never approve; the approver policy names someone else).
	CodeApproverNotAllowed = "confirmation.approver_not_allowed"
	// CodeAlreadyDecided: the challenge was approved or declined before.
	CodeAlreadyDecided = "confirmation.already_decided"
	// CodeExpired: nobody decided in time, or the grant was not redeemed in
	// time.
	CodeExpired = "confirmation.expired"
	// CodeAlreadyRedeemed: the grant was used by its invocation already.
	CodeAlreadyRedeemed = "confirmation.already_redeemed"
	// CodeGrantMismatch: the grant was given for another invocation (other
	// arguments, principal or idempotency key).
	CodeGrantMismatch = "confirmation.grant_mismatch"
	// CodeRefused: the human declined.
	CodeRefused = "confirmation.refused"
	// CodePending: nobody has decided yet.
	CodePending = "confirmation.pending"
	// CodeUnavailable: the store could not be reached; retrying may help.
	CodeUnavailable = "confirmation.unavailable"
	// CodeInvalid: the request breaks a rule; the message names the field.
	CodeInvalid = "schema.invalid"
	// CodePermissionDenied: the caller may not use this operation at all
	// (e.g. a user opening a challenge directly), or the requester lacks a
	// permission the command needs.
	CodePermissionDenied = "authorization.permission_denied"
	// CodePrincipalInactive: the directory says the caller is not active
	// (unknown or disabled user, unregistered or disabled agent).
	CodePrincipalInactive = "authorization.principal_inactive"
	// CodeCommandNotFound: the manifest has no published command with this
	// code.
	CodeCommandNotFound = "command.not_found"
	// CodeLoginTokenUsed: a one-time sign-in token was presented twice.
	CodeLoginTokenUsed = "authentication.login_token_used"
)

// Error is a refusal with a stable code and a client-safe message. Two
// errors match (errors.Is) when their codes are equal, so callers compare
// against the sentinels below whatever the message says.
type Error struct {
	// Code is one of the Code* constants.
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
	ErrNotFound           = &Error{Code: CodeNotFound, Message: "no such challenge"}
	ErrApproverNotAllowed = &Error{Code: CodeApproverNotAllowed, Message: "the caller may not decide this challenge"}
	ErrAlreadyDecided     = &Error{Code: CodeAlreadyDecided, Message: "the challenge was already decided"}
	ErrExpired            = &Error{Code: CodeExpired, Message: "the challenge expired before it was decided or used; ask again"}
	ErrAlreadyRedeemed    = &Error{Code: CodeAlreadyRedeemed, Message: "the grant was already used; an approval is good for one call"}
	ErrGrantMismatch      = &Error{Code: CodeGrantMismatch, Message: "the grant was given for another invocation (other arguments, principal or idempotency key); consent does not carry over"}
	ErrRefused            = &Error{Code: CodeRefused, Message: "the approver declined the call"}
	ErrPending            = &Error{Code: CodePending, Message: "nobody has decided yet; wait for the approver"}
	ErrUnavailable        = &Error{Code: CodeUnavailable, Message: "the confirmation store is unavailable"}
	ErrInvalid            = &Error{Code: CodeInvalid, Message: "invalid request"}
	ErrPermissionDenied   = &Error{Code: CodePermissionDenied, Message: "permission denied"}
	ErrPrincipalInactive  = &Error{Code: CodePrincipalInactive, Message: "the principal is not active"}
	ErrCommandNotFound    = &Error{Code: CodeCommandNotFound, Message: "no such command"}
	ErrLoginTokenUsed     = &Error{Code: CodeLoginTokenUsed, Message: "the sign-in link was already used"}
)

// refuse returns an error matching base with a specific message.
func refuse(base *Error, message string) *Error { return &Error{Code: base.Code, Message: message} }

// Invalid reports a field that breaks a rule.
func Invalid(field, reason string) error { return refuse(ErrInvalid, field+": "+reason) }

// Unavailable wraps a store failure: the message is generic, cause is kept
// for operators' logs (errors.Unwrap) and never shown to clients.
func Unavailable(op string, cause error) error {
	return &Error{Code: CodeUnavailable, Message: op + ": the confirmation store is unavailable", cause: cause}
}
