package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/mandate-dev/mandate/internal/facts"
)

// Format names the manifest layout this package reads and writes.
const Format = "mandate.manifest/v1"

// Manifest is the projection of every command of a build.
type Manifest struct {
	// Format is always Format.
	Format string `json:"format"`
	// Digest is "sha256:<hex>" over the canonical compact encoding of the
	// manifest with Digest set to "".
	Digest string `json:"digest"`
	// DescriptorSetDigest is "sha256:<hex>" of the descriptor set bytes the
	// manifest was built with.
	DescriptorSetDigest string `json:"descriptor_set_digest"`
	// Commands, sorted by code.
	Commands []*Command `json:"commands"`
}

// Command is one declared business command.
type Command struct {
	Code        string `json:"code"`
	DisplayName string `json:"display_name"`
	AgentHint   string `json:"agent_hint"`
	// ApproverHint is what the call does in the approver's words (plain
	// text); empty: the prompt's generated summary.
	ApproverHint string `json:"approver_hint,omitempty"`
	// Description is the RPC's leading comment.
	Description string `json:"description"`
	// Risk is "L0" … "L4".
	Risk       string `json:"risk"`
	Idempotent bool   `json:"idempotent"`
	Reversible bool   `json:"reversible"`
	// Recall is the code of the command that undoes this one.
	Recall          string   `json:"recall"`
	SideEffects     []string `json:"side_effects"`
	Permissions     []string `json:"permissions"`
	RequiredFeature string   `json:"required_feature"`
	// Confirmation is the declared value: "DEFAULT", "REQUIRED" or "NEVER".
	Confirmation string `json:"confirmation"`
	// ConfirmationRequired is the confirmation the declaration itself
	// demands (DEFAULT derived from risk, reversibility and side effects). A
	// deployment may require more, never less.
	ConfirmationRequired bool                `json:"confirmation_required"`
	Approver             Approver            `json:"approver"`
	SeparationOfDuties   *SeparationOfDuties `json:"separation_of_duties"`
	SubjectField         string              `json:"subject_field"`
	// Lifecycle is "PUBLISHED", "DRAFT" or "DEPRECATED".
	Lifecycle string `json:"lifecycle"`
	// Deadline is a protojson duration such as "10s", or "" for the
	// deployment default.
	Deadline string    `json:"deadline"`
	Examples []Example `json:"examples"`
	// Conditions are the declared CEL conditions, in declaration order,
	// each type-checked against the request at build time.
	Conditions []Condition `json:"conditions"`
	// Limits are the declared ceilings on how often, or how much, the
	// command is used per window; absent when it declares none.
	Limits []Limit `json:"limits,omitempty"`
	RPC    RPC     `json:"rpc"`
	// SensitiveFields are JSON pointers (proto names, "*" for any element
	// or key) of the input fields declared sensitive.
	SensitiveFields []string        `json:"sensitive_fields"`
	InputSchema     json.RawMessage `json:"input_schema"`
	OutputSchema    json.RawMessage `json:"output_schema"`

	// facts are what the command's descriptors declare, compiled when the
	// manifest loaded (Facts).
	facts *facts.Command
}

// Facts returns what the command's descriptors declare, compiled once when
// its manifest loaded (Load): per field its kind and sensitivity, the
// sensitive pointers, the deadline as a duration. Nil for a command
// declared outside a Set (a test's fixture), which has no descriptors.
func (c *Command) Facts() *facts.Command { return c.facts }

// Approver kinds (Approver.Kind), as the manifest spells them.
const (
	ApproverRequestingUser   = "REQUESTING_USER"
	ApproverPermissionHolder = "PERMISSION_HOLDER"
)

// Approver says who may approve a confirmation of the command.
type Approver struct {
	// Kind is "REQUESTING_USER" or "PERMISSION_HOLDER".
	Kind string `json:"kind"`
	// Permission the approver must hold, for PERMISSION_HOLDER.
	Permission string `json:"permission"`
	// Declared is false when the policy is the default.
	Declared bool `json:"declared"`
}

// SeparationOfDuties names the commands the same user may not also perform
// on the same subject.
type SeparationOfDuties struct {
	ConflictsWith []string `json:"conflicts_with"`
	Field         string   `json:"field"`
}

// Confirmation values (Command.Confirmation), as the manifest spells them.
const (
	ConfirmationDefault     = "DEFAULT"
	ConfirmationRequired    = "REQUIRED"
	ConfirmationNever       = "NEVER"
	ConfirmationConditional = "CONDITIONAL"
)

// Condition is one declared condition of a command: a CEL expression over
// `request` and `principal` and what happens when it is true.
type Condition struct {
	// ID is stable and unique within the command.
	ID string `json:"id"`
	// Expression is the CEL source as declared.
	Expression string `json:"expression"`
	// Effect is "REQUIRE_CONFIRMATION" or "DENY".
	Effect string `json:"effect"`
	// Description is the sentence humans read (tool descriptor, prompt).
	Description string `json:"description"`
}

// Limit scopes (Limit.Per) and exhaustion policies (Limit.WhenExhausted),
// as the manifest spells them.
const (
	LimitPerAgent        = "AGENT"
	LimitPerUser         = "USER"
	LimitPerTenant       = "TENANT"
	LimitExhaustRefuse   = "REFUSE"
	LimitExhaustEscalate = "ESCALATE"
)

