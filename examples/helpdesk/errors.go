package helpdesk

import (
	"google.golang.org/grpc/codes"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

// Pipeline stages (DESIGN §5) the backend refuses at. The executor passes them on unchanged.
const (
	// StageScopeCheck refuses a caller who may not act on the record at all.
	StageScopeCheck = "scope_check"
	// StageStateCheck refuses a record that is missing or in the wrong state.
	StageStateCheck = "state_check"
	// StagePreInvariant refuses a request that would break a business invariant.
	StagePreInvariant = "pre_invariant"
	// StageIdempotencyCheck refuses a misused idempotency key.
	StageIdempotencyCheck = "idempotency_check"
	// StageSchemaValidate refuses input the schema cannot express as invalid (a page token).
	StageSchemaValidate = "schema_validate"
	// StageDispatch is where a fault of the backend or of what it calls is reported.
	StageDispatch = "dispatch"
)

// Codes of the backend's refusals, stable: clients and the audit trail key on them.
const (
	// CodeNotViaExecutor: the caller reached the backend without going through a Mandate
	// service (PermissionDenied); pkg/receipt refuses it.
	CodeNotViaExecutor = receipt.CodeNotViaExecutor
	// CodeScopeDenied: the caller may not act on this record, e.g. approving a report of
	// another org, or submitting someone else's report (PermissionDenied).
	CodeScopeDenied = "scope.denied"
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
	// CodeKeyReused: the idempotency key was used before with a different request
	// (FailedPrecondition).
	CodeKeyReused = "idempotency.key_reused"
	// CodeInvalidKey: the idempotency key metadata is malformed (InvalidArgument); pkg/receipt
	// refuses it.
	CodeInvalidKey = receipt.CodeInvalidKey
	// CodeFenced: the executor resolved this invocation as not executed (GetReceipt), so this
	// delivery of it does not act (FailedPrecondition); pkg/receipt refuses it.
	CodeFenced = receipt.CodeFenced
	// CodeInvalidPageToken: the page token is malformed or belongs to another search
	// (InvalidArgument).
	CodeInvalidPageToken = "schema.invalid_page_token" //nolint:gosec // G101: an error code, not a credential
	// CodeGatewayUnavailable: the payment gateway failed; nothing was refunded or booked
	// (Unavailable, retriable).
	CodeGatewayUnavailable = "payment.gateway_unavailable"
	// CodeUnavailable: the backend's store could not be reached (Unavailable, retriable).
	CodeUnavailable = "helpdesk.unavailable"
)

// refuse returns a refusal with an explicit gRPC code: several of the backend's codes
// (refund.*, invariant.*) are not ones failure.GRPCCode knows.
func refuse(stage, code string, grpcCode codes.Code, msg string) *failure.Error {
	e := failure.New(stage, code, msg)
	e.Status = grpcCode
	return e
}

func notFound(what, id string) *failure.Error {
	return refuse(StageStateCheck, CodeNotFound, codes.NotFound, what+" "+id+" does not exist")
}

// invalidInput refuses input the request validation should have caught already; the domain
// checks again because it does not rely on being called through the gRPC server.
func invalidInput(pointer, msg string) *failure.Error {
	e := failure.New(StageSchemaValidate, "schema.invalid", msg)
	e.Violations = []failure.Violation{{Pointer: pointer, Rule: "helpdesk", Message: msg}}
	return e
}
