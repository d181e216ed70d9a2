package confirm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/mandate-dev/mandate/internal/manifest"
)

// Prompt is what the approver is shown. Every field comes from the
// command's declaration or from the request's data; none comes from model
// text, so an agent cannot word its own approval. The arguments are shown
// by their declaration (Fields), with every control and bidi character
// made visible, so that free text an agent wrote cannot pass itself off as
// another value.
type Prompt struct {
	// Title is "<display name> (<code>)".
	Title string `json:"title"`
	// Summary is one sentence: who asks to do what, what it affects and
	// whether it can be undone.
	Summary string `json:"summary"`
	// Risk is "L0" … "L4".
	Risk string `json:"risk"`
	// SideEffects are the declared consequences.
	SideEffects []string `json:"side_effects"`
	// Reversible and Recall say whether, and by which command, the effect
	// can be undone.
	Reversible bool   `json:"reversible"`
	Recall     string `json:"recall"`
	// Permissions are the permissions the call requires.
	Permissions []string `json:"permissions"`
	// ArgumentsJSON is the request as compact JSON with sorted keys; the
	// values of withheld fields are WithheldValue. Control, bidi and
	// invisible characters are written as \u escapes, so that the JSON
	// shows them rather than obeys them.
	ArgumentsJSON string `json:"arguments_json"`
	// Fields are the arguments rendered by the declaration (PromptFields).
	// They do not travel over gRPC (mandate.v1.Prompt has no such field):
	// a consumer that got a Prompt without them renders them from
	// ArgumentsJSON with PromptFields.
	Fields []PromptField `json:"fields,omitempty"`
	// WithheldFields are the JSON pointers of the values withheld from the
	// prompt, sorted.
	WithheldFields []string `json:"withheld_fields"`
	// RequestedBy is "<agent> acting for <user>", or "<user>".
	RequestedBy string `json:"requested_by"`
	// Effects are what the call would do, as the command's backend
	// previewed it before anyone was asked (mandate.v1.PreviewService),
	// one line each, neutralised; empty when the backend offers no preview.
	// They are the backend's words, not the agent's: the executor asked the
	// backend itself.
	Effects []string `json:"effects,omitempty"`
	// PreviewDigest is the executor's digest of that preview: the challenge
	// records which preview its approver was shown. Empty without one.
	PreviewDigest string `json:"preview_digest,omitempty"`
	// Reasons say why a human is asked, when declared conditions ask:
	// each condition's description from the declaration, with its id,
	// neutralised. Empty when the declaration asks for every call.
	Reasons []string `json:"reasons,omitempty"`
	// Hint is what the call does in the approver's words, as the
	// declaration's approver_hint says it (neutralised); empty without one.
	Hint string `json:"hint,omitempty"`
	// DeclarationDigest is the digest of the command's declaration the
	// prompt was rendered from (manifest.Set DeclarationDigest): the
	// approval holds for it only. Empty in challenges opened before it was
	// recorded.
	DeclarationDigest string `json:"declaration_digest,omitempty"`
}

// WithheldValue replaces a sensitive value that reached the renderer.
const WithheldValue = "[withheld]"

// PromptInput is the request-side input of RenderPrompt.
type PromptInput struct {
	// ArgumentsJSON is the request as a JSON object, with sensitive values
	// already withheld by the executor. Empty means {}.
	ArgumentsJSON string
	// WithheldFields are JSON pointers of the fields the executor withheld.
	WithheldFields []string
	// RequesterUser is the user the call is made for; RequesterAgent the
	// agent that asked, if any.
	RequesterUser, RequesterAgent string
	// Effects are the effect lines of the backend's preview, and
	// PreviewDigest the executor's digest of it (OpenRequest).
	Effects       []string
	PreviewDigest string
	// Conditions are the ids of the declared conditions that ask for the
	// confirmation (OpenRequest).
	Conditions []string
}

// Limits on the request-side input.
const (
	maxArgumentsBytes = 64 << 10
	maxWithheldFields = 64
	maxPointerBytes   = 512
	// MaxEffects and MaxEffectBytes bound a preview's effect lines
	// (mandate.v1.PreviewAllowed).
	MaxEffects     = 16
	MaxEffectBytes = 512
)

