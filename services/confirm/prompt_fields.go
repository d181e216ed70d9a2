package confirm

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/mandate-dev/mandate/internal/facts"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// FieldKind says how a PromptField's value was read from its declaration.
type FieldKind string

// The field kinds.
const (
	// KindText is free text the caller wrote (a reason, a title, a note):
	// a string the declaration does not constrain to a shape. An agent can
	// put anything in it, so it is shown apart, as the caller's words.
	KindText FieldKind = "text"
	// KindIdentifier is a string the declaration constrains to a shape (an
	// anchored pattern, a format such as uuid or email, base64 bytes).
	KindIdentifier FieldKind = "identifier"
	// KindEnum is one of the declared enum values; Value is readable, Raw
	// the value's name.
	KindEnum FieldKind = "enum"
	// KindMoney is an amount with its currency (a message with
	// currency_code and amount_minor); Value is formatted with the
	// currency's minor-unit exponent, Raw the amount in minor units.
	KindMoney FieldKind = "money"
	// KindTimestamp is an RFC 3339 instant; Value is readable in UTC, Raw
	// the value as sent.
	KindTimestamp FieldKind = "timestamp"
	// KindNumber is a number (JSON number or a string-encoded integer).
	KindNumber FieldKind = "number"
	// KindBoolean is yes or no.
	KindBoolean FieldKind = "boolean"
	// KindNull is an explicit null.
	KindNull FieldKind = "null"
	// KindEmpty is an empty object or list.
	KindEmpty FieldKind = "empty"
	// KindWithheld is a sensitive value: Value is WithheldValue.
	KindWithheld FieldKind = "withheld"
)

// PromptField is one argument of a prompt as the approver sees it: labelled
// and read by the declaration, never by what the caller claims. Every text
// in it is neutralised (see Neutralise).
type PromptField struct {
	// Pointer is the JSON pointer of the value in the arguments.
	Pointer string `json:"pointer"`
	// Label is the declared title, or the field names along the path made
	// readable ("Amount", "Lines › #1 › Category"). A map key, which the
	// caller chose, appears quoted.
	Label string `json:"label"`
	// Description is the declared description, if any.
	Description string `json:"description,omitempty"`
	// Kind says how Value was read.
	Kind FieldKind `json:"kind"`
	// Value is what the approver reads: the formatted amount, the readable
	// enum value or instant, the text itself.
	Value string `json:"value"`
	// Raw is the value as sent where Value differs from it (the amount in
	// minor units, the enum name, the timestamp as written).
	Raw string `json:"raw,omitempty"`
	// Neutralised reports that the value held control, bidi or invisible
	// characters, now shown as markers such as ⟦U+202E⟧.
	Neutralised bool `json:"neutralised,omitempty"`
	// Problem says why the value does not read as declared (an amount that
	// is no whole number, a value the declaration does not know); the value
	// is then shown as sent.
	Problem string `json:"problem,omitempty"`
}

// AgentText reports whether the field is free text the caller wrote.
func (f PromptField) AgentText() bool { return f.Kind == KindText }

// Line is the field as one line of plain text, as the MCP confirmation form
// shows it: "Amount: 25.00 EUR (2500 minor units)". Free text is quoted and
// said to be written by writer (e.g. "the agent"); neutralised values and
// problems say so. Neutralise keeps a line on one line: a value cannot
// start a line of its own.
func (f PromptField) Line(writer string) string {
	var b strings.Builder
	b.WriteString(f.Label)
	if f.AgentText() {
		b.WriteString(" (free text written by " + writer + ", not checked)")
	}
	b.WriteString(": ")
	if f.AgentText() {
		b.WriteString("“" + f.Value + "”")
	} else {
		b.WriteString(f.Value)
	}
	if f.Raw != "" {
		b.WriteString(" (" + f.Raw + ")")
	}
	if f.Problem != "" {
		b.WriteString(" [! " + f.Problem + "]")
	}
	if f.Neutralised {
		b.WriteString(" [! " + NeutralisedNote + "]")
	}
	return b.String()
}

// NeutralisedNote explains the markers of a neutralised value.
const NeutralisedNote = "contains control or invisible characters, shown as ⟦U+…⟧ markers"

