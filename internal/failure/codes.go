package failure

import (
	"net/http"
	"slices"

	"google.golang.org/grpc/codes"
)

// The codes Mandate refuses and fails with. Each is a row of the table
// below; clients (often agents) and the audit trail key on these strings,
// so a code never changes meaning once published.
const (
	CodeAuthenticationMissingCredentials = "authentication.missing_credentials"
	CodeAuthenticationInvalidToken       = "authentication.invalid_token"
	CodeAuthenticationTokenExpired       = "authentication.token_expired"
	CodeAuthenticationTokenNotYetValid   = "authentication.token_not_yet_valid"
	CodeAuthenticationWrongAudience      = "authentication.wrong_audience"
	CodeAuthenticationWrongIssuer        = "authentication.wrong_issuer"
	CodeAuthenticationUnknownKey         = "authentication.unknown_key"
	CodeAuthenticationTokenTooLarge      = "authentication.token_too_large"
	CodeAuthenticationMissingClaim       = "authentication.missing_claim"
	CodeAuthenticationNotAService        = "authentication.not_a_service"
	CodeAuthenticationLoginTokenUsed     = "authentication.login_token_used"

	CodeAuthorizationPrincipalInactive = "authorization.principal_inactive"
	CodeAuthorizationPermissionDenied  = "authorization.permission_denied"

	CodeDirectoryUnavailable = "directory.unavailable"

	CodeRequestInvalidMetadata  = "request.invalid_metadata"
	CodeRequestInvalidPageToken = "request.invalid_page_token" //nolint:gosec // G101: an error code, not a credential
	CodeRequestDeadlineExceeded = "request.deadline_exceeded"
	CodeRequestMalformed        = "request.malformed"
	CodeRequestRouteNotFound    = "request.route_not_found"
	CodeRequestMethodNotAllowed = "request.method_not_allowed"
	CodeRequestTooLarge         = "request.too_large"

	CodeManifestMismatch = "manifest.mismatch"

	CodeRateLimited    = "rate.limited"
	CodeSessionTooMany = "session.too_many"
	CodeTaskTooMany    = "task.too_many"
	CodeTaskNotFound   = "task.not_found"

	CodeCommandNotFound = "command.not_found"

	CodeEntitlementMissing = "entitlement.missing"

	CodeSchemaInvalid          = "schema.invalid"
	CodeSchemaInvalidPageToken = "schema.invalid_page_token" //nolint:gosec // G101: an error code, not a credential

	CodeScopeTenantMismatch = "scope.tenant_mismatch"
	CodeScopeDenied         = "scope.denied"
	CodeScopeNotViaExecutor = "scope.not_via_executor"

	CodeIdempotencyInvalidKey       = "idempotency.invalid_key"
	CodeIdempotencyInFlight         = "idempotency.in_flight"
	CodeIdempotencyKeyReused        = "idempotency.key_reused"
	CodeIdempotencyOutcomeUnknown   = "idempotency.outcome_unknown"
	CodeIdempotencyResolvedExecuted = "idempotency.resolved_executed"
	CodeIdempotencyReplayed         = "idempotency.replayed"
	CodeIdempotencyUnavailable      = "idempotency.unavailable"

	CodeSoDConflict    = "sod.conflict"
	CodeSoDUnavailable = "sod.unavailable"

	CodeConditionDenied           = "condition.denied"
	CodeConditionEvaluationFailed = "condition.evaluation_failed"

	CodeBudgetExhausted   = "budget.exhausted"
	CodeBudgetUnavailable = "budget.unavailable"

	CodeConfirmationRequired           = "confirmation.required"
	CodeConfirmationPending            = "confirmation.pending"
	CodeConfirmationRefused            = "confirmation.refused"
	CodeConfirmationExpired            = "confirmation.expired"
	CodeConfirmationAlreadyDecided     = "confirmation.already_decided"
	CodeConfirmationAlreadyRedeemed    = "confirmation.already_redeemed"
	CodeConfirmationGrantMismatch      = "confirmation.grant_mismatch"
	CodeConfirmationRevoked            = "confirmation.revoked"
	CodeConfirmationDeclarationChanged = "confirmation.declaration_changed"
	CodeConfirmationTooManyOpen        = "confirmation.too_many_open"
	CodeConfirmationApproverNotAllowed = "confirmation.approver_not_allowed"
	CodeConfirmationNotFound           = "confirmation.not_found"
	CodeConfirmationInvalidState       = "confirmation.invalid_state"
	CodeConfirmationUnavailable        = "confirmation.unavailable"

	CodeAuditUnavailable         = "audit.unavailable"
	CodeAuditNotFound            = "audit.not_found"
	CodeAuditOutcomeUnknown      = "audit.outcome_unknown"
	CodeAuditResolvedExecuted    = "audit.resolved_executed"
	CodeAuditResolvedNotExecuted = "audit.resolved_not_executed"
	// CodeAuditNotResolvable, CodeAuditContradictsReceipt: refusals of
	// ExecutorService.Resolve.
	CodeAuditNotResolvable      = "audit.not_resolvable"
	CodeAuditContradictsReceipt = "audit.contradicts_receipt"

	CodeHandlerFailed           = "handler.failed"
	CodeHandlerUnavailable      = "handler.unavailable"
	CodeHandlerDeadlineExceeded = "handler.deadline_exceeded"
	CodeHandlerNotExecuted      = "handler.not_executed"
	CodeHandlerNotSent          = "handler.not_sent"

	CodeReceiptFenced      = "receipt.fenced"
	CodeReceiptUnavailable = "receipt.unavailable"

	CodeInternalError = "internal.error"

	// CodeServiceUnavailable is the code of a problem whose status is a bare
	// Unavailable: a Mandate service draining, restarting or unreachable.
	CodeServiceUnavailable = "service.unavailable"
)

