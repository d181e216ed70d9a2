package schema

import (
	"encoding/json"
	"errors"
	"unicode/utf16"
	"unicode/utf8"
)

// maxNesting is encoding/json's bound on nested arrays and objects.
const maxNesting = 10000

var (
	errSyntax    = errors.New("schema: input is not valid JSON")
	errTrailing  = errors.New("schema: input has data after the JSON value")
	errNotObject = errors.New("schema: input is not a JSON object")
)

// parseObject reads b as encoding/json's Decoder does with UseNumber — the
// first JSON value into an any (objects as map[string]any, arrays as
// []any, strings with invalid UTF-8 and lone surrogates replaced by
// U+FFFD, numbers as the json.Number of their text, the last of duplicate
// keys kept) — in one pass and without the Decoder's buffers, and what
// follows it as Decoder.More sees it: errTrailing when another value could
// start there (a ']' or '}' is left to protojson, which refuses it). A
// value that is not an object is errNotObject.
func parseObject(b []byte) (map[string]any, error) {
	p := parser{b: b}
	p.space()
	v, ok := p.value(0)
	if !ok {
		return nil, errSyntax
	}
	p.space()
	if p.i < len(p.b) && p.b[p.i] != ']' && p.b[p.i] != '}' {
		return nil, errTrailing
	}
	obj, isObj := v.(map[string]any)
	if !isObj {
		return nil, errNotObject
	}
	return obj, nil
}

// parseFirst reads the first JSON value of b as encoding/json's
// Decoder.Decode does (UseNumber), ignoring what follows it.
func parseFirst(b []byte) (any, bool) {
	p := parser{b: b}
	p.space()
	return p.value(0)
}

type parser struct {
	b []byte
	i int
}

func (p *parser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// value reads one value at depth nested arrays and objects.
func (p *parser) value(depth int) (any, bool) {
	if p.i >= len(p.b) {
		return nil, false
	}
	switch c := p.b[p.i]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, ok := p.str()
		if !ok {
			return nil, false
		}
		return s, true
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	default:
		for _, lit := range [...]struct {
			text string
			v    any
		}{{"true", true}, {"false", false}, {"null", nil}} {
			if len(p.b)-p.i >= len(lit.text) && string(p.b[p.i:p.i+len(lit.text)]) == lit.text {
				p.i += len(lit.text)
				return lit.v, true
			}
		}
		return nil, false
	}
}

func (p *parser) object(depth int) (any, bool) {
	if depth > maxNesting {
		return nil, false
	}
	p.i++ // '{'
	m := map[string]any{}
	p.space()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return m, true
	}
	for {
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return nil, false
		}
		k, ok := p.str()
		if !ok {
			return nil, false
		}
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return nil, false
		}
		p.i++
		p.space()
		v, ok := p.value(depth)
		if !ok {
			return nil, false
		}
		m[k] = v
		p.space()
		if p.i >= len(p.b) {
			return nil, false
		}
		switch p.b[p.i] {
		case ',':
			p.i++
			p.space()
		case '}':
			p.i++
			return m, true
		default:
			return nil, false
		}
	}
}

func (p *parser) array(depth int) (any, bool) {
	if depth > maxNesting {
		return nil, false
	}
	p.i++ // '['
	a := []any{}
	p.space()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return a, true
	}
	for {
		v, ok := p.value(depth)
		if !ok {
			return nil, false
		}
		a = append(a, v)
		p.space()
		if p.i >= len(p.b) {
			return nil, false
		}
		switch p.b[p.i] {
		case ',':
			p.i++
			p.space()
		case ']':
			p.i++
			return a, true
		default:
			return nil, false
		}
	}
}

func digit(c byte) bool { return c >= '0' && c <= '9' }

// number reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? as the
// json.Number of its text.
func (p *parser) number() (any, bool) {
	b, start := p.b, p.i
	i := p.i
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && digit(b[i]) {
			i++
		}
	default:
		return nil, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !digit(b[i]) {
			return nil, false
		}
		for i < len(b) && digit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !digit(b[i]) {
			return nil, false
		}
		for i < len(b) && digit(b[i]) {
			i++
		}
	}
	p.i = i
	return json.Number(b[start:i]), true
}

// str reads a string (p.b[p.i] is its quote) as encoding/json unquotes it.
func (p *parser) str() (string, bool) {
	b := p.b
	i := p.i + 1
	// The common case: no escapes, valid UTF-8, no control characters.
	for i < len(b) {
		c := b[i]
		if c == '"' {
			s := string(b[p.i+1 : i])
			p.i = i + 1
			return s, true
		}
		if c == '\\' || c < ' ' {
			break
		}
		if c < utf8.RuneSelf {
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			break
		}
		i += size
	}
	out := make([]byte, 0, i-p.i+8)
	out = append(out, b[p.i+1:i]...)
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			p.i = i + 1
			return string(out), true
		case c < ' ':
			return "", false
		case c == '\\':
			if i+1 >= len(b) {
				return "", false
			}
			switch e := b[i+1]; e {
			case '"', '\\', '/':
				out = append(out, e)
				i += 2
			case 'b':
				out = append(out, '\b')
				i += 2
			case 'f':
				out = append(out, '\f')
				i += 2
			case 'n':
				out = append(out, '\n')
				i += 2
			case 'r':
				out = append(out, '\r')
				i += 2
			case 't':
				out = append(out, '\t')
				i += 2
			case 'u':
				r := hex4(b[i:])
				if r < 0 {
					return "", false
				}
				i += 6
				if utf16.IsSurrogate(r) {
					if r2 := hex4(b[i:]); r2 >= 0 {
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							out = utf8.AppendRune(out, dec)
							i += 6
							break
						}
					}
					r = utf8.RuneError
				}
				out = utf8.AppendRune(out, r)
			default:
				return "", false
			}
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				out = utf8.AppendRune(out, utf8.RuneError)
			} else {
				out = append(out, b[i:i+size]...)
			}
			i += size
		}
	}
	return "", false
}

// hex4 is the rune of a \uXXXX escape at the start of b, or -1.
func hex4(b []byte) rune {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range b[2:6] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}