// RenderPrompt renders the approval prompt for cmd and in. It is a pure
// function: the same declaration and request always give the same prompt.
// As a second line of defence it also withholds every value at a pointer
// the declaration marks sensitive, whether or not the executor already
// did. It refuses (ErrInvalid) arguments that are not a JSON object and
// malformed pointers.
func RenderPrompt(cmd *manifest.Command, in PromptInput) (Prompt, error) {
	if cmd == nil {
		return Prompt{}, Invalid("command", "is required")
	}
	v, set, err := parseArguments(in.ArgumentsJSON, in.WithheldFields, sensitiveOf(cmd))
	if err != nil {
		return Prompt{}, err
	}
	args, withheld, err := encodeArguments(v, set)
	if err != nil {
		return Prompt{}, err
	}
	effects, err := effectLines(in.Effects, in.PreviewDigest)
	if err != nil {
		return Prompt{}, err
	}
	reasons, err := reasonsOf(cmd, in.Conditions)
	if err != nil {
		return Prompt{}, err
	}
	display := cmd.DisplayName
	if display == "" {
		display = cmd.Code
	}
	by := in.RequesterUser
	if in.RequesterAgent != "" {
		by = in.RequesterAgent + " acting for " + in.RequesterUser
	}
	title, _ := Neutralise(display + " (" + cmd.Code + ")")
	sum, _ := Neutralise(summary(by, display, cmd))
	hint, _ := Neutralise(cmd.ApproverHint)
	if hint != "" {
		// The declaration's own words for the approver lead; who asks and
		// what it touches follow.
		sum = hint + " " + sum
	}
	by, _ = Neutralise(by)
	return Prompt{
		Title:          title,
		Summary:        sum,
		Risk:           cmd.Risk,
		SideEffects:    slices.Clone(cmd.SideEffects),
		Reversible:     cmd.Reversible,
		Recall:         cmd.Recall,
		Permissions:    slices.Clone(cmd.Permissions),
		ArgumentsJSON:  args,
		WithheldFields: withheld,
		Fields:         fieldsOf(cmd, v, set),
		RequestedBy:    by,
		Effects:        effects,
		PreviewDigest:  in.PreviewDigest,
		Reasons:        reasons,
		Hint:           hint,
	}, nil
}

// MaxConditions bounds the conditions an OpenRequest names.
const MaxConditions = 32

// reasonsOf is why a human is asked: the declared description of each
// condition, or limit escalating the call, ids names. Only the
// declaration's words are shown; an id that is not one of the command's
// conditions asking for a confirmation, nor one of its limits that
// escalate, is refused, so the executor cannot put words of its own in
// the prompt.
func reasonsOf(cmd *manifest.Command, ids []string) ([]string, error) {
	if len(ids) > MaxConditions {
		return nil, Invalid("conditions", fmt.Sprintf("names more than %d conditions", MaxConditions))
	}
	var out []string
	for i, id := range ids {
		reason := ""
		for j := range cmd.Conditions {
			if c := &cmd.Conditions[j]; c.ID == id && c.Effect == "REQUIRE_CONFIRMATION" {
				reason = c.Description + " (condition " + c.ID + ")"
				break
			}
		}
		for j := range cmd.Limits {
			if l := &cmd.Limits[j]; reason == "" && l.ID == id && l.WhenExhausted == manifest.LimitExhaustEscalate {
				reason = "the call would go past " + l.Description + " (limit " + l.ID + ")"
				break
			}
		}
		if reason == "" {
			return nil, Invalid("conditions/"+strconv.Itoa(i), "names no condition of "+cmd.Code+" that asks for a confirmation, nor a limit that escalates")
		}
		r, _ := Neutralise(reason)
		out = append(out, r)
	}
	return out, nil
}

// effectLines checks a preview's effect lines and digest and neutralises
// the lines (Neutralise), so that a line shows every control and bidi
// character rather than obeying it. Lines need their digest: the challenge
// records which preview its approver was shown.
func effectLines(lines []string, digest string) ([]string, error) {
	switch {
	case len(lines) > MaxEffects:
		return nil, Invalid("effects", fmt.Sprintf("has more than %d lines", MaxEffects))
	case digest != "" && !ValidDigest(digest):
		return nil, Invalid("preview_digest", "must be 64 lower-case hex characters")
	case len(lines) > 0 && digest == "":
		return nil, Invalid("preview_digest", "is required with effects")
	case len(lines) == 0:
		return nil, nil
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		if l == "" || len(l) > MaxEffectBytes || !utf8.ValidString(l) {
			return nil, Invalid("effects/"+strconv.Itoa(i), fmt.Sprintf("must be 1 to %d bytes of UTF-8", MaxEffectBytes))
		}
		out[i], _ = Neutralise(l)
	}
	return out, nil
}

// Fields returns c's arguments rendered by their declaration: the fields
// rendered when the challenge was opened, as stored; else (a prompt that
// came over gRPC, or was stored without them) rendered now by the
// declaration the service holds for c's command; else without a
// declaration.
func (s *Service) Fields(c *Challenge) []PromptField {
	if c.Prompt.Fields != nil {
		return c.Prompt.Fields
	}
	cmd, _ := s.commands.ByCode(c.Command)
	return PromptFields(cmd, c.Prompt.ArgumentsJSON, c.Prompt.WithheldFields)
}

