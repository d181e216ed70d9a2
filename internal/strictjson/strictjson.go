package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// DefaultMaxDepth is the nesting limit when a caller passes 0. It bounds
// the envelope (a REST body, a JSON-RPC message), so it sits well above
// internal/schema's default limit for a command's input (32): an input
// nested too deeply inside a well-formed envelope is refused by the
// pipeline, which audits the attempt, rather than here.
const DefaultMaxDepth = 128

// The rules a document can break. They are the violation rule ids
// internal/schema uses, so a refusal reads the same on every channel.
const (
	// RuleSyntax: not JSON, no value at all, or data after the value.
	RuleSyntax = "schema.syntax"
	// RuleTooDeep: objects and arrays nested deeper than the limit.
	RuleTooDeep = "schema.too_deep"
	// RuleDuplicateKey: an object names the same member twice (compared
	// after unescaping, so "a" and "\u0061" are the same name).
	RuleDuplicateKey = "schema.duplicate_key"
	// RuleUTF8: bytes that are not valid UTF-8.
	RuleUTF8 = "schema.utf8"
)

// maxPointer bounds Error.Pointer: member names come from the caller, and
// a pointer is echoed in problem bodies and audit rows.
const maxPointer = 256

// Error is the first rule a document breaks. Message never repeats the
// document's content; Pointer may name members of it.
type Error struct {
	// Rule is one of the Rule* ids.
	Rule string
	// Pointer is the RFC 6901 pointer of the offending member or value,
	// or of the deepest enclosing one that fits in 256 bytes; "" is the
	// whole document.
	Pointer string
	// Message explains the rule to a client.
	Message string
}

func (e *Error) Error() string {
	p := e.Pointer
	if p == "" {
		p = "/"
	}
	return "strictjson: " + p + ": " + e.Message + " [" + e.Rule + "]"
}

// ErrEmpty is returned for input that holds no JSON value at all (nothing,
// or only whitespace). It is an *Error with RuleSyntax; callers for whom an
// empty body means "no body" test for it with errors.Is.
var ErrEmpty = &Error{Rule: RuleSyntax, Message: "the document holds no JSON value"}

// Check reports the first rule data breaks, as an *Error, or nil when data
// is exactly one strict JSON value. maxDepth <= 0 means DefaultMaxDepth.
func Check(data []byte, maxDepth int) error {
	if maxDepth <= 0 {
		maxDepth = DefaultMaxDepth
	}
	if sound(data, maxDepth) {
		return nil
	}
	return CheckReader(bytes.NewReader(data), maxDepth)
}

// maxQuickMembers bounds the members of one object that sound compares
// pairwise; a larger object is left to the token checker.
const maxQuickMembers = 64

// sound reports, without allocating for a typical document, that data is
// one strict JSON value within maxDepth. False means "not shown here": the
// caller runs the token checker, which names the broken rule (or accepts a
// document sound declines, such as one with escaped member names).
func sound(data []byte, maxDepth int) bool {
	if !utf8.Valid(data) || !json.Valid(data) {
		return false
	}
	// data is valid JSON: a string is a member name exactly when a colon
	// follows it, and belongs to the innermost open container, an object.
	var (
		frameBuf [32]int    // per open container, where its names start in names
		nameBuf  [64][]byte // the names of the open objects' members so far
		frames   = frameBuf[:0]
		names    = nameBuf[:0]
	)
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '{', '[':
			if len(frames) >= maxDepth {
				return false
			}
			frames = append(frames, len(names))
		case '}', ']':
			names = names[:frames[len(frames)-1]]
			frames = frames[:len(frames)-1]
		case '"':
			start := i + 1
			escaped := false
			for i++; data[i] != '"'; i++ {
				if data[i] == '\\' {
					escaped = true
					i++
				}
			}
			name := data[start:i]
			j := i + 1
			for j < len(data) && isSpace(data[j]) {
				j++
			}
			if j == len(data) || data[j] != ':' {
				continue // a string value
			}
			if escaped {
				return false // compared after unescaping, by the token checker
			}
			members := names[frames[len(frames)-1]:]
			if len(members) >= maxQuickMembers {
				return false
			}
			for _, m := range members {
				if bytes.Equal(m, name) {
					return false
				}
			}
			names = append(names, name)
		}
	}
	return true
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// CheckReader is Check over a stream. It stops reading at the first
// broken rule, so a deep or malformed document costs no more than its
// offending prefix; the caller bounds the stream's size. An error reading
// r (other than io.EOF) is returned as it is, not as an *Error.
func CheckReader(r io.Reader, maxDepth int) error {
	if maxDepth <= 0 {
		maxDepth = DefaultMaxDepth
	}
	ur := &utf8Reader{r: r}
	dec := json.NewDecoder(ur)
	dec.UseNumber() // numbers are checked for syntax, never converted
	c := checker{maxDepth: maxDepth}
	for {
		tok, err := dec.Token()
		if err != nil {
			return c.fail(err, ur)
		}
		if c.done {
			return &Error{Rule: RuleSyntax, Message: "the document has data after its JSON value"}
		}
		if e := c.token(tok); e != nil {
			return e
		}
	}
}