// Limits of the field rendering.
const (
	maxFields     = 500
	maxFieldDepth = 32
)

// PromptFields renders arguments (a JSON object, as in Prompt.ArgumentsJSON)
// field by field by what cmd's descriptors declare (cmd.Facts, compiled
// when its manifest loaded). Values at the withheld pointers and at the
// declaration's sensitive fields are withheld. A nil cmd, or one without
// facts (declared outside a manifest), renders without a declaration:
// every string is then treated as the caller's free text, and only an
// object of exactly currency_code and amount_minor reads as money. It is a
// pure function; arguments that do not parse come back as one field, shown
// as sent and marked.
func PromptFields(cmd *manifest.Command, argumentsJSON string, withheld []string) []PromptField {
	var sensitive []string
	if cmd != nil {
		sensitive = sensitiveOf(cmd)
	}
	v, set, err := parseArguments(argumentsJSON, withheld, sensitive)
	if err != nil {
		text, marked := Neutralise(argumentsJSON)
		return []PromptField{{Pointer: "", Label: "Arguments", Kind: KindText, Value: text, Neutralised: marked,
			Problem: "the arguments are not a JSON object; shown as sent"}}
	}
	return fieldsOf(cmd, v, set)
}

// fieldsOf renders the parsed (and withheld) arguments.
func fieldsOf(cmd *manifest.Command, v any, withheld map[string]bool) []PromptField {
	r := &fieldRenderer{withheld: withheld}
	var root *slot
	if cmd != nil && cmd.Facts() != nil {
		r.declared = true
		root = &slot{root: cmd.Facts().Input}
	}
	r.walk(v, root, r.declared, "", nil, 0)
	if r.more > 0 {
		r.out = append(r.out, PromptField{Label: "More arguments", Kind: KindText,
			Value:   fmt.Sprintf("%d more values are not listed", r.more),
			Problem: "too many values to list; read the exact arguments"})
	}
	return r.out
}

type fieldRenderer struct {
	// declared says whether the command has a declaration at all.
	declared bool
	withheld map[string]bool
	out      []PromptField
	more     int
}

// slot is what the declaration says of one place in the arguments: the
// request message itself (root), a field's value, or one element (list
// item, map value) of a field.
type slot struct {
	root  *facts.MessageFacts
	field *facts.Field
	elem  bool
}

// container reports whether the slot holds a field's list or map, not one
// of its values.
func (s *slot) container() bool {
	return s.field != nil && !s.elem && (s.field.List || s.field.Map)
}

// kind is the kind of the value at the slot; "" for a list or map.
func (s *slot) kind() facts.Kind {
	switch {
	case s.root != nil:
		return facts.Message
	case s.container():
		return ""
	}
	return s.field.Kind
}

// message is the declared message of the value at the slot, nil if none.
func (s *slot) message() *facts.MessageFacts {
	switch {
	case s.root != nil:
		return s.root
	case s.container():
		return nil
	}
	return s.field.Message
}

// description is what the declaration says of the value at the slot.
func (s *slot) description() string {
	switch {
	case s.root != nil:
		return ""
	case s.elem:
		return s.field.ElementDescription
	}
	return s.field.Description
}

// sensitive reports a field declared sensitive: its value is withheld
// whole.
func (s *slot) sensitive() bool {
	return s.field != nil && !s.elem && s.field.Sensitive
}

// expects is the JSON type the slot expects, "" where a number is
// acceptable.
func (s *slot) expects() string {
	if s.container() {
		if s.field.List {
			return "array"
		}
		return "object"
	}
	switch s.kind() {
	case facts.Text, facts.Identifier, facts.Enum, facts.Timestamp:
		return "string"
	case facts.Boolean:
		return "boolean"
	case facts.Message, facts.Money:
		return "object"
	case facts.Null:
		return "null"
	}
	return ""
}

