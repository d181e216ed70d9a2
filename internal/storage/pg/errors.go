package pg

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Sentinel errors that storage implementations return (wrapped with %w) so that callers can
// decide with errors.Is without knowing about Postgres.
var (
	// ErrNotFound reports that the addressed row does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict reports that the change collides with existing data or with a concurrent
	// transaction (unique, foreign-key or check violation, serialization failure, deadlock).
	ErrConflict = errors.New("conflict")
	// ErrUnavailable reports that the database could not be reached or went away; the operation
	// may succeed if retried later.
	ErrUnavailable = errors.New("storage unavailable")
)

// Kind is the class of a database error, derived from its SQLSTATE or from the driver's error type.
type Kind int

// Kinds returned by [Classify].
const (
	// KindNone is the kind of a nil error.
	KindNone Kind = iota
	// KindOther is any error that none of the other kinds describes.
	KindOther
	// KindNotFound is pgx.ErrNoRows.
	KindNotFound
	// KindUniqueViolation is SQLSTATE 23505.
	KindUniqueViolation
	// KindForeignKeyViolation is SQLSTATE 23503.
	KindForeignKeyViolation
	// KindCheckViolation is SQLSTATE 23514.
	KindCheckViolation
	// KindSerializationFailure is SQLSTATE 40001.
	KindSerializationFailure
	// KindDeadlockDetected is SQLSTATE 40P01.
	KindDeadlockDetected
	// KindUnavailable covers connection failures: dial and I/O errors, a closed connection,
	// SQLSTATE class 08 (connection exception), 57P01–57P03 (shutdown, cannot connect now) and
	// 53300 (too many connections).
	KindUnavailable
	// KindCanceled is a context cancellation or deadline.
	KindCanceled
)

var kindNames = [...]string{
	KindNone:                 "none",
	KindOther:                "other",
	KindNotFound:             "not_found",
	KindUniqueViolation:      "unique_violation",
	KindForeignKeyViolation:  "foreign_key_violation",
	KindCheckViolation:       "check_violation",
	KindSerializationFailure: "serialization_failure",
	KindDeadlockDetected:     "deadlock_detected",
	KindUnavailable:          "unavailable",
	KindCanceled:             "canceled",
}

// String returns the snake_case name of the kind.
func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Retryable reports whether a transaction that failed with this kind may succeed when re-run
// from the start.
func (k Kind) Retryable() bool {
	return k == KindSerializationFailure || k == KindDeadlockDetected
}

// SQLSTATE codes that Classify distinguishes.
const (
	codeUniqueViolation      = "23505"
	codeForeignKeyViolation  = "23503"
	codeCheckViolation       = "23514"
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
	codeAdminShutdown        = "57P01"
	codeCrashShutdown        = "57P02"
	codeCannotConnectNow     = "57P03"
	codeTooManyConnections   = "53300"
	codeReadOnlyTransaction  = "25006"
)

// Classify returns the kind of err. It looks at the SQLSTATE of a *pgconn.PgError anywhere in
// the chain, then at connection-level error types; it never inspects message text.
func Classify(err error) Kind {
	if err == nil {
		return KindNone
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return classifyCode(pgErr.Code)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return KindNotFound
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return KindCanceled
	}
	if isConnectionError(err) {
		return KindUnavailable
	}
	return KindOther
}

func classifyCode(code string) Kind {
	switch code {
	case codeUniqueViolation:
		return KindUniqueViolation
	case codeForeignKeyViolation:
		return KindForeignKeyViolation
	case codeCheckViolation:
		return KindCheckViolation
	case codeSerializationFailure:
		return KindSerializationFailure
	case codeDeadlockDetected:
		return KindDeadlockDetected
	case codeAdminShutdown, codeCrashShutdown, codeCannotConnectNow, codeTooManyConnections:
		return KindUnavailable
	}
	switch code[:min(2, len(code))] {
	case "08", // connection exception
		"53", // insufficient resources: disk full, out of memory, too many connections
		"58": // system error: I/O error, an undefined file
		return KindUnavailable
	}
	if code == codeReadOnlyTransaction { // a standby, or a database made read-only: not the row's fault
		return KindUnavailable
	}
	return KindOther
}

func isConnectionError(err error) bool {
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return true
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	if _, ok := errors.AsType[*net.OpError](err); ok {
		return true
	}
	return errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// Sentinel returns the sentinel error that corresponds to kind, or nil for kinds that have none
// (KindNone, KindOther, KindCanceled).
func Sentinel(kind Kind) error {
	switch kind {
	case KindNotFound:
		return ErrNotFound
	case KindUniqueViolation, KindForeignKeyViolation, KindCheckViolation,
		KindSerializationFailure, KindDeadlockDetected:
		return ErrConflict
	case KindUnavailable:
		return ErrUnavailable
	}
	return nil
}

// Error is a classified database error. Its message holds only the operation and the kind, so it
// can be shown to clients; Unwrap yields both the matching sentinel (for errors.Is) and the
// original driver error (for errors.As and logs).
type Error struct {
	// Op names the operation that failed, e.g. "directory: put user".
	Op string
	// Kind is the classification of Err.
	Kind Kind
	// Err is the original error; never show it to clients.
	Err error
	// Reason, when set, says why in words safe to show (no host, user or
	// driver text): "connection refused", a SQLSTATE and the server's
	// message.
	Reason string
}

// Error returns "op: <generic description>"; it never includes the driver's message.
func (e *Error) Error() string {
	var msg string
	switch e.Kind {
	case KindCanceled:
		msg = "canceled"
	case KindOther:
		msg = "database error"
	default:
		msg = Sentinel(e.Kind).Error()
	}
	if e.Reason != "" {
		msg += " (" + e.Reason + ")"
	}
	if e.Op == "" {
		return msg
	}
	return e.Op + ": " + msg
}

// Unwrap returns the sentinel for the kind (if any) and the original error.
func (e *Error) Unwrap() []error {
	if s := Sentinel(e.Kind); s != nil {
		return []error{s, e.Err}
	}
	return []error{e.Err}
}

// Wrap classifies err and returns it as an *Error tagged with op; nil stays nil. An error that is
// already an *Error is returned unchanged so that wrapping twice does not bury the first op.
func Wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if e, ok := errors.AsType[*Error](err); ok {
		return e
	}
	return &Error{Op: op, Kind: Classify(err), Err: err}
}