// Limit is one declared ceiling of a command: at most Max calls (a rate,
// SumField empty) or at most Max of SumField's values added up (a budget)
// per Window, counted per Per and, with GroupField, per value of that
// field.
type Limit struct {
	// ID is stable and unique among the command's limits and conditions.
	ID string `json:"id"`
	// Per is "AGENT", "USER" or "TENANT".
	Per string `json:"per"`
	// Window is a protojson duration such as "86400s".
	Window string `json:"window"`
	// Max is the ceiling.
	Max int64 `json:"max"`
	// SumField is the dotted path of the integer request field a call
	// spends; "" counts calls.
	SumField string `json:"sum_field,omitempty"`
	// GroupField is the dotted path of the string or enum request field
	// whose values are counted apart; "" for one ceiling.
	GroupField string `json:"group_field,omitempty"`
	// WhenExhausted is "REFUSE" or "ESCALATE".
	WhenExhausted string `json:"when_exhausted"`
	// Description is the sentence humans read.
	Description string `json:"description"`
}

// Describe is the limit in words for a tool descriptor or a plan: its
// description and what happens past it, e.g. "an agent refunds at most
// 500.00 a day per currency (limit agent-daily-refunds; past it a human is
// asked)".
func (l Limit) Describe() string {
	then := "past it the call is refused until the window frees enough"
	if l.WhenExhausted == LimitExhaustEscalate {
		then = "past it a human is asked"
	}
	return l.Description + " (limit " + l.ID + "; " + then + ")"
}

// Example is a declared example input, validated at build time.
type Example struct {
	Description string          `json:"description"`
	Input       json.RawMessage `json:"input"`
}

// RPC binds a command to its gRPC method and REST route.
type RPC struct {
	Service    string `json:"service"`
	Method     string `json:"method"`
	FullMethod string `json:"full_method"`
	InputType  string `json:"input_type"`
	OutputType string `json:"output_type"`
	// HTTP is the google.api.http route, if declared.
	HTTP *HTTPRule `json:"http"`
}

// HTTPRule is a REST route of a command.
type HTTPRule struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Body   string `json:"body"`
}

// Published reports whether the command is callable.
func (c *Command) Published() bool { return c.Lifecycle == "PUBLISHED" || c.Lifecycle == "DEPRECATED" }

// ReadOnly reports whether the command only reads (risk L0 without side
// effects).
func (c *Command) ReadOnly() bool { return c.Risk == "L0" && len(c.SideEffects) == 0 }

// Encode returns the manifest's canonical bytes (sorted keys, two-space
// indent, trailing newline) with Digest computed.
func Encode(m *Manifest) ([]byte, error) {
	m.Format = Format
	m.Digest = ""
	compact, err := Canonical(m, false)
	if err != nil {
		return nil, err
	}
	m.Digest = digestOf(compact)
	return Canonical(m, true)
}

// Canonical encodes v as JSON with object keys sorted at every level, no
// HTML escaping, numbers kept as written; indented when pretty.
func Canonical(v any, pretty bool) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("manifest: encode: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return nil, fmt.Errorf("manifest: encode: %w", err)
	}
	return canonicalGeneric(generic, pretty)
}

func canonicalGeneric(v any, pretty bool) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if pretty {
		enc.SetIndent("", "  ")
	}
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("manifest: encode: %w", err)
	}
	out := buf.Bytes()
	if !pretty {
		out = bytes.TrimSuffix(out, []byte("\n"))
	}
	return out, nil
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// verifyDigest recomputes the digest of manifest bytes as Encode wrote
// them. Manifests are compared byte for byte, so only the canonical layout
// verifies: blank the top-level digest value, compact, hash.
func verifyDigest(raw []byte) (string, error) {
	const key = "\n  \"digest\": \""
	i := bytes.Index(raw, []byte(key))
	if i < 0 {
		return "", errors.New("manifest: not in canonical layout (top-level \"digest\" not found)")
	}
	valStart := i + len(key) - 1 // the opening quote
	j := bytes.IndexByte(raw[valStart+1:], '"')
	if j < 0 {
		return "", errors.New("manifest: truncated digest")
	}
	valEnd := valStart + 1 + j + 1
	blanked := make([]byte, 0, len(raw))
	blanked = append(blanked, raw[:valStart]...)
	blanked = append(blanked, '"', '"')
	blanked = append(blanked, raw[valEnd:]...)
	var compact bytes.Buffer
	if err := json.Compact(&compact, bytes.TrimSpace(blanked)); err != nil {
		return "", fmt.Errorf("manifest: %w", err)
	}
	return digestOf(compact.Bytes()), nil
}

// DigestOf returns "sha256:<hex>" of b; the descriptor set digest uses it.
func DigestOf(b []byte) string { return digestOf(b) }

// RiskLevel returns 0–4 for "L0"–"L4", or -1.
func RiskLevel(risk string) int {
	if len(risk) == 2 && risk[0] == 'L' && risk[1] >= '0' && risk[1] <= '4' {
		return int(risk[1] - '0')
	}
	return -1
}

func splitMethod(full string) (string, string, bool) {
	full = strings.TrimPrefix(full, "/")
	i := strings.LastIndex(full, "/")
	if i <= 0 || i == len(full)-1 {
		return "", "", false
	}
	return full[:i], full[i+1:], true
}
