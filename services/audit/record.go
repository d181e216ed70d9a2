package audit

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
)

// Phase says where in the pipeline a row was written.
type Phase string

// Phases of an invocation.
const (
	// PhaseIntent is written before the backend is called; its Outcome is always pending.
	PhaseIntent Phase = contract.PhaseIntent
	// PhaseOutcome is written after the call ended, or instead of an intent when the call was
	// refused before dispatch.
	PhaseOutcome Phase = contract.PhaseOutcome
	// PhaseResolution is an operator's verdict on an invocation whose outcome row says
	// unknown (mandate audit resolve): Outcome executed or failed, who (UserID) and why
	// (Message). The unknown row stays; the resolution is its own link in the chain.
	PhaseResolution Phase = contract.PhaseResolution
	// PhaseCheck records a check (ExecutorService.Check): a call judged and
	// never run. Its Outcome is the verdict: allowed, approval_required, or
	// refused or failed with the stage and code the call would meet.
	PhaseCheck Phase = contract.PhaseCheck
	// PhaseDecision records one attempt to decide a confirmation challenge,
	// accepted or refused; only the confirm service appends it. InvocationID
	// is the attempt's own id, Subject the challenge's id; Arguments hold
	// the challenge id, the invocation the challenge belongs to, the verdict
	// asked (approve or decline), the decision channel and its assurance.
	// Its Outcome is approved or declined (accepted), or refused with the
	// stage and code the attempt met. Command is empty when the challenge
	// named could not be read.
	PhaseDecision Phase = contract.PhaseDecision
)

// Channel is the transport the call came in on.
type Channel string

// Channels.
const (
	ChannelMCP  Channel = contract.ChannelMCP
	ChannelGRPC Channel = contract.ChannelGRPC
	ChannelREST Channel = contract.ChannelREST
)

// ActorKind says who acted: a person, an agent for a person, or a service.
type ActorKind string

// Actor kinds; the values match identity.Kind.
const (
	ActorUser    ActorKind = contract.ActorUser
	ActorAgent   ActorKind = contract.ActorAgent
	ActorService ActorKind = contract.ActorService
)

// Risk is the declared risk level of the command, L0 (read) to L4 (irreversible, high impact).
type Risk string

// Risk levels.
const (
	RiskL0 Risk = "L0"
	RiskL1 Risk = "L1"
	RiskL2 Risk = "L2"
	RiskL3 Risk = "L3"
	RiskL4 Risk = "L4"
)

// Outcome is how the invocation ended.
type Outcome string

// Outcomes. Intent rows carry OutcomePending; outcome rows one of the others.
const (
	OutcomePending  Outcome = contract.OutcomePending
	OutcomeExecuted Outcome = contract.OutcomeExecuted
	OutcomeRefused  Outcome = contract.OutcomeRefused
	OutcomeFailed   Outcome = contract.OutcomeFailed
	// OutcomeUnknown is written by reconciliation for an intent whose outcome never arrived.
	OutcomeUnknown Outcome = contract.OutcomeUnknown
	// OutcomeReplayed records a call that an idempotency key answered with
	// the response of an earlier invocation: nothing was dispatched.
	OutcomeReplayed Outcome = contract.OutcomeReplayed
	// OutcomeAllowed and OutcomeApprovalRequired are verdicts of a check
	// (PhaseCheck rows only).
	OutcomeAllowed          Outcome = contract.OutcomeAllowed
	OutcomeApprovalRequired Outcome = contract.OutcomeApprovalRequired
	// OutcomeApproved and OutcomeDeclined are accepted decisions
	// (PhaseDecision rows only).
	OutcomeApproved Outcome = contract.OutcomeApproved
	OutcomeDeclined Outcome = contract.OutcomeDeclined
)

// StageAudit is the pipeline stage of the audit trail (docs/architecture/pipeline.md). Its codes
// are failure.CodeAuditUnavailable, which the executor refuses with when the
// intent cannot be recorded, and failure.CodeAuditOutcomeUnknown, of the
// outcome rows reconciliation writes.
const StageAudit = contract.StageAudit

