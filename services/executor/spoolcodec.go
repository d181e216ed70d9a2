package executor

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// A spooled row (SpooledRow.Record) holds the mandatev1.AuditRecord to
// append, in the protobuf binary encoding: the message the audit service
// takes, so a row reads back exactly as it was built, whatever fields the
// record gains.
//
// Rows spooled by earlier versions hold the JSON of the audit package's
// Go record instead (field names as in legacyRecord). They are told apart
// by their first byte: a JSON object opens with '{' (0x7b), which as the
// first byte of the binary encoding would be the tag of field 15 with the
// group wire type, a field AuditRecord declares as a string; so no record
// encodes to bytes that start with it.

// encodeSpooled encodes rec for the spool.
func encodeSpooled(rec *mandatev1.AuditRecord) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encoding a spooled audit row: %w", err)
	}
	return b, nil
}

// decodeSpooled reads a spooled row, in either encoding.
func decodeSpooled(b []byte) (*mandatev1.AuditRecord, error) {
	if len(b) == 0 {
		return nil, errors.New("decoding a spooled audit row: empty")
	}
	if b[0] == '{' {
		return decodeLegacy(b)
	}
	rec := &mandatev1.AuditRecord{}
	if err := proto.Unmarshal(b, rec); err != nil {
		return nil, fmt.Errorf("decoding a spooled audit row: %w", err)
	}
	return rec, nil
}

// legacyRecord is the JSON of a row spooled by a version before the
// executor wrote mandatev1 records: the audit package's Record as
// encoding/json wrote it (Go field names; Duration in nanoseconds;
// Arguments as raw JSON; the Approval's derived Assurance is ignored).
type legacyRecord struct {
	InvocationID    string
	Phase           string
	Time            time.Time
	Tenant          string
	Channel         string
	Command         string
	Risk            string
	SideEffects     []string
	Idempotent      bool
	Reversible      bool
	Subject         string
	UserID          string
	ActorKind       string
	AgentID         string
	Model           string
	ModelVersion    string
	ConversationID  string
	MCPSessionID    string
	Approval        *legacyApproval
	Outcome         string
	Stage           string
	Code            string
	Message         string
	Arguments       json.RawMessage
	ArgumentsDigest string
	ResultDigest    string
	Duration        time.Duration
	TraceID         string
	ManifestDigest  string
}

type legacyApproval struct {
	ChallengeID string
	Approver    string
	Channel     string
	DecidedAt   time.Time
}

func decodeLegacy(b []byte) (*mandatev1.AuditRecord, error) {
	var l legacyRecord
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("decoding a spooled audit row (JSON of an earlier version): %w", err)
	}
	rec := &mandatev1.AuditRecord{
		InvocationId: l.InvocationID, Phase: l.Phase, Tenant: l.Tenant, Channel: l.Channel,
		Command: l.Command, Risk: l.Risk, SideEffects: l.SideEffects, Idempotent: l.Idempotent, Reversible: l.Reversible,
		Subject: l.Subject, UserId: l.UserID, ActorKind: l.ActorKind, AgentId: l.AgentID, Model: l.Model,
		ModelVersion: l.ModelVersion, ConversationId: l.ConversationID, McpSessionId: l.MCPSessionID,
		Outcome: l.Outcome, Stage: l.Stage, Code: l.Code, Message: l.Message,
		ArgumentsDigest: l.ArgumentsDigest, ResultDigest: l.ResultDigest, TraceId: l.TraceID, ManifestDigest: l.ManifestDigest,
	}
	if !l.Time.IsZero() {
		rec.Time = timestamppb.New(l.Time)
	}
	if l.Duration > 0 {
		rec.Duration = durationpb.New(l.Duration)
	}
	if len(l.Arguments) > 0 && string(l.Arguments) != "null" {
		rec.ArgumentsJson = string(l.Arguments)
	}
	if a := l.Approval; a != nil {
		rec.Approval = &mandatev1.Approval{ChallengeId: a.ChallengeID, Approver: a.Approver, Channel: a.Channel}
		if !a.DecidedAt.IsZero() {
			rec.Approval.DecidedAt = timestamppb.New(a.DecidedAt)
		}
	}
	return rec, nil
}
