package helpdesk

import (
	"google.golang.org/grpc/codes"

	"github.com/mandate-dev/mandate/pkg/backend"
)

// Pipeline stages (docs/architecture/pipeline.md) the backend refuses at. The executor passes
// them on unchanged.
const (
	// StageScopeCheck refuses a caller who may not act on the record at all.
	StageScopeCheck = backend.StageScopeCheck
	// StageStateCheck refuses a record that is missing or in the wrong state.
	StageStateCheck = backend.StageStateCheck
	// StagePreInvariant refuses a request that would break a business invariant.
	StagePreInvariant = backend.StagePreInvariant
	// StageIdempotencyCheck refuses a misused idempotency key.
	StageIdempotencyCheck = backend.StageIdempotencyCheck
	// StageSchemaValidate refuses input the schema cannot express as invalid (a page token).
	StageSchemaValidate = backend.StageSchemaValidate
	// StageDispatch is where a fault of the backend or of what it calls is reported.
	StageDispatch = backend.StageDispatch
)

// Codes of the backend's own refusals, stable: clients and the audit trail key on them.
// They are the sample's domain codes, not Mandate's: each refusal sets its gRPC code
// (refuse), and Mandate passes it on unchanged. Where one of Mandate's codes fits, the
// backend uses it: backend.CodeScopeDenied, CodeIdempotencyKeyReused,
// CodeSchemaInvalidPageToken and CodeSchemaInvalid, and through pkg/backend and pkg/receipt
// CodeScopeNotViaExecutor, CodeInvalidKey and CodeReceiptFenced.
const (
	// CodeNotFound: no such ticket or report in the caller's tenant (NotFound).
	CodeNotFound = "state.not_found"
	// CodeTicketClosed: refunds are not issued on a closed ticket (FailedPrecondition).
	CodeTicketClosed = "state.ticket_closed"
	// CodeNotDraft: only a draft report can be submitted (FailedPrecondition).
	CodeNotDraft = "state.not_draft"
	// CodeNotSubmitted: only a submitted report can be recalled or approved
	// (FailedPrecondition).
	CodeNotSubmitted = "state.not_submitted"
	// CodeAlreadyApproved: an approved report is final (FailedPrecondition).
	CodeAlreadyApproved = "state.already_approved"
	// CodeRefundExceedsPaid: the refund is more than what was paid and not yet refunded
	// (FailedPrecondition).
	CodeRefundExceedsPaid = "refund.exceeds_paid"
	// CodeRefundCurrencyMismatch: the refund is not in the currency that was paid
	// (FailedPrecondition).
	CodeRefundCurrencyMismatch = "refund.currency_mismatch"
	// CodeExpenseCurrencyMismatch: a report's lines are in more than one currency
	// (FailedPrecondition).
	CodeExpenseCurrencyMismatch = "expense.currency_mismatch"
	// CodeSelfApproval: the owner or submitter of a report may not approve it
	// (FailedPrecondition). The executor's separation of duties refuses this first; the
	// backend refuses it too, in case a deployment forgot to declare it.
	CodeSelfApproval = "invariant.self_approval"
	// CodeGatewayUnavailable: the payment gateway failed; nothing was refunded or booked
	// (Unavailable, retriable).
	CodeGatewayUnavailable = "payment.gateway_unavailable"
	// CodeUnavailable: the backend's store could not be reached (Unavailable, retriable).
	CodeUnavailable = "helpdesk.unavailable"
)

// refuse returns a refusal with an explicit gRPC code, so that each refusal says which it is
// (NotFound, PermissionDenied, FailedPrecondition, …) where it is made.
func refuse(stage, code string, grpcCode codes.Code, msg string) *backend.Error {
	e := backend.Refuse(stage, code, msg)
	e.Status = grpcCode
	return e
}

func notFound(what, id string) *backend.Error {
	return refuse(StageStateCheck, CodeNotFound, codes.NotFound, what+" "+id+" does not exist")
}

// invalidInput refuses input the request validation should have caught already; the domain
// checks again because it does not rely on being called through the gRPC server.
func invalidInput(pointer, msg string) *backend.Error {
	e := backend.Refuse(StageSchemaValidate, backend.CodeSchemaInvalid, msg)
	e.Violations = []backend.Violation{{Pointer: pointer, Rule: "helpdesk", Message: msg}}
	return e
}
