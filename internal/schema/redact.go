package schema

import (
	"encoding/json"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Withheld replaces a sensitive value in redacted JSON.
const Withheld = "[withheld]"

// Redact returns input with the values at the given JSON pointers (proto
// field names; "*" matches any list element or map key) replaced by
// Withheld, and the concrete pointers that were withheld, sorted. Input that
// is not a JSON object is returned as an empty object: redaction never
// passes through what it cannot read. The JSON is encoding/json's
// (json.Marshal of the decoded document: compact, keys sorted, HTML
// characters escaped).
func Redact(input []byte, pointers []string) ([]byte, []string) {
	doc, ok := parseFirst(input)
	if !ok {
		return []byte("{}"), nil
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return []byte("{}"), nil
	}
	return redactDoc(obj, pointers, len(input))
}

// Arguments is an input as Decoder.DecodeArguments read it: the document
// it parsed once, for Redact to withhold from without parsing it again.
type Arguments struct {
	doc  map[string]any
	size int
}

// Redact is schema.Redact of the input the arguments were decoded from,
// with the same result, without reading the input a second time. It
// replaces the withheld values in the document it holds: call it once.
func (a Arguments) Redact(pointers []string) ([]byte, []string) {
	if a.doc == nil {
		return []byte("{}"), nil
	}
	return redactDoc(a.doc, pointers, a.size)
}

// redactDoc withholds the values at pointers in doc (in place) and encodes
// what is left as json.Marshal(doc) would; size is the input's length, a
// guess at the output's.
func redactDoc(doc map[string]any, pointers []string, size int) ([]byte, []string) {
	var withheld []string
	for _, p := range pointers {
		parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
		redactAt(doc, parts, "", &withheld)
	}
	out := appendDoc(make([]byte, 0, size+len(withheld)*len(Withheld)), doc)
	sort.Strings(withheld)
	return out, withheld
}

func redactAt(v any, parts []string, prefix string, withheld *[]string) {
	if len(parts) == 0 {
		return
	}
	head, rest := parts[0], parts[1:]
	visit := func(key string, child any, set func(any)) {
		p := prefix + "/" + escapePointer(key)
		if len(rest) == 0 {
			set(Withheld)
			*withheld = append(*withheld, p)
			return
		}
		redactAt(child, rest, p, withheld)
	}
	switch x := v.(type) {
	case map[string]any:
		if head == "*" {
			for k, child := range x {
				visit(k, child, func(nv any) { x[k] = nv })
			}
			return
		}
		key := strings.ReplaceAll(strings.ReplaceAll(head, "~1", "/"), "~0", "~")
		if child, ok := x[key]; ok {
			visit(key, child, func(nv any) { x[key] = nv })
		}
	case []any:
		if head != "*" {
			return
		}
		for i, child := range x {
			visit(strconv.Itoa(i), child, func(nv any) { x[i] = nv })
		}
	}
}

// appendDoc appends v, a value encoding/json decoded with UseNumber
// (objects, arrays, strings, json.Number, bools, nulls), byte for byte as
// json.Marshal encodes it: object keys sorted, strings escaped as
// appendMarshalString says. A json.Number is written as it is: the decoder
// only makes valid ones.
func appendDoc(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...)
	case bool:
		return strconv.AppendBool(b, x)
	case string:
		return appendMarshalString(b, x)
	case json.Number:
		if x == "" {
			return append(b, '0')
		}
		return append(b, x...)
	case []any:
		b = append(b, '[')
		for i, el := range x {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendDoc(b, el)
		}
		return append(b, ']')
	case map[string]any:
		var stack [16]string
		keys := stack[:0]
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendMarshalString(b, k)
			b = append(b, ':')
			b = appendDoc(b, x[k])
		}
		return append(b, '}')
	default:
		// Not a value a JSON decoder makes; encoding/json decides.
		raw, err := json.Marshal(x)
		if err != nil {
			return append(b, "null"...)
		}
		return append(b, raw...)
	}
}

// appendMarshalString appends s quoted as json.Marshal writes a string:
// the quote, the backslash and control characters escaped (short forms
// where JSON has them, \u00xx otherwise), <, > and & as \u003c, \u003e and
// \u0026, U+2028 and U+2029 as \u2028 and \u2029, and each byte of invalid
// UTF-8 as \ufffd.
func appendMarshalString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= ' ' && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigit(c>>4), hexDigit(c&0xf))
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigit(byte(r&0xf)))
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