// summary is one sentence such as: support-bot acting for alice asks to
// refund a ticket (ticket.refund), which affects ledger and payment-gateway
// and cannot be undone.
func summary(by, display string, cmd *manifest.Command) string {
	var b strings.Builder
	b.WriteString(by + " asks to " + lowerFirst(display) + " (" + cmd.Code + "), which ")
	if len(cmd.SideEffects) == 0 {
		b.WriteString("has no declared side effects")
	} else {
		b.WriteString("affects " + joinAnd(cmd.SideEffects))
	}
	switch {
	case cmd.Reversible && cmd.Recall != "":
		b.WriteString(" and can be undone with " + cmd.Recall)
	case cmd.Reversible:
		b.WriteString(" and can be undone")
	default:
		b.WriteString(" and cannot be undone")
	}
	b.WriteString(".")
	return b.String()
}

// lowerFirst lower-cases a leading capital unless it starts an acronym
// ("Refund a ticket" → "refund a ticket", "SMS a customer" stays).
func lowerFirst(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if !unicode.IsUpper(r) {
		return s
	}
	if next, _ := utf8.DecodeRuneInString(s[n:]); unicode.IsUpper(next) {
		return s
	}
	return string(unicode.ToLower(r)) + s[n:]
}

func joinAnd(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

// sensitiveOf are the pointers of cmd's sensitive input fields: compiled
// from its descriptors when its manifest loaded (the executor withholds by
// the same facts), or as declared for a command declared outside a
// manifest.
func sensitiveOf(cmd *manifest.Command) []string {
	if f := cmd.Facts(); f != nil {
		return f.InputSensitive
	}
	return cmd.SensitiveFields
}

// parseArguments parses the arguments and withholds the values at the
// given pointers and at the declared sensitive pointers. It returns the
// parsed object (numbers as json.Number) and the set of withheld pointers.
func parseArguments(raw string, withheld, sensitive []string) (any, map[string]bool, error) {
	if len(raw) > maxArgumentsBytes {
		return nil, nil, Invalid("arguments_json", fmt.Sprintf("exceeds %d bytes", maxArgumentsBytes))
	}
	if len(withheld) > maxWithheldFields {
		return nil, nil, Invalid("withheld_fields", fmt.Sprintf("has more than %d entries", maxWithheldFields))
	}
	if strings.TrimSpace(raw) == "" {
		raw = "{}"
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, nil, Invalid("arguments_json", "is not valid JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, Invalid("arguments_json", "has data after the JSON object")
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, nil, Invalid("arguments_json", "is not a JSON object")
	}
	set := map[string]bool{}
	for i, p := range withheld {
		if !strings.HasPrefix(p, "/") || len(p) > maxPointerBytes || !utf8.ValidString(p) {
			return nil, nil, Invalid("withheld_fields/"+strconv.Itoa(i), "is not a JSON pointer")
		}
		set[p] = true
	}
	for _, pattern := range sensitive {
		if !strings.HasPrefix(pattern, "/") {
			continue // the manifest loader only produces pointers; ignore anything else
		}
		tokens := strings.Split(pattern[1:], "/")
		for i := range tokens {
			tokens[i] = unescapePointer(tokens[i])
		}
		v = withhold(v, tokens, "", set)
	}
	return v, set, nil
}

// encodeArguments returns canonical compact JSON of v (sorted keys,
// numbers as written, invisible characters escaped) with the sorted
// withheld pointers.
func encodeArguments(v any, set map[string]bool) (string, []string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", nil, Invalid("arguments_json", "cannot be encoded")
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	slices.Sort(out)
	return EscapeInvisibleJSON(strings.TrimSuffix(buf.String(), "\n")), out, nil
}

// withhold replaces the values that the pointer tokens (with "*" for any
// key or index) select below node, recording each replaced value's pointer.
func withhold(node any, tokens []string, at string, marked map[string]bool) any {
	if len(tokens) == 0 {
		marked[at] = true
		return WithheldValue
	}
	tok, rest := tokens[0], tokens[1:]
	switch n := node.(type) {
	case map[string]any:
		for k, child := range n {
			if tok == "*" || tok == k {
				n[k] = withhold(child, rest, at+"/"+escapePointer(k), marked)
			}
		}
	case []any:
		for i, child := range n {
			if tok == "*" || tok == strconv.Itoa(i) {
				n[i] = withhold(child, rest, at+"/"+strconv.Itoa(i), marked)
			}
		}
	}
	return node
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func unescapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
}