// Spec is one row of the table of codes: where a code is reported and how
// it travels.
type Spec struct {
	// Code is the stable, dotted code.
	Code string
	// Stages are the pipeline stages (mandate.v1.Stage; docs/architecture/pipeline.md) that report the code, in
	// pipeline order; empty for a code reported outside the pipeline (an
	// API of its own, the REST gateway).
	Stages []string
	// GRPC is the status code of a call refused with the code. codes.OK
	// marks a code that is only ever recorded in the audit trail, never
	// answered.
	GRPC codes.Code
	// HTTP is the status of the problem+json body: HTTPStatus(GRPC), except
	// for a Gateway code. 0 for a code that is never answered.
	HTTP int
	// Gateway marks a code the REST gateway answers itself, never as a gRPC
	// status; its HTTP status is its own.
	Gateway bool
	// Retriable says whether the same call may succeed if retried later.
	Retriable bool
	// Remedy is the default remedy: what the caller should do next. A
	// refusal may carry a more specific one.
	Remedy string
	// Meaning says what the code means, for the README.
	Meaning string
}

// Answered reports whether a client can receive the code (rather than only
// read it in the audit trail).
func (s Spec) Answered() bool { return s.GRPC != codes.OK }

// UnknownCode is the gRPC code of an error whose code is not in the table (a
// backend's domain code, e.g. refund.exceeds_paid) or is only recorded and
// never answered, unless the error sets Status itself. A backend's domain
// refusal must set Status: Mandate passes it on with the backend's gRPC
// code, and guesses nothing from the code's shape.
const UnknownCode = codes.Internal

var (
	stagesAuthn = []string{"authenticate"}
	remedyAuthn = "re-authenticate"
)

