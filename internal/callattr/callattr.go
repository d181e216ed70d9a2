package callattr

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Names of the attributes, as refusals and audit rows name them.
const (
	Conversation   = "conversation"
	IdempotencyKey = "idempotency_key"
	ApprovalGrant  = "approval_grant"
	MCPSession     = "mcp_session"
	TraceParent    = "traceparent"
	TraceState     = "tracestate"
	// RequestState names an MCP 2026-07-28 retry's requestState (or the
	// answer it carries) that the bridge could not accept; its Invalid
	// carries the confirmation code as Rule and is relayed only by the
	// bridge.
	RequestState = "request_state"
)

// Limits, in bytes. They match the buf.validate rules of
// mandate.v1.ExecuteRequest, so every channel accepts the same values.
const (
	MaxConversation   = 255
	MaxIdempotencyKey = 255
	MaxApprovalGrant  = 128
	MaxMCPSession     = 255
	MaxTraceState     = 512
	// MaxMarked bounds what Mark returns.
	MaxMarked = 96
)

// Rules a value can break; they appear as the violation's rule.
const (
	RuleTooLong = "metadata.too_long"
	RuleUTF8    = "metadata.not_utf8"
	RuleControl = "metadata.control_character"
	RuleFormat  = "metadata.format"
	RuleType    = "metadata.type"
)

// Invalid is one attribute a caller sent that breaks its rule. Value is
// already marked (see Mark): safe to log, to show and to record.
type Invalid struct {
	Name   string `json:"name"`
	Rule   string `json:"rule"`
	Reason string `json:"reason"`
	Value  string `json:"value"`
}

// Describe renders the problem for a client: which attribute, and why.
func (i Invalid) Describe() string { return i.Name + " " + i.Reason }

// Check validates value as the attribute name. An empty value is absent
// and always valid. It returns nil or the problem with the value marked.
func Check(name, value string) *Invalid {
	if value == "" {
		return nil
	}
	bad := func(rule, reason string) *Invalid {
		return &Invalid{Name: name, Rule: rule, Reason: reason, Value: Mark(value)}
	}
	limit := MaxConversation
	switch name {
	case IdempotencyKey:
		limit = MaxIdempotencyKey
	case ApprovalGrant:
		limit = MaxApprovalGrant
	case MCPSession:
		limit = MaxMCPSession
	case TraceState:
		limit = MaxTraceState
	}
	switch {
	case len(value) > limit:
		return bad(RuleTooLong, "is longer than "+strconv.Itoa(limit)+" bytes ("+strconv.Itoa(len(value))+")")
	case !utf8.ValidString(value):
		return bad(RuleUTF8, "is not valid UTF-8")
	case strings.IndexFunc(value, hidden) >= 0:
		return bad(RuleControl, "contains a control, format or bidi character")
	}
	switch name {
	case ApprovalGrant:
		if strings.IndexFunc(value, func(r rune) bool { return !isIDRune(r) }) >= 0 {
			return bad(RuleFormat, "must hold only letters, digits, '-' and '_'")
		}
	case MCPSession:
		if strings.IndexFunc(value, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
			return bad(RuleFormat, "must be visible ASCII")
		}
	case TraceParent:
		if !ValidTraceParent(value) {
			return bad(RuleFormat, "is not a W3C traceparent (version-traceid-parentid-flags, lower-case hex)")
		}
	case TraceState:
		if strings.IndexFunc(value, func(r rune) bool { return r < 0x20 || r > 0x7e }) >= 0 || strings.Count(value, ",") >= 32 {
			return bad(RuleFormat, "is not a W3C tracestate (at most 32 printable ASCII list members)")
		}
	}
	return nil
}

// TypeError is the problem of an attribute that arrived with a JSON type
// other than string (MCP `_meta`); raw is the value's JSON text.
func TypeError(name, raw string) *Invalid {
	return &Invalid{Name: name, Rule: RuleType, Reason: "must be a string", Value: Mark(raw)}
}

// ValidTraceParent reports whether v is a W3C trace-context traceparent
// that a tracer would accept: version 00 exactly 55 characters, a later
// version at least that with a '-' after the flags, never version ff, and
// neither id all zeros.
func ValidTraceParent(v string) bool {
	if len(v) < 55 || (len(v) > 55 && (v[:2] == "00" || v[55] != '-')) {
		return false
	}
	if v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return false
	}
	for _, part := range []string{v[:2], v[3:35], v[36:52], v[53:55]} {
		for i := 0; i < len(part); i++ {
			c := part[i]
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return v[:2] != "ff" && strings.Trim(v[3:35], "0") != "" && strings.Trim(v[36:52], "0") != ""
}

// Mark renders any string as a bounded, printable value marked as what a
// caller sent: "[invalid] " followed by the value with invalid bytes as
// \xNN and control, format and bidi characters as \u{XXXX}, cut at a rune
// boundary with the original length appended when it does not fit. The
// result is valid UTF-8, at most MaxMarked bytes, and never contains a
// character that could reorder or hide text.
func Mark(v string) string {
	const prefix = "[invalid] "
	suffix := fmt.Sprintf("…(%d bytes)", len(v))
	var b strings.Builder
	b.WriteString(prefix)
	budget := MaxMarked - len(prefix) - len(suffix)
	cut := false
	for i := 0; i < len(v); {
		r, size := utf8.DecodeRuneInString(v[i:])
		var piece string
		switch {
		case r == utf8.RuneError && size <= 1:
			piece = fmt.Sprintf(`\x%02x`, v[i])
		case hidden(r) || r == '\\':
			if r == '\\' {
				piece = `\\`
			} else {
				piece = fmt.Sprintf(`\u{%04X}`, r)
			}
		default:
			piece = v[i : i+size]
		}
		if b.Len()-len(prefix)+len(piece) > budget {
			cut = true
			break
		}
		b.WriteString(piece)
		i += size
	}
	if cut {
		b.WriteString(suffix)
	}
	return b.String()
}

// Safe returns v unchanged when it is valid UTF-8 of at most limit bytes
// without hidden characters, and Mark(v) otherwise. Audit rows use it as a
// last line of defence for every text they carry.
func Safe(v string, limit int) string {
	if len(v) <= limit && utf8.ValidString(v) && strings.IndexFunc(v, hidden) < 0 {
		return v
	}
	return Mark(v)
}

// hidden reports characters that do not show as themselves: C0 and C1
// controls, DEL, and format characters (bidi embeddings, overrides and
// isolates, zero-width characters, the BOM).
func hidden(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == utf8.RuneError
}

func isIDRune(r rune) bool {
	return r == '-' || r == '_' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
}
