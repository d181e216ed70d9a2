// Package contract is the vocabulary services share on the wire: plain
// constants, no logic. The values are the strings of mandatev1.AuditRecord
// fields (phase, outcome, channel, actor_kind, approval.assurance) and the
// limits the audit trail enforces on a row, so that a service writing rows
// and the service keeping them agree without sharing Go types.
package contract

// Phases of an invocation's rows (AuditRecord.phase).
const (
	// PhaseIntent is written before the backend is called; its outcome is
	// always pending.
	PhaseIntent = "intent"
	// PhaseOutcome is written after the call ended, or instead of an
	// intent when the call was refused before dispatch.
	PhaseOutcome = "outcome"
	// PhaseResolution settles an invocation whose outcome row says unknown.
	PhaseResolution = "resolution"
	// PhaseCheck records a check (ExecutorService.Check): a call judged,
	// never run. Its outcome is the verdict.
	PhaseCheck = "check"
	// PhaseDecision records one attempt to decide a challenge (approve or
	// decline), accepted or refused, written by the confirm service. Its
	// outcome is approved or declined for an accepted attempt, refused with
	// stage and code otherwise.
	PhaseDecision = "decision"
)

// Outcomes (AuditRecord.outcome). Intent rows carry OutcomePending.
const (
	OutcomePending  = "pending"
	OutcomeExecuted = "executed"
	OutcomeRefused  = "refused"
	OutcomeFailed   = "failed"
	OutcomeUnknown  = "unknown"
	OutcomeReplayed = "replayed"
	// OutcomeAllowed and OutcomeApprovalRequired are verdicts, on check
	// rows only (a refused check is OutcomeRefused, with stage and code).
	OutcomeAllowed          = "allowed"
	OutcomeApprovalRequired = "approval_required"
	// OutcomeApproved and OutcomeDeclined are accepted decisions, on
	// decision rows only (a refused attempt is OutcomeRefused, with stage
	// and code).
	OutcomeApproved = "approved"
	OutcomeDeclined = "declined"
)

// Channels a call comes in on (AuditRecord.channel).
const (
	ChannelMCP  = "mcp"
	ChannelGRPC = "grpc"
	ChannelREST = "rest"
)

// Actor kinds (AuditRecord.actor_kind); the values match identity.Kind.
const (
	ActorUser    = "user"
	ActorAgent   = "agent"
	ActorService = "service"
)

// Decision channels of an approval (Approval.channel): where a human said
// yes or no. Each has its assurance below.
const (
	ChannelApprovalPage   = "approval_page"
	ChannelMCPElicitation = "mcp_elicitation"
	ChannelAPI            = "api"
)

// Where a call carries an approved challenge's id (its grant), per channel:
// the MCP `_meta` key, the gRPC metadata key, the REST header (the same
// name, as HTTP spells it) and the ExecuteRequest field.
const (
	GrantMeta     = "mandate.dev/approval"
	GrantMetadata = "x-mandate-approval-grant"
	GrantHeader   = "X-Mandate-Approval-Grant"
	GrantField    = "approval_grant_id"
)

// Assurances of an approval (Approval.assurance): how sure the trail is
// that the approver, not someone holding their agent's credentials, decided.
const (
	// AssuranceSignedIn: the approver signed in on the approval page.
	AssuranceSignedIn = "signed_in"
	// AssuranceClientAttested: the user's own MCP client answered a
	// confirmation form; the server cannot see who pressed accept.
	AssuranceClientAttested = "client_attested"
	// AssuranceAPICredential: the approver's own credential called the
	// confirm service's API.
	AssuranceAPICredential = "api_credential" //nolint:gosec // G101: an assurance level, not a credential
	// AssuranceUnknown: a channel the trail does not know.
	AssuranceUnknown = "unknown"
)

// StageAudit is the stage of audit rows: a resolution row, an outcome the
// audit service records as unknown (AuditRecord.stage). Their codes are the
// table's (failure.CodeAudit*).
const StageAudit = "audit"

// Limits of one audit row, in bytes.
const (
	// MaxFieldLen bounds every short text field (ids, codes, names, digests).
	MaxFieldLen = 256
	// MaxMessageLen bounds the message.
	MaxMessageLen = 4096
	// MaxArgumentsLen bounds the compacted arguments JSON.
	MaxArgumentsLen = 64 << 10
	// MaxSideEffects bounds the number of side effects.
	MaxSideEffects = 32
)