// table is every code Mandate emits, grouped by where the pipeline reports
// it.
var table = []Spec{
	{Code: CodeAuthenticationMissingCredentials, Stages: stagesAuthn, GRPC: codes.Unauthenticated, HTTP: http.StatusUnauthorized, Remedy: remedyAuthn,
		Meaning: "no bearer token was sent"},
	{Code: CodeAuthenticationInvalidToken, Stages: stagesAuthn, GRPC: codes.Unauthenticated, HTTP: http.StatusUnauthorized, Remedy: remedyAuthn,
		Meaning: "a malformed token, a bad signature, a forbidden algorithm or a token of the wrong kind"},
	{Code: CodeAuthenticationTokenExpired, Stages: stagesAuthn, GRPC: codes.Unauthenticated, HTTP: http.StatusUnauthorized, Remedy: "obtain a fresh token and retry",
		Meaning: "the token's `exp` (plus leeway) has passed"},
	{Code: CodeAuthenticationTokenNotYetValid, Stages: stagesAuthn, GRPC: codes.Unauthenticated, HTTP: http.StatusUnauthorized, Remedy: "check the issuer's clock, then retry with a new token",
		Meaning: "the token's `nbf` or `iat` lies in the future"},
	{Code: CodeAuthenticationWrongAudience, Stages: stagesAuthn, GRPC: codes.Unauthenticated, HTTP: http.StatusUnauthorized, Remedy: remedyAuthn,
		Meaning: "the token was issued for another service"},
	{Code: CodeAuthenticationWrongIssuer, Stages: stagesAuthn, GRPC: codes.Unauthenticated, HTTP: http.StatusUnauthorized, Remedy: remedyAuthn,
		Meaning: "the token comes from an issuer Mandate does not trust"},
	{Code: CodeAuthenticationUnknownKey, Stages: stagesAuthn, GRPC: codes.Unauthenticated, HTTP: http.StatusUnauthorized, Remedy: remedyAuthn,
		Meaning: "the token names a signing key (`kid`) the issuer's key set lacks"},
	{Code: CodeAuthenticationTokenTooLarge, Stages: stagesAuthn, GRPC: codes.Unauthenticated, HTTP: http.StatusUnauthorized, Remedy: remedyAuthn,
		Meaning: "the token is larger than the limit; refused before parsing"},
	{Code: CodeAuthenticationMissingClaim, Stages: stagesAuthn, GRPC: codes.Unauthenticated, HTTP: http.StatusUnauthorized, Remedy: remedyAuthn,
		Meaning: "a required claim (`exp`, `sub`, `tenant`, `act.sub`) is absent"},
	{Code: CodeAuthenticationNotAService, Stages: stagesAuthn, GRPC: codes.Unauthenticated, HTTP: http.StatusUnauthorized, Remedy: "call with a service token, or drop x-mandate-on-behalf-of",
		Meaning: "a caller acted as a service without a service token"},
	{Code: CodeAuthenticationLoginTokenUsed, Stages: stagesAuthn, GRPC: codes.Unauthenticated, HTTP: http.StatusUnauthorized, Remedy: "sign in again",
		Meaning: "a one-time sign-in link of the approval page was used twice"},
	{Code: CodeAuthorizationPrincipalInactive, Stages: []string{StageAuthenticate, StagePermission}, GRPC: codes.PermissionDenied, HTTP: http.StatusForbidden, Remedy: "ask an administrator",
		Meaning: "the directory says the caller is not active (unknown or disabled user, unregistered or disabled agent)"},
	{Code: CodeDirectoryUnavailable, Stages: stagesAuthn, GRPC: codes.Unavailable, HTTP: http.StatusServiceUnavailable, Retriable: true, Remedy: "retry later",
		Meaning: "the directory could not be read"},
	{Code: CodeRequestInvalidMetadata, Stages: []string{StageRequest}, GRPC: codes.InvalidArgument, HTTP: http.StatusBadRequest,
		Remedy:  "send the metadata within its limits: valid UTF-8 without control or bidi characters, and no longer than the limit",
		Meaning: "call metadata besides the arguments (conversation id, approval grant, trace context…) breaks its rules"},
	{Code: CodeManifestMismatch, Stages: []string{StageRequest}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity,
		Remedy:  "ask an operator: deploy the same manifest to every Mandate service (compare the manifest_digest of their /healthz)",
		Meaning: "the calling Mandate service runs another manifest than the one receiving the call (x-mandate-manifest-digest differs); refused before any effect"},
	{Code: CodeRateLimited, Stages: []string{StageRequest, StageBudget}, GRPC: codes.ResourceExhausted, HTTP: http.StatusTooManyRequests, Retriable: true,
		Remedy:  "slow down: wait retry_after seconds (the Retry-After header), then call again",
		Meaning: "the caller sent more requests than one principal may at the edge (the MCP bridge, the REST gateway; stage request_check, nothing behind the edge was asked), or the call would go past a rate its command declares (budget_check; the detail names the limit, nothing was run)"},
	{Code: CodeSessionTooMany, Stages: []string{StageRequest}, GRPC: codes.ResourceExhausted, HTTP: http.StatusTooManyRequests, Retriable: true,
		Remedy:  "reuse an MCP session you hold, or end those you no longer use (HTTP DELETE with their Mcp-Session-Id); idle ones close after the session timeout",
		Meaning: "the principal already holds the most MCP sessions one principal may open; no session was opened"},
	{Code: CodeTaskTooMany, Stages: []string{StageRequest}, GRPC: codes.ResourceExhausted, HTTP: http.StatusTooManyRequests, Retriable: true,
		Remedy:  "wait for one of your MCP tasks to end (a human decides, or its challenge expires) or cancel one (tasks/cancel), then call again",
		Meaning: "the principal already has the most MCP tasks waiting for a human one principal may hold on a bridge; no task was created and the call did not run"},
	{Code: CodeTaskNotFound, Stages: []string{StageRequest}, GRPC: codes.NotFound, HTTP: http.StatusNotFound,
		Remedy:  "use a task id this principal created, before the task's ttl ends",
		Meaning: "an MCP tasks/get, tasks/result or tasks/cancel named a task that is not the caller's (another principal's, expired, or never created); answered as unknown, and recorded when it was another principal's"},
	{Code: CodeCommandNotFound, Stages: []string{StageLoad, StageConfirmation}, GRPC: codes.NotFound, HTTP: http.StatusNotFound, Remedy: "pick another tool",
		Meaning: "no published command with this code is visible to the caller"},
	{Code: CodeEntitlementMissing, Stages: []string{StageEntitlement}, GRPC: codes.PermissionDenied, HTTP: http.StatusForbidden, Remedy: "none: the command is not available to the tenant",
		Meaning: "the tenant is not entitled to the command's feature"},
	{Code: CodeAuthorizationPermissionDenied, Stages: []string{StagePermission, StageConfirmation}, GRPC: codes.PermissionDenied, HTTP: http.StatusForbidden,
		Remedy: "escalate to a user who holds the permission", Meaning: "the caller lacks a permission the command or operation needs"},
	{Code: CodeSchemaInvalid, Stages: []string{StageSchema, StageConfirmation}, GRPC: codes.InvalidArgument, HTTP: http.StatusBadRequest, Remedy: "fix the fields listed in violations",
		Meaning: "the arguments break the command's schema; violations carry JSON pointers"},
	{Code: CodeSchemaInvalidPageToken, Stages: []string{StageSchema}, GRPC: codes.InvalidArgument, HTTP: http.StatusBadRequest, Remedy: "search again without a page token",
		Meaning: "a backend's page token is malformed or belongs to another search"},
	{Code: CodeScopeTenantMismatch, Stages: []string{StageScope}, GRPC: codes.PermissionDenied, HTTP: http.StatusForbidden, Remedy: "none: a call acts in the caller's own tenant",
		Meaning: "the call names another tenant"},
	{Code: CodeScopeDenied, Stages: []string{StageScope}, GRPC: codes.PermissionDenied, HTTP: http.StatusForbidden, Remedy: "none: the caller may not act on this record",
		Meaning: "a backend says the caller may not act on this record"},
	{Code: CodeScopeNotViaExecutor, Stages: []string{StageScope}, GRPC: codes.PermissionDenied, HTTP: http.StatusForbidden, Remedy: "call the command through the executor",
		Meaning: "a backend or governed operation was called directly instead of through a Mandate service"},
	{Code: CodeIdempotencyInvalidKey, Stages: []string{StageIdempotency}, GRPC: codes.InvalidArgument, HTTP: http.StatusBadRequest,
		Remedy:  "send an idempotency key within its limits: valid UTF-8 without control or bidi characters, at most 255 bytes",
		Meaning: "the idempotency key breaks its rules; refused before anyone is asked to approve"},
	{Code: CodeIdempotencyInFlight, Stages: []string{StageIdempotency}, GRPC: codes.Aborted, HTTP: http.StatusConflict, Retriable: true, Remedy: "wait, then retry with the same key to read its result",
		Meaning: "a call with this idempotency key is still running"},
	{Code: CodeIdempotencyKeyReused, Stages: []string{StageIdempotency}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity, Remedy: "use a new key for a new call",
		Meaning: "the idempotency key was used with different arguments"},
	{Code: CodeIdempotencyOutcomeUnknown, Stages: []string{StageIdempotency}, GRPC: codes.Aborted, HTTP: http.StatusConflict, Retriable: true,
		Remedy:  "retry later with the same key; the backend's receipt decides whether it ran",
		Meaning: "the call holding this key has an unknown outcome, and its backend cannot say yet whether it ran"},
	{Code: CodeIdempotencyResolvedExecuted, Stages: []string{StageIdempotency}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity,
		Remedy:  "read the effect from the system of record; do not retry",
		Meaning: "an operator resolved the call holding this key as executed; its result was never recorded"},
	{Code: CodeIdempotencyReplayed, Stages: []string{StageIdempotency},
		Meaning: "audit trail only: a retry was answered with the first call's saved response"},
	{Code: CodeIdempotencyUnavailable, Stages: []string{StageIdempotency}, GRPC: codes.Unavailable, HTTP: http.StatusServiceUnavailable, Retriable: true, Remedy: "retry later",
		Meaning: "the idempotency store could not be reached; nothing was run"},
	{Code: CodeSoDConflict, Stages: []string{StageSoD}, GRPC: codes.PermissionDenied, HTTP: http.StatusForbidden, Remedy: "escalate to a different user",
		Meaning: "separation of duties: the caller took part in an earlier step of the same record"},
	{Code: CodeSoDUnavailable, Stages: []string{StageSoD}, GRPC: codes.Unavailable, HTTP: http.StatusServiceUnavailable, Retriable: true, Remedy: "retry later",
		Meaning: "the separation-of-duties history could not be read; nothing was run"},
	{Code: CodeConditionDenied, Stages: []string{StageCondition}, GRPC: codes.PermissionDenied, HTTP: http.StatusForbidden,
		Remedy:  "none as called: the command's declared condition the refusal names forbids this call; change the arguments or ask a human to make it",
		Meaning: "a condition the command declares (CEL over the arguments and the caller) refuses the call; the detail names the condition's id"},
	{Code: CodeConditionEvaluationFailed, Stages: []string{StageCondition}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity,
		Remedy:  "check the arguments the condition reads; if they are right, ask an operator to fix the declaration",
		Meaning: "a declared condition could not be evaluated on this call (fail closed: nothing was run, nobody was asked); the detail names the condition's id"},
	{Code: CodeBudgetExhausted, Stages: []string{StageBudget}, GRPC: codes.ResourceExhausted, HTTP: http.StatusTooManyRequests, Retriable: true,
		Remedy:  "wait retry_after seconds for the window to free enough, or ask a human to make the call; the detail names the limit",
		Meaning: "the call would spend more of a declared budget (the sum of a request field per window) than is left; nothing was run. A limit declared to escalate asks a human instead"},
	{Code: CodeBudgetUnavailable, Stages: []string{StageBudget}, GRPC: codes.Unavailable, HTTP: http.StatusServiceUnavailable, Retriable: true, Remedy: "retry later",
		Meaning: "the store that counts the command's declared limits could not be reached; nothing was run"},
	{Code: CodeConfirmationRequired, Stages: []string{StageConfirmation}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity, Retriable: true,
		Remedy:  "the approver the refusal names decides at the approval URL; then call again with the same arguments and the challenge id where grant_in and grant_name say (MCP _meta mandate.dev/approval, header X-Mandate-Approval-Grant, metadata x-mandate-approval-grant or the approval_grant_id field)",
		Meaning: "a human must confirm the call; carries the challenge id and approval URL"},
	{Code: CodeConfirmationPending, Stages: []string{StageConfirmation}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity, Retriable: true, Remedy: "wait for the approver (Await), then retry",
		Meaning: "nobody has decided the challenge yet"},
	{Code: CodeConfirmationRefused, Stages: []string{StageConfirmation}, GRPC: codes.PermissionDenied, HTTP: http.StatusForbidden, Remedy: "the user said no; do not retry without asking them",
		Meaning: "the approver declined"},
	{Code: CodeConfirmationExpired, Stages: []string{StageConfirmation}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity,
		Remedy: "ask the user again: call the command again to open a new challenge", Meaning: "nobody decided in time, or the grant was not redeemed in time"},
	{Code: CodeConfirmationAlreadyDecided, Stages: []string{StageConfirmation}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity, Remedy: "read the challenge to see the decision",
		Meaning: "the challenge was approved or declined before"},
	{Code: CodeConfirmationAlreadyRedeemed, Stages: []string{StageConfirmation}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity,
		Remedy: "ask the user again: call the command again to open a new challenge", Meaning: "the grant was used already; an approval is good for one call"},
	{Code: CodeConfirmationTooManyOpen, Stages: []string{StageConfirmation}, GRPC: codes.ResourceExhausted, HTTP: http.StatusTooManyRequests, Retriable: true,
		Remedy:  "wait until approvals you asked for are decided or expire, then call again",
		Meaning: "the caller already has the most approvals waiting that one requester may hold; nobody was asked"},
	{Code: CodeConfirmationRevoked, Stages: []string{StageConfirmation}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity,
		Remedy:  "ask the user again: call the command again to open a new challenge",
		Meaning: "the call was asked for before its user or agent was last disabled (access revoked); an approval given then does not survive the revocation"},
	{Code: CodeConfirmationDeclarationChanged, Stages: []string{StageConfirmation}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity,
		Remedy:  "ask the approver again under the new declaration: call the command again without the grant to open a new challenge",
		Meaning: "the command's declaration (risk, confirmation, approver, permissions, conditions, input schema…) changed since the approval was given; an approval holds for the declaration it was given under, and the grant was not used"},
	{Code: CodeConfirmationGrantMismatch, Stages: []string{StageConfirmation}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity,
		Remedy:  "ask the user again: call the command again to open a new challenge",
		Meaning: "the grant was given for another invocation (other arguments, principal or idempotency key)"},
	{Code: CodeConfirmationApproverNotAllowed, Stages: []string{StageConfirmation}, GRPC: codes.PermissionDenied, HTTP: http.StatusForbidden,
		Remedy: "a human the approver policy names must decide, on the approval page", Meaning: "the caller may not decide this challenge; agents never approve"},
	{Code: CodeConfirmationNotFound, Stages: []string{StageConfirmation}, GRPC: codes.NotFound, HTTP: http.StatusNotFound, Remedy: "call the command again to open a new challenge",
		Meaning: "no challenge with this id is visible to the caller"},
	{Code: CodeConfirmationInvalidState, Stages: []string{StageConfirmation}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity,
		Remedy: "call the tool again without requestState to get a fresh confirmation", Meaning: "an MCP retry's requestState is forged, expired or not this call's"},
	{Code: CodeConfirmationUnavailable, Stages: []string{StageConfirmation}, GRPC: codes.Unavailable, HTTP: http.StatusServiceUnavailable, Retriable: true, Remedy: "retry later",
		Meaning: "the confirmation service or store could not be reached"},
	{Code: CodeAuditUnavailable, Stages: []string{StageAudit}, GRPC: codes.Unavailable, HTTP: http.StatusServiceUnavailable, Retriable: true, Remedy: "retry later",
		Meaning: "the call's intent could not be made durable (fail closed: nothing was dispatched), or the audit trail could not be written or read"},
	{Code: CodeReceiptFenced, Stages: []string{StageIdempotency}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity, Remedy: "call the command again as a new invocation",
		Meaning: "the invocation was resolved as not executed, so this delivery of it never acts"},
	{Code: CodeHandlerFailed, Stages: []string{StageDispatch}, GRPC: codes.Internal, HTTP: http.StatusInternalServerError, Remedy: "ask an operator; the logs have the details",
		Meaning: "the backend failed"},
	{Code: CodeHandlerUnavailable, Stages: []string{StageDispatch}, GRPC: codes.Unavailable, HTTP: http.StatusServiceUnavailable, Retriable: true, Remedy: "retry later with the same idempotency key",
		Meaning: "the backend is unavailable; the effect is unknown until its receipt says"},
	{Code: CodeHandlerDeadlineExceeded, Stages: []string{StageDispatch}, GRPC: codes.DeadlineExceeded, HTTP: http.StatusGatewayTimeout, Retriable: true,
		Remedy: "retry later with the same idempotency key", Meaning: "the backend did not answer in time; the effect is unknown until its receipt says"},
	{Code: CodeReceiptUnavailable, Stages: []string{StageDispatch}, GRPC: codes.Unavailable, HTTP: http.StatusServiceUnavailable, Retriable: true, Remedy: "retry later",
		Meaning: "a backend's receipt store could not be read; nothing was recorded"},
	{Code: CodeHandlerNotSent, Stages: []string{StageDispatch}, GRPC: codes.Unavailable, HTTP: http.StatusServiceUnavailable, Retriable: true,
		Remedy:  "retry with the same idempotency key; nothing was run",
		Meaning: "the call was never sent to the backend: the caller had cancelled it or its deadline had passed by the time it was to be dispatched"},
	{Code: CodeHandlerNotExecuted, Stages: []string{StageDispatch},
		Meaning: "audit trail only: the executor stopped mid-call, and the backend's receipt says the call never ran"},
	{Code: CodeAuditOutcomeUnknown, Stages: []string{StageAudit},
		Meaning: "audit trail only: an intent whose outcome never arrived"},
	{Code: CodeAuditResolvedExecuted, Stages: []string{StageAudit},
		Meaning: "audit trail only: an unknown outcome resolved as executed, by an operator or from the backend's receipt"},
	{Code: CodeAuditResolvedNotExecuted, Stages: []string{StageAudit},
		Meaning: "audit trail only: an unknown outcome resolved as not executed, by an operator or from the backend's receipt"},
	{Code: CodeAuditNotResolvable, Stages: []string{StageAudit}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity,
		Remedy:  "resolve only an invocation whose outcome row says unknown and that no resolution answers yet",
		Meaning: "an operator's resolution was refused: the invocation's outcome is not unknown, or it was resolved already"},
	{Code: CodeAuditContradictsReceipt, Stages: []string{StageAudit}, GRPC: codes.FailedPrecondition, HTTP: http.StatusUnprocessableEntity,
		Remedy:  "check the system of record; to record the verdict anyway, resolve again with override_receipt (recorded)",
		Meaning: "an operator's resolution was refused: the backend's receipt says the opposite"},
	{Code: CodeAuditNotFound, GRPC: codes.NotFound, HTTP: http.StatusNotFound, Remedy: "check the invocation id and tenant",
		Meaning: "the audit trail holds no record for this query"},
	{Code: CodeRequestInvalidPageToken, GRPC: codes.InvalidArgument, HTTP: http.StatusBadRequest, Remedy: "list again without a page token",
		Meaning: "an audit listing's page token is malformed or belongs to other filters"},
	{Code: CodeRequestDeadlineExceeded, GRPC: codes.DeadlineExceeded, HTTP: http.StatusGatewayTimeout, Retriable: true, Remedy: "retry with a longer deadline",
		Meaning: "the caller's deadline passed"},
	{Code: CodeRequestMalformed, Stages: []string{StageDecode}, Gateway: true, GRPC: codes.InvalidArgument, HTTP: http.StatusBadRequest, Remedy: "fix the request",
		Meaning: "REST: a path or query parameter, or the body, cannot be read"},
	{Code: CodeRequestRouteNotFound, Gateway: true, GRPC: codes.NotFound, HTTP: http.StatusNotFound, Remedy: "check the URL",
		Meaning: "REST: no route has this path"},
	{Code: CodeRequestMethodNotAllowed, Gateway: true, GRPC: codes.Unimplemented, HTTP: http.StatusMethodNotAllowed, Remedy: "use the route's method",
		Meaning: "REST: the route does not take this method"},
	{Code: CodeRequestTooLarge, Gateway: true, GRPC: codes.ResourceExhausted, HTTP: http.StatusRequestEntityTooLarge, Remedy: "send a smaller body",
		Meaning: "REST: the body is larger than the server accepts"},
	{Code: CodeServiceUnavailable, GRPC: codes.Unavailable, HTTP: http.StatusServiceUnavailable, Retriable: true, Remedy: "retry later, with the same idempotency key if the call has effects",
		Meaning: "a Mandate service is draining, restarting or unreachable"},
	{Code: CodeInternalError, GRPC: codes.Internal, HTTP: http.StatusInternalServerError, Remedy: "ask an operator; the logs have the details",
		Meaning: "a fault whose details stay in the operator's logs"},
}

var byCode = func() map[string]Spec {
	m := make(map[string]Spec, len(table))
	for _, s := range table {
		if _, dup := m[s.Code]; dup {
			panic("failure: code " + s.Code + " is in the table twice")
		}
		m[s.Code] = s
	}
	return m
}()

// Lookup returns the table's row of a code; ok is false for a code Mandate
// does not emit (a backend's domain code).
func Lookup(code string) (s Spec, ok bool) {
	s, ok = byCode[code]
	if ok {
		s.Stages = slices.Clone(s.Stages)
	}
	return s, ok
}

// Codes returns every row of the table, in the table's order.
func Codes() []Spec {
	out := make([]Spec, len(table))
	for i, s := range table {
		out[i], _ = Lookup(s.Code)
	}
	return out
}

// GRPCCode is the gRPC code of an error code: the table's, or UnknownCode
// for a code the table does not have or never answers with.
func GRPCCode(code string) codes.Code {
	if s, ok := byCode[code]; ok && s.Answered() {
		return s.GRPC
	}
	return UnknownCode
}