// walk renders node at pointer at. s is its slot (nil: none); declared
// says whether a declaration covers it at all (false below a key the
// declaration does not know, inside JSON it leaves open, or without a
// declaration).
func (r *fieldRenderer) walk(node any, s *slot, declared bool, at string, labels []string, depth int) {
	label := strings.Join(labels, " › ")
	if label == "" {
		label = "Arguments"
	}
	f := PromptField{Pointer: at, Label: label}
	if s != nil && len(labels) > 0 {
		if d := s.description(); d != "" {
			f.Description, _ = Neutralise(d)
		}
	}
	if declared && s == nil && at != "" {
		f.Problem = "not declared by the command"
		declared = false
	}
	if r.withheld[at] || (s != nil && s.sensitive()) {
		f.Kind, f.Value = KindWithheld, WithheldValue
		r.add(f)
		return
	}
	if s != nil && s.kind() == facts.JSON {
		// JSON the declaration leaves open (Struct, Value, Any): its
		// contents are the caller's.
		declared = false
	}
	if depth > maxFieldDepth {
		f.Kind, f.Value = KindText, "…"
		f.Problem = "nested too deeply to list; read the exact arguments"
		r.add(f)
		return
	}
	switch n := node.(type) {
	case map[string]any:
		if isMoney(s, declared, n) {
			r.add(money(f, n))
			return
		}
		if len(n) == 0 {
			if at != "" { // no arguments at all is no field
				f.Kind, f.Value = KindEmpty, "(empty)"
				r.add(f)
			}
			return
		}
		keys := make([]string, 0, len(n))
		for k := range n {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			child, label := r.property(s, declared, k)
			childLabels := append(slices.Clip(labels), label)
			r.walk(n[k], child, declared, at+"/"+escapePointer(k), childLabels, depth+1)
		}
	case []any:
		if len(n) == 0 {
			f.Kind, f.Value = KindEmpty, "(empty)"
			r.add(f)
			return
		}
		var items *slot
		if declared && s != nil && s.container() && s.field.List {
			items = &slot{field: s.field, elem: true}
		}
		for i, child := range n {
			childLabels := append(slices.Clip(labels), "#"+strconv.Itoa(i+1))
			r.walk(child, items, declared && items != nil, at+"/"+strconv.Itoa(i), childLabels, depth+1)
		}
	case string:
		r.add(stringField(f, s, declared, n))
	case json.Number:
		f.Kind = KindNumber
		f.Value, f.Neutralised = Neutralise(n.String())
		if declared && s != nil {
			if want := s.expects(); want != "" {
				f.Problem = "a number where the declaration expects " + want
			}
		}
		r.add(f)
	case bool:
		f.Kind, f.Value = KindBoolean, "no"
		if n {
			f.Value = "yes"
		}
		r.add(f)
	case nil:
		f.Kind, f.Value = KindNull, "null (not set)"
		r.add(f)
	}
}

func (r *fieldRenderer) add(f PromptField) {
	if len(r.out) >= maxFields {
		r.more++
		return
	}
	r.out = append(r.out, f)
}

// property returns the slot of key k of an object at slot s and its label:
// a declared field's name made readable or, for a map entry or a key the
// declaration does not know, the quoted key.
func (r *fieldRenderer) property(s *slot, declared bool, k string) (*slot, string) {
	if !r.declared {
		// Without a declaration the names are the request's own (which the
		// executor checked against the schema).
		return nil, readableName(k)
	}
	key, _ := Neutralise(k)
	if !declared || s == nil {
		return nil, "“" + key + "”"
	}
	if f := s.message().Field(k); f != nil {
		return &slot{field: f}, readableName(k)
	}
	if s.container() && s.field.Map {
		return &slot{field: s.field, elem: true}, "“" + key + "”"
	}
	return nil, "“" + key + "”"
}

