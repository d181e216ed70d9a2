package audit

import (
	"errors"
	"strconv"
)

// Errors returned (wrapped) by the Writer and by Store implementations. The transport layer
// maps them to gRPC codes and problem types in one place; none of them carries driver text.
var (
	// ErrInvalid reports a record or filter that breaks a rule; the message names the field.
	// Not retriable.
	ErrInvalid = errors.New("audit: invalid")
	// ErrUnavailable reports that the store could not be reached; nothing was written by the
	// failed call and retrying later may succeed. An append that fails with it may be retried
	// with the same records: appends are idempotent.
	ErrUnavailable = errors.New("audit: store unavailable")
	// ErrConflict reports that a concurrent writer (another replica) got in the way and the
	// store gave up retrying; retrying may succeed.
	ErrConflict = errors.New("audit: concurrent write conflict")
	// ErrNotFound reports that no row matches (Get).
	ErrNotFound = errors.New("audit: not found")
	// ErrInvalidPageToken reports a page token that is malformed or was issued for another
	// filter.
	ErrInvalidPageToken = errors.New("audit: invalid page token")
	// ErrClosed reports a call on a closed Writer or Store.
	ErrClosed = errors.New("audit: closed")
)

// ValidationError says which field of a record or filter is wrong and why. It matches
// [ErrInvalid].
type ValidationError struct {
	// Field is the snake_case name of the offending field.
	Field string
	// Reason says what is wrong, e.g. "is required".
	Reason string
}

func (e *ValidationError) Error() string { return "audit: invalid " + e.Field + ": " + e.Reason }

// Is makes errors.Is(err, ErrInvalid) hold.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

func invalid(field, reason string) error { return &ValidationError{Field: field, Reason: reason} }

// Retryable reports whether an append that failed with err may succeed when repeated with the
// same records (the store was unavailable or a concurrent writer interfered).
func Retryable(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrConflict)
}

func itoa(n int) string { return strconv.Itoa(n) }
