package backend

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

// Pipeline stages (mandate.v1.Stage; docs/architecture/pipeline.md) a backend refuses at. The executor passes a backend's refusal at
// StageStateCheck, StagePreInvariant, StageAssert, StagePostInvariant, StageScopeCheck,
// StageSchemaValidate or StageIdempotencyCheck on to the agent with its stage and code. At any
// other stage it keeps the code, reported at StageDispatch, under a client-error gRPC code
// (InvalidArgument, FailedPrecondition, NotFound, AlreadyExists, OutOfRange, PermissionDenied);
// otherwise it reports its own handler.unavailable (Unavailable, retriable),
// handler.deadline_exceeded (DeadlineExceeded) or handler.failed.
const (
	// StageAuthenticate refuses a caller without valid tokens (the Guard does).
	StageAuthenticate = identity.Stage
	// StageRequestCheck refuses malformed executor metadata (CallerFrom does).
	StageRequestCheck = receipt.StageRequestCheck
	// StageScopeCheck refuses a caller who may not act on the record at all.
	StageScopeCheck = receipt.StageScopeCheck
	// StageSchemaValidate refuses input the schema could not express as invalid.
	StageSchemaValidate = failure.StageSchema
	// StageIdempotencyCheck refuses a misused idempotency key.
	StageIdempotencyCheck = receipt.StageIdempotencyCheck
	// StageStateCheck refuses a record that is missing or in the wrong state.
	StageStateCheck = failure.StageState
	// StagePreInvariant refuses a request that would break a business invariant.
	StagePreInvariant = failure.StagePreInvariant
	// StageAssert refuses a request whose declared assertion does not hold.
	StageAssert = "assert"
	// StagePostInvariant refuses an effect that would leave an invariant broken (and is
	// rolled back).
	StagePostInvariant = failure.StagePostInvariant
	// StageDispatch reports a fault of the backend or of what it calls.
	StageDispatch = receipt.StageDispatch
)

