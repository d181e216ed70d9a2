package identity

import (
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
)

// Stage is the pipeline stage (mandate.v1.Stage; docs/architecture/pipeline.md) every identity refusal belongs to,
// so clients can tell "who are you" failures from later refusals.
const Stage = failure.StageAuthenticate

// ErrorDomain is the google.rpc.ErrorInfo domain shared by all Mandate
// refusals; reason alone is only unique within it.
const ErrorDomain = "mandate.dev"

// Error is an authentication refusal. Code is stable and machine-readable;
// Reason is a short human explanation that never contains the token, a
// claim value or key material, so it is safe to return to the caller.
type Error struct {
	// Code is one of the failure.CodeAuthentication* constants.
	Code string
	// Reason explains the refusal to a human.
	Reason string

	// cause keeps the underlying library or network error for operators'
	// logs (errors.Unwrap); it is deliberately left out of Error().
	cause error
}

func newError(code, reason string, cause error) *Error {
	return &Error{Code: code, Reason: reason, cause: cause}
}

// Error returns "code: reason" and never the wrapped cause, which may
// mention internal URLs.
func (e *Error) Error() string { return e.Code + ": " + e.Reason }

// Unwrap exposes the underlying cause for logging and errors.Is.
func (e *Error) Unwrap() error { return e.cause }

// Is makes errors.Is(err, &Error{Code: c}) match any refusal with code c,
// which is how callers test for a class of refusal without string compares.
func (e *Error) Is(target error) bool {
	var t *Error
	if !errors.As(target, &t) || t == nil {
		return false
	}
	return t.Code == e.Code && (t.Reason == "" || t.Reason == e.Reason)
}

// GRPCStatus maps the refusal to codes.Unauthenticated with a
// google.rpc.ErrorInfo and a mandate.v1.CommandError detail. Implementing
// this method lets status.FromError map a (wrapped) *Error anywhere, so the
// mapping lives in exactly one place.
func (e *Error) GRPCStatus() *status.Status {
	st := status.New(codes.Unauthenticated, e.Error())
	withDetails, err := st.WithDetails(
		&errdetails.ErrorInfo{
			Reason:   e.Code,
			Domain:   ErrorDomain,
			Metadata: map[string]string{"stage": Stage},
		},
		&mandatev1.CommandError{
			Stage:   Stage,
			Code:    e.Code,
			Message: e.Reason,
			Remedy:  remedy(e.Code),
		},
	)
	if err != nil {
		// Only fails if a detail cannot be marshalled, which would be a
		// programming error; the bare status is still correct.
		return st
	}
	return withDetails
}

// remedy tells an agent what to do next, as docs/architecture/pipeline.md asks every refusal
// to: the table's remedy of the code.
func remedy(code string) string {
	if s, ok := failure.Lookup(code); ok {
		return s.Remedy
	}
	return "re-authenticate"
}

// ErrorCode returns the stable code of an identity refusal anywhere in err's
// chain, or "" when err is not one, so callers need no type assertion.
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// asError makes sure whatever reaches a client is an *Error with a code;
// anything else is an internal bug and must not leak its text.
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return newError(failure.CodeAuthenticationInvalidToken, "token could not be verified", err)
}