// Limits enforced by [Record.Validate]. They keep one row well under a database page budget
// and bound what a misbehaving caller can make the trail store.
const (
	// MaxFieldLen bounds every short text field (ids, codes, names, digests), in bytes.
	MaxFieldLen = contract.MaxFieldLen
	// MaxMessageLen bounds Message, in bytes.
	MaxMessageLen = contract.MaxMessageLen
	// MaxArgumentsLen bounds the compacted Arguments JSON, in bytes.
	MaxArgumentsLen = contract.MaxArgumentsLen
	// MaxSideEffects bounds the number of side effects.
	MaxSideEffects = contract.MaxSideEffects
)

// Approval records the human decision that let the call through.
type Approval struct {
	// ChallengeID is the confirm service's challenge that was approved.
	ChallengeID string
	// Approver is the user who approved.
	Approver string
	// Channel is where the decision was made, e.g. "elicitation" or "approval_page".
	Channel string
	// DecidedAt is when the approver decided; optional.
	DecidedAt time.Time
	// TrustCeiling is, for a client-attested approval, the tenant's trust
	// ceiling ("L0" … "L4") when the call ran; empty otherwise.
	TrustCeiling string
}

// Assurances of an approval: how sure the trail is that the approver, not
// someone holding their agent's credentials, decided.
const (
	// AssuranceSignedIn: the approver signed in on the approval page with
	// their own credential.
	AssuranceSignedIn = contract.AssuranceSignedIn
	// AssuranceClientAttested: the user's MCP client, which the directory
	// says the user operates (an interactive host), answered a
	// confirmation form; the server cannot see who pressed accept.
	AssuranceClientAttested = contract.AssuranceClientAttested
	// AssuranceAPICredential: the approver's own credential called the
	// confirm service's API.
	AssuranceAPICredential = contract.AssuranceAPICredential
	// AssuranceUnknown: a channel the trail does not know.
	AssuranceUnknown = contract.AssuranceUnknown
)

// MarshalJSON writes the approval with its derived Assurance.
func (a Approval) MarshalJSON() ([]byte, error) {
	type plain Approval
	return json.Marshal(struct {
		plain
		Assurance string
	}{plain(a), a.Assurance()})
}

// Assurance derives the approval's assurance from its channel, so that
// every row states it without the chain hashing a second copy.
func (a Approval) Assurance() string {
	switch a.Channel {
	case contract.ChannelApprovalPage:
		return AssuranceSignedIn
	case contract.ChannelMCPElicitation:
		return AssuranceClientAttested
	case contract.ChannelAPI:
		return AssuranceAPICredential
	}
	return AssuranceUnknown
}

// Record is one audit row as the caller writes it. Sensitive argument values must already be
// withheld by the caller: the trail stores Arguments as given.
type Record struct {
	// InvocationID identifies the attempt; every service, log line and span carries it.
	InvocationID string
	// Phase is intent (before dispatch) or outcome (after, or instead when refused early).
	Phase Phase
	// Time is when the event happened; zero means "now" at append. Stored with microsecond
	// precision in UTC.
	Time time.Time
	// Tenant owns the row; nothing crosses tenants.
	Tenant string
	// Channel is the transport: mcp, grpc or rest.
	Channel Channel
	// Command is the command's code, e.g. ticket.refund.
	Command string
	// Risk is the declared risk level; empty when the command is unknown.
	Risk Risk
	// SideEffects are the declared side effects, e.g. ledger. Stored sorted and de-duplicated.
	SideEffects []string
	// Idempotent and Reversible are copied from the declaration.
	Idempotent bool
	Reversible bool
	// Subject names the record acted on (the declaration's subject_field value).
	Subject string
	// UserID is the user the call was made for (for an agent: the user it acts for).
	UserID string
	// ActorKind is user, agent or service; empty when the caller was never authenticated.
	ActorKind ActorKind
	// AgentID, Model and ModelVersion identify the acting agent.
	AgentID      string
	Model        string
	ModelVersion string
	// ConversationID and MCPSessionID correlate the call with the agent's conversation.
	ConversationID string
	MCPSessionID   string
	// Approval is set when a human approved the call.
	Approval *Approval
	// Outcome is pending for intents; executed, refused, failed, unknown or replayed for outcomes.
	Outcome Outcome
	// Stage and Code name the pipeline stage and stable code of a refusal or failure.
	Stage string
	Code  string
	// Message is a human-readable explanation, safe to show to the tenant.
	Message string
	// Arguments is the call's input as JSON, sensitive fields withheld. Stored compacted.
	Arguments json.RawMessage
	// ArgumentsDigest and ResultDigest are digests of the full input and of the result.
	ArgumentsDigest string
	ResultDigest    string
	// Duration is how long the call took (outcome rows).
	Duration time.Duration
	// TraceID is the W3C trace id of the call.
	TraceID string
	// ManifestDigest identifies the manifest the declaration came from.
	ManifestDigest string
}