// Mandate's codes that a backend uses where they fit, rows of Mandate's table of codes. A
// backend's own domain codes ("refund.exceeds_paid") are its own strings.
const (
	// CodeAuthenticationMissingCredentials: no authenticated user behind the call
	// (Unauthenticated).
	CodeAuthenticationMissingCredentials = failure.CodeAuthenticationMissingCredentials
	// CodeScopeNotViaExecutor: the call did not come through the relay (PermissionDenied).
	CodeScopeNotViaExecutor = receipt.CodeNotViaExecutor
	// CodeScopeDenied: the caller may not act on this record (PermissionDenied).
	CodeScopeDenied = failure.CodeScopeDenied
	// CodeSchemaInvalid: the input breaks a rule; Violations say where (InvalidArgument).
	CodeSchemaInvalid = failure.CodeSchemaInvalid
	// CodeSchemaInvalidPageToken: the page token is not one this backend issued
	// (InvalidArgument).
	CodeSchemaInvalidPageToken = failure.CodeSchemaInvalidPageToken
	// CodeIdempotencyKeyReused: the idempotency key was used with another input
	// (FailedPrecondition).
	CodeIdempotencyKeyReused = failure.CodeIdempotencyKeyReused
	// CodeInvalidKey: the idempotency key metadata is sent twice or too long
	// (InvalidArgument).
	CodeInvalidKey = receipt.CodeInvalidKey
	// CodeInvalidMetadata: the invocation id metadata is sent twice or too long
	// (InvalidArgument).
	CodeInvalidMetadata = receipt.CodeInvalidMetadata
	// CodeReceiptFenced: the invocation was resolved as not executed and may never act
	// (FailedPrecondition).
	CodeReceiptFenced = receipt.CodeFenced
	// CodeInternalError: a fault whose details stay in the backend's logs (Internal).
	CodeInternalError = failure.CodeInternalError
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every refusal the executor and this
// package send; a reason (code) is unique within it.
const ErrorDomain = failure.Domain

// Violation is one broken input rule of a CodeSchemaInvalid refusal.
type Violation struct {
	// Pointer is the JSON pointer of the offending field, e.g. "/amount/currencyCode".
	Pointer string
	// Rule names the rule broken.
	Rule string
	// Message explains it to a human.
	Message string
}

// Error is a backend's refusal (or fault) with a pipeline stage and a stable code. Returned from a
// gRPC handler (it implements GRPCStatus), it reaches the executor as a status with the gRPC
// code Status, a google.rpc.ErrorInfo (reason = Code, domain "mandate.dev", metadata stage)
// and a mandate.v1.CommandError carrying every field below.
type Error struct {
	// Stage is one of the Stage constants.
	Stage string
	// Code is stable and machine-readable: agents branch on it and the audit trail keeps it.
	Code string
	// Message explains the refusal to the caller; it must not leak internals.
	Message string
	// Status is the gRPC code. Zero means the table's code for one of Mandate's codes and
	// codes.FailedPrecondition for a domain code (see the Stage constants for what the
	// executor does with each).
	Status codes.Code
	// Retriable says a retry of the same call may succeed; Remedy says what to do next.
	Retriable bool
	Remedy    string
	// Violations detail a CodeSchemaInvalid refusal.
	Violations []Violation
	// InvocationID lets the caller quote the call (Caller.InvocationID).
	InvocationID string

	cause error
}

// Refuse returns a refusal at stage with code and a client-safe message; set its other fields
// before returning it.
func Refuse(stage, code, message string) *Error {
	return &Error{Stage: stage, Code: code, Message: message}
}

// Internal is the refusal of a fault whose cause must stay in the backend's logs: stage
// dispatch, CodeInternalError, codes.Internal. The executor reports it as handler.failed.
func Internal(cause error) *Error {
	return Refuse(StageDispatch, CodeInternalError, "internal error; the operator's logs have the details").WithCause(cause)
}

// WithCause keeps cause for the backend's logs (errors.Unwrap, errors.Is); it is never sent.
func (r *Error) WithCause(cause error) *Error {
	r.cause = cause
	return r
}

// Error returns "stage: code: message", never the cause.
func (r *Error) Error() string { return r.failure().Error() }

// Unwrap returns the cause given to WithCause.
func (r *Error) Unwrap() error { return r.cause }

// Is matches another *Error with the same code, so errors.Is(err, Refuse("", c, "")) tests
// for a code.
func (r *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t != nil && t.Code == r.Code
}

// GRPCStatus is the refusal as the executor reads it (see Error); status.FromError and
// gRPC's server find it through this method.
func (r *Error) GRPCStatus() *status.Status { return r.failure().GRPCStatus() }

// failure is the refusal as Mandate's one mapping to the wire takes it.
func (r *Error) failure() *failure.Error {
	e := failure.Wrap(r.Stage, r.Code, r.Message, r.cause)
	e.Status, e.Retriable, e.Remedy, e.InvocationID = r.Status, r.Retriable, r.Remedy, r.InvocationID
	if e.Status == codes.OK {
		if _, mandates := failure.Lookup(r.Code); !mandates {
			e.Status = codes.FailedPrecondition
		}
	}
	for _, v := range r.Violations {
		e.Violations = append(e.Violations, failure.Violation{Pointer: v.Pointer, Rule: v.Rule, Message: v.Message})
	}
	return e
}

// AsError returns the refusal in err's chain: a *Error, or a refusal of this package's
// CallerFrom or of pkg/receipt (a fenced invocation, bad metadata), as a *Error whose cause
// is the original. ok is false for any other error.
func AsError(err error) (r *Error, ok bool) {
	if errors.As(err, &r) {
		return r, true
	}
	var fe *failure.Error
	if !errors.As(err, &fe) {
		return nil, false
	}
	r = &Error{
		Stage: fe.Stage, Code: fe.Code, Message: fe.Message, Status: fe.Status,
		Retriable: fe.Retriable, Remedy: fe.Remedy, InvocationID: fe.InvocationID, cause: fe,
	}
	for _, v := range fe.Violations {
		r.Violations = append(r.Violations, Violation{Pointer: v.Pointer, Rule: v.Rule, Message: v.Message})
	}
	return r, true
}

// StatusOf converts any error a handler meets into the status to return: a refusal keeps its
// stage and code; context.Canceled becomes codes.Canceled and context.DeadlineExceeded
// codes.DeadlineExceeded (the executor reports handler.deadline_exceeded); any other error is
// Internal(err), its text never sent. StatusOf(nil) is OK.
func StatusOf(err error) *status.Status {
	if err == nil {
		return status.New(codes.OK, "")
	}
	if r, ok := AsError(err); ok {
		return r.GRPCStatus()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return failure.ToStatus(err)
	}
	var gs interface{ GRPCStatus() *status.Status }
	if errors.As(err, &gs) {
		return gs.GRPCStatus()
	}
	return Internal(err).GRPCStatus()
}