// stringField reads a string by its slot.
func stringField(f PromptField, s *slot, declared bool, v string) PromptField {
	text, marked := Neutralise(v)
	f.Value, f.Neutralised = text, marked
	if !declared || s == nil {
		f.Kind = KindText
		return f
	}
	switch s.kind() {
	case facts.Enum:
		f.Kind = KindEnum
		value, ok := s.field.Value(v)
		if !ok {
			f.Problem = "not one of the declared values"
			return f
		}
		names := make([]string, len(s.field.Values))
		for i, d := range s.field.Values {
			names[i] = d.Name
		}
		f.Value, f.Raw = readableEnum(v, names), v
		if value.Description != "" {
			// The approver reads what the chosen value means.
			f.Description, _ = Neutralise(value.Description)
		}
		return f
	case facts.Timestamp:
		f.Kind = KindTimestamp
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil || marked {
			f.Problem = "not an RFC 3339 timestamp; shown as sent"
			return f
		}
		f.Value, f.Raw = t.UTC().Format("Mon 2 January 2006, 15:04:05.999999999 UTC"), v
		return f
	case facts.Number:
		f.Kind = KindNumber
		if !numberRE.MatchString(v) {
			f.Problem = "not a number; shown as sent"
		}
		return f
	}
	switch {
	case marked || strings.ContainsFunc(v, unicode.IsSpace) || len(v) > 256:
		// Whatever the declaration says, a value with spaces or hidden
		// characters is read as the caller's words.
		f.Kind = KindText
	case s.kind() == facts.Identifier:
		f.Kind = KindIdentifier
	default:
		f.Kind = KindText
	}
	return f
}

var numberRE = regexp.MustCompile(`^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$`)

// money reads a {currency_code, amount_minor} object.
func money(f PromptField, n map[string]any) PromptField {
	f.Kind = KindMoney
	code, codeOK := n["currency_code"].(string)
	var amount string
	switch a := n["amount_minor"].(type) {
	case string:
		amount = a
	case json.Number:
		amount = a.String()
	}
	codeText, m1 := Neutralise(code)
	amountText, m2 := Neutralise(amount)
	f.Neutralised = m1 || m2
	f.Value = strings.TrimSpace(amountText + " " + codeText)
	switch {
	case !codeOK || !currencyRE.MatchString(code):
		f.Problem = "the currency is not an ISO 4217 code; shown as sent"
	case amount == "" || !minorRE.MatchString(amount):
		f.Problem = "amount_minor is not a whole number of minor units; shown as sent"
	default:
		f.Value = formatMinor(amount, currencyExponent(code)) + " " + code
		f.Raw = amount + " minor units"
	}
	return f
}

var (
	currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)
	minorRE    = regexp.MustCompile(`^-?[0-9]{1,40}$`)
)

// isMoney reports whether an object reads as money: the declaration says
// it is (facts.Money) and it has no key but currency_code and
// amount_minor or, without a declaration, it has exactly those keys.
func isMoney(s *slot, declared bool, n map[string]any) bool {
	if declared {
		if s == nil || s.kind() != facts.Money {
			return false
		}
		for k := range n {
			if k != "currency_code" && k != "amount_minor" {
				return false
			}
		}
		return true
	}
	_, c := n["currency_code"]
	_, a := n["amount_minor"]
	return len(n) == 2 && c && a
}

// formatMinor formats a whole number of minor units with exp decimals and
// thousands separators: ("-999999", 2) → "-9,999.99".
func formatMinor(minor string, exp int) string {
	neg := strings.HasPrefix(minor, "-")
	digits := strings.TrimLeft(strings.TrimPrefix(minor, "-"), "0")
	if len(digits) <= exp {
		digits = strings.Repeat("0", exp-len(digits)+1) + digits
	}
	whole, frac := digits[:len(digits)-exp], digits[len(digits)-exp:]
	var b strings.Builder
	if neg && strings.Trim(digits, "0") != "" {
		b.WriteByte('-')
	}
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if exp > 0 {
		b.WriteString("." + frac)
	}
	return b.String()
}

// currencyExponent is the ISO 4217 minor-unit exponent of code: 2 unless
// listed.
func currencyExponent(code string) int {
	switch code {
	case "BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND", "VUV", "XAF", "XOF", "XPF":
		return 0
	case "BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND":
		return 3
	case "CLF", "UYW":
		return 4
	}
	return 2
}

// readableName turns a proto field name into a label: "ticket_id" →
// "Ticket ID", "amount_minor" → "Amount minor".
func readableName(name string) string {
	words := strings.FieldsFunc(name, func(r rune) bool { return r == '_' || r == '-' || r == '.' })
	for i, w := range words {
		switch lw := strings.ToLower(w); lw {
		case "id", "ids", "url", "uri", "ip", "api", "iban", "sku", "vat", "utc", "uuid":
			words[i] = strings.ToUpper(lw)
			if lw == "ids" {
				words[i] = "IDs"
			}
		default:
			words[i] = lw
		}
	}
	if len(words) == 0 {
		text, _ := Neutralise(name)
		return "“" + text + "”"
	}
	r, n := utf8.DecodeRuneInString(words[0])
	words[0] = string(unicode.ToUpper(r)) + words[0][n:]
	text, _ := Neutralise(strings.Join(words, " "))
	return text
}