// Stored is a Record as the store keeps it: with its place in the tenant's chain.
type Stored struct {
	Record
	// Seq is the row's position in the tenant's sequence: 1, 2, 3, … without gaps.
	Seq int64
	// PrevHash is the Hash of the tenant's previous row (GenesisHash for Seq 1).
	PrevHash []byte
	// Hash is ComputeHash(PrevHash, Seq, Record).
	Hash []byte
}

// Key identifies a row within a tenant; appends are idempotent on it.
type Key struct {
	Tenant       string
	InvocationID string
	Phase        Phase
}

// Key returns the row's idempotency key.
func (r *Record) Key() Key { return Key{r.Tenant, r.InvocationID, r.Phase} }

// Approved reports whether the row records a human approval.
func (r *Record) Approved() bool { return r.Approval != nil }

// Clone returns a deep copy, so that callers cannot change what a store holds.
func (r Record) Clone() Record {
	r.SideEffects = slices.Clone(r.SideEffects)
	r.Arguments = bytes.Clone(r.Arguments)
	if r.Approval != nil {
		a := *r.Approval
		r.Approval = &a
	}
	return r
}

// Clone returns a deep copy.
func (s Stored) Clone() Stored {
	s.Record = s.Record.Clone()
	s.PrevHash = bytes.Clone(s.PrevHash)
	s.Hash = bytes.Clone(s.Hash)
	return s
}

// Normalize returns the canonical form of r that stores keep and hash: Time defaults to now
// and is UTC with microsecond precision (what Postgres keeps), an intent's empty Outcome
// becomes pending, side effects are sorted and de-duplicated, Arguments are compacted. It is
// idempotent. Invalid Arguments are left as they are for Validate to report.
func (r Record) Normalize(now time.Time) Record {
	args := r.Arguments
	r.Arguments = nil // copied by compactJSON below, not by Clone: one copy instead of two
	r = r.Clone()
	if r.Time.IsZero() {
		r.Time = now
	}
	r.Time = normTime(r.Time)
	if r.Phase == PhaseIntent && r.Outcome == "" {
		r.Outcome = OutcomePending
	}
	if len(r.SideEffects) == 0 {
		r.SideEffects = nil
	} else {
		slices.Sort(r.SideEffects)
		r.SideEffects = slices.Compact(r.SideEffects)
	}
	if len(args) > 0 {
		r.Arguments = compactJSON(args)
	}
	if r.Approval != nil && !r.Approval.DecidedAt.IsZero() {
		r.Approval.DecidedAt = normTime(r.Approval.DecidedAt)
	}
	return r
}

// compactJSON returns a compacted copy of src, or a plain copy when src is not valid JSON (for
// Validate to report). Compacting never lengthens JSON, so one allocation of len(src) holds
// either.
func compactJSON(src []byte) []byte {
	b := bytes.NewBuffer(make([]byte, 0, len(src)))
	if json.Compact(b, src) != nil {
		return append(b.Bytes()[:0], src...)
	}
	return b.Bytes()
}