// frame is one open object or array.
type frame struct {
	object bool
	keys   map[string]struct{}
	key    string // the current member's name
	index  int    // the current element's index
	// wantKey is true in an object between members.
	wantKey bool
}

type checker struct {
	maxDepth int
	stack    []frame
	seen     bool // a value has started
	done     bool // the top-level value is complete
}

func (c *checker) token(tok json.Token) *Error {
	c.seen = true
	if n := len(c.stack); n > 0 && c.stack[n-1].wantKey {
		f := &c.stack[n-1]
		if d, ok := tok.(json.Delim); ok && d == '}' {
			c.pop()
			return nil
		}
		key, _ := tok.(string) // the decoder only yields strings here
		if _, dup := f.keys[key]; dup {
			f.key = key
			return &Error{Rule: RuleDuplicateKey, Pointer: c.pointer(len(c.stack)), Message: "an object names the same member twice"}
		}
		f.keys[key] = struct{}{}
		f.key, f.wantKey = key, false
		return nil
	}
	switch tok {
	case json.Delim('{'), json.Delim('['):
		if len(c.stack) >= c.maxDepth {
			return &Error{Rule: RuleTooDeep, Pointer: c.pointer(len(c.stack)),
				Message: "the document nests objects and arrays deeper than " + strconv.Itoa(c.maxDepth) + " levels"}
		}
		obj := tok == json.Delim('{')
		f := frame{object: obj, wantKey: obj}
		if obj {
			f.keys = map[string]struct{}{}
		}
		c.stack = append(c.stack, f)
	case json.Delim('}'), json.Delim(']'):
		c.pop()
	default:
		c.valueDone()
	}
	return nil
}

func (c *checker) pop() {
	c.stack = c.stack[:len(c.stack)-1]
	c.valueDone()
}

// valueDone moves past a complete value: to the next element or member of
// the enclosing container, or to the end of the document.
func (c *checker) valueDone() {
	if len(c.stack) == 0 {
		c.done = true
		return
	}
	f := &c.stack[len(c.stack)-1]
	if f.object {
		f.wantKey = true
	} else {
		f.index++
	}
}

// pointer names the current position within the first n open frames.
func (c *checker) pointer(n int) string {
	var b strings.Builder
	for _, f := range c.stack[:n] {
		var seg string
		if f.object {
			seg = "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(f.key)
		} else {
			seg = "/" + strconv.Itoa(f.index)
		}
		if b.Len()+len(seg) > maxPointer {
			break
		}
		b.WriteString(seg)
	}
	return b.String()
}

// fail classifies an error of the decoder.
func (c *checker) fail(err error, ur *utf8Reader) error {
	var ue *utf8Error
	switch {
	case errors.As(err, &ue):
		return &Error{Rule: RuleUTF8, Message: "the document is not valid UTF-8"}
	case ur.readErr != nil:
		return ur.readErr
	case errors.Is(err, io.EOF) && c.done:
		return nil
	case errors.Is(err, io.EOF) && !c.seen:
		return ErrEmpty
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return &Error{Rule: RuleSyntax, Message: "the document ends inside its JSON value"}
	case c.done:
		return &Error{Rule: RuleSyntax, Message: "the document has data after its JSON value"}
	}
	return &Error{Rule: RuleSyntax, Message: "the document is not valid JSON"}
}

// utf8Error is what utf8Reader reports for invalid bytes.
type utf8Error struct{ offset int64 }

func (e *utf8Error) Error() string { return "invalid UTF-8 at byte " + strconv.FormatInt(e.offset, 10) }

// utf8Reader fails a read that hands out invalid UTF-8, before the
// decoder (which would silently replace it with U+FFFD) sees the bytes. A
// sequence split across reads is held until it completes.
type utf8Reader struct {
	r       io.Reader
	pending [utf8.UTFMax]byte
	npend   int
	offset  int64 // of pending[0] in the stream
	readErr error // a failure of r itself, kept apart from syntax errors
}

func (u *utf8Reader) Read(p []byte) (int, error) {
	n, err := u.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		u.readErr = err
	}
	// Validate the held tail followed by the new bytes.
	buf := make([]byte, 0, u.npend+n)
	buf = append(buf, u.pending[:u.npend]...)
	buf = append(buf, p[:n]...)
	i := 0
	for i < len(buf) {
		if buf[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, size := utf8.DecodeRune(buf[i:])
		if r == utf8.RuneError && size == 1 {
			if err == nil && !utf8.FullRune(buf[i:]) {
				break // the rest of the sequence is in the next read
			}
			return 0, &utf8Error{offset: u.offset + int64(i)}
		}
		i += size
	}
	u.npend = copy(u.pending[:], buf[i:])
	u.offset += int64(i)
	return n, err
}