// readableEnum strips the prefix all declared values share (the proto enum
// name) and makes the rest readable: "EXPENSE_CATEGORY_TRAVEL" → "Travel".
func readableEnum(v string, names []string) string {
	prefix := strings.Split(v, "_")
	prefix = prefix[:len(prefix)-1]
	for _, n := range names {
		parts := strings.Split(n, "_")
		parts = parts[:len(parts)-1]
		i := 0
		for i < len(prefix) && i < len(parts) && prefix[i] == parts[i] {
			i++
		}
		prefix = prefix[:i]
	}
	rest := strings.Split(v, "_")[len(prefix):]
	text := strings.ToLower(strings.Join(rest, " "))
	if text == "" {
		text, _ = Neutralise(v)
		return text
	}
	r, n := utf8.DecodeRuneInString(text)
	text, _ = Neutralise(string(unicode.ToUpper(r)) + text[n:])
	return text
}

// Neutralise makes text safe to show to a human: every character that
// could reorder, hide or disguise what is shown — C0 and C1 controls
// (newlines and tabs too), bidi embeddings, overrides, isolates and marks,
// zero-width and other invisible format characters, line and paragraph
// separators, variation selectors, tag characters, invisible fillers — is
// replaced by a visible marker such as ⟦U+202E⟧. The marker brackets
// themselves are marked too, so that a caller cannot fake a marker. It
// reports whether anything was replaced.
func Neutralise(s string) (string, bool) {
	if !strings.ContainsFunc(s, needsMarker) {
		return s, false
	}
	var b strings.Builder
	for _, r := range s {
		if needsMarker(r) {
			fmt.Fprintf(&b, "⟦U+%04X⟧", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String(), true
}

// needsMarker reports whether r is shown as a marker.
func needsMarker(r rune) bool {
	switch {
	case r == utf8.RuneError:
		return true
	case unicode.Is(unicode.Cc, r), unicode.Is(unicode.Cf, r), unicode.Is(unicode.Zl, r), unicode.Is(unicode.Zp, r):
		// Cf holds the bidi controls (U+061C, U+200E/F, U+202A–U+202E,
		// U+2066–U+2069), zero-width characters, soft hyphen, BOM and tags.
		return true
	case unicode.Is(unicode.Variation_Selector, r):
		return true
	case r == 0x115F, r == 0x1160, r == 0x3164, r == 0xFFA0, r == 0x17B4, r == 0x17B5, r == 0x180E, r == 0x2800:
		// Fillers and blanks that render as nothing.
		return true
	case unicode.Is(unicode.Co, r), unicode.Is(unicode.Cs, r), !unicode.IsGraphic(r) && r != ' ':
		// Private use, surrogates and unassigned code points render as
		// nothing the approver can read.
		return true
	case r == '⟦', r == '⟧':
		return true
	}
	return false
}

// EscapeInvisibleJSON writes every character Neutralise would mark (except
// the marker brackets) of encoded JSON as a \u escape, so that JSON shown
// to a human cannot reorder or hide anything and still decodes to the same
// value. JSON outside strings is ASCII, so the whole text can be escaped.
// It is idempotent.
func EscapeInvisibleJSON(js string) string {
	if !strings.ContainsFunc(js, func(r rune) bool { return needsMarker(r) && r != '⟦' && r != '⟧' }) {
		return js
	}
	var b strings.Builder
	for _, r := range js {
		if !needsMarker(r) || r == '⟦' || r == '⟧' {
			b.WriteRune(r)
			continue
		}
		if r > 0xFFFF {
			r1, r2 := utf16Pair(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
			continue
		}
		fmt.Fprintf(&b, `\u%04x`, r)
	}
	return b.String()
}

func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xD800 + (r>>10)&0x3FF, 0xDC00 + r&0x3FF
}