func normTime(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

var (
	minTime = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
)

// EdgeRefusal reports whether r records a request refused at the edge (the
// MCP bridge, the REST gateway) before any command was read — too many
// requests, too many sessions: an outcome row refused at request_check,
// which may name no command.
func (r *Record) EdgeRefusal() bool {
	return r.Phase == PhaseOutcome && r.Outcome == OutcomeRefused && r.Stage == failure.StageRequest
}

// Validate reports the first problem of a normalized record as a *[ValidationError] (which
// matches [ErrInvalid]). Tenant, InvocationID, Phase and Command (but on a decision row and an
// EdgeRefusal) are required; enumerations
// must hold known values; text must be UTF-8 without NUL bytes and within the Max* limits.
func (r *Record) Validate() error {
	required := []struct{ field, v string }{
		{"tenant", r.Tenant},
		{"invocation_id", r.InvocationID},
		{"command", r.Command},
	}
	for _, f := range required {
		if f.v == "" && (f.field != "command" || (r.Phase != PhaseDecision && !r.EdgeRefusal())) {
			return invalid(f.field, "is required")
		}
	}
	short := []struct{ field, v string }{
		{"tenant", r.Tenant}, {"invocation_id", r.InvocationID}, {"command", r.Command},
		{"subject", r.Subject}, {"user_id", r.UserID}, {"agent_id", r.AgentID},
		{"model", r.Model}, {"model_version", r.ModelVersion},
		{"conversation_id", r.ConversationID}, {"mcp_session_id", r.MCPSessionID},
		{"stage", r.Stage}, {"code", r.Code},
		{"arguments_digest", r.ArgumentsDigest}, {"result_digest", r.ResultDigest},
		{"trace_id", r.TraceID}, {"manifest_digest", r.ManifestDigest},
	}
	for _, f := range short {
		if err := checkText(f.field, f.v, MaxFieldLen); err != nil {
			return err
		}
	}
	if err := checkText("message", r.Message, MaxMessageLen); err != nil {
		return err
	}
	switch r.Phase {
	case PhaseIntent:
		if r.Outcome != OutcomePending {
			return invalid("outcome", "must be pending on an intent row")
		}
	case PhaseOutcome:
		switch r.Outcome {
		case OutcomeExecuted:
		case OutcomeRefused, OutcomeFailed, OutcomeUnknown, OutcomeReplayed:
			if r.Stage == "" || r.Code == "" {
				return invalid("code", "stage and code are required when the outcome is "+string(r.Outcome))
			}
		case "":
			return invalid("outcome", "is required on an outcome row")
		default:
			return invalid("outcome", "must be executed, refused, failed, unknown or replayed")
		}
	case PhaseResolution:
		switch {
		case r.Outcome != OutcomeExecuted && r.Outcome != OutcomeFailed:
			return invalid("outcome", "must be executed or failed on a resolution row")
		case r.Stage == "" || r.Code == "":
			return invalid("code", "stage and code are required on a resolution row")
		case r.UserID == "" || r.Message == "":
			return invalid("message", "a resolution row says who resolved it (user_id) and why (message)")
		}
	case PhaseCheck:
		switch r.Outcome {
		case OutcomeAllowed:
		case OutcomeApprovalRequired, OutcomeRefused, OutcomeFailed:
			if r.Stage == "" || r.Code == "" {
				return invalid("code", "stage and code are required when a check's verdict is "+string(r.Outcome))
			}
		default:
			return invalid("outcome", "must be allowed, approval_required, refused or failed on a check row")
		}
	case PhaseDecision:
		switch r.Outcome {
		case OutcomeApproved, OutcomeDeclined:
		case OutcomeRefused:
			if r.Stage == "" || r.Code == "" {
				return invalid("code", "stage and code are required on a refused decision row")
			}
		default:
			return invalid("outcome", "must be approved, declined or refused on a decision row")
		}
		if r.Approval != nil {
			return invalid("approval", "a decision row records an attempt, not an approved call")
		}
	case "":
		return invalid("phase", "is required")
	default:
		return invalid("phase", "must be intent, outcome, resolution, check or decision")
	}
	if !r.Channel.Valid() {
		return invalid("channel", "must be mcp, grpc or rest")
	}
	if r.Risk != "" && !r.Risk.Valid() {
		return invalid("risk", "must be empty or one of L0, L1, L2, L3, L4")
	}
	if r.ActorKind != "" && !r.ActorKind.Valid() {
		return invalid("actor_kind", "must be empty or one of user, agent, service")
	}
	if len(r.SideEffects) > MaxSideEffects {
		return invalid("side_effects", "has more than 32 entries")
	}
	for _, se := range r.SideEffects {
		if se == "" {
			return invalid("side_effects", "holds an empty entry")
		}
		if err := checkText("side_effects", se, MaxFieldLen); err != nil {
			return err
		}
	}
	if len(r.Arguments) > 0 {
		if !json.Valid(r.Arguments) {
			return invalid("arguments", "is not valid JSON")
		}
		if len(r.Arguments) > MaxArgumentsLen {
			return invalid("arguments", "is longer than 64 KiB")
		}
	}
	if r.Duration < 0 {
		return invalid("duration", "is negative")
	}
	if r.Time.Before(minTime) || r.Time.After(maxTime) {
		return invalid("time", "is outside 1970..9999")
	}
	if a := r.Approval; a != nil {
		if a.ChallengeID == "" || a.Approver == "" {
			return invalid("approval", "needs a challenge id and an approver")
		}
		for _, f := range []struct{ field, v string }{
			{"approval.challenge_id", a.ChallengeID}, {"approval.approver", a.Approver}, {"approval.channel", a.Channel},
		} {
			if err := checkText(f.field, f.v, MaxFieldLen); err != nil {
				return err
			}
		}
		if !a.DecidedAt.IsZero() && (a.DecidedAt.Before(minTime) || a.DecidedAt.After(maxTime)) {
			return invalid("approval.decided_at", "is outside 1970..9999")
		}
		if c := a.TrustCeiling; c != "" && (len(c) != 2 || c[0] != 'L' || c[1] < '0' || c[1] > '4') {
			return invalid("approval.trust_ceiling", "must be empty or one of L0 … L4")
		}
	}
	return nil
}

func checkText(field, v string, limit int) error {
	if len(v) > limit {
		return invalid(field, "is longer than "+itoa(limit)+" bytes")
	}
	if !utf8.ValidString(v) {
		return invalid(field, "is not valid UTF-8")
	}
	if strings.IndexByte(v, 0) >= 0 {
		return invalid(field, "contains a NUL byte")
	}
	return nil
}

// Valid reports whether c is a known channel.
func (c Channel) Valid() bool { return c == ChannelMCP || c == ChannelGRPC || c == ChannelREST }

// Valid reports whether k is a known actor kind.
func (k ActorKind) Valid() bool { return k == ActorUser || k == ActorAgent || k == ActorService }

// Valid reports whether r is one of L0…L4.
func (r Risk) Valid() bool { return len(r) == 2 && r[0] == 'L' && r[1] >= '0' && r[1] <= '4' }

// Valid reports whether o is a known outcome.
func (o Outcome) Valid() bool {
	switch o {
	case OutcomePending, OutcomeExecuted, OutcomeRefused, OutcomeFailed, OutcomeUnknown, OutcomeReplayed,
		OutcomeAllowed, OutcomeApprovalRequired, OutcomeApproved, OutcomeDeclined:
		return true
	}
	return false
}

// Valid reports whether p is a known phase.
func (p Phase) Valid() bool {
	return p == PhaseIntent || p == PhaseOutcome || p == PhaseResolution || p == PhaseCheck || p == PhaseDecision
}
