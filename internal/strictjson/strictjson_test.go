package strictjson_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"

	"github.com/mandate-dev/mandate/internal/strictjson"
)

func TestCheck(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	cases := []struct {
		name, in string
		rule     string // "" = accepted
		pointer  string
	}{
		{"object", `{"a":1,"b":[true,null,"x",-1.5e3],"c":{"d":{}}}`, "", ""},
		{"scalar", `"x"`, "", ""},
		{"number", ` 12345678901234567890123456789e99999 `, "", ""},
		{"surrounding whitespace", " \n\t{}\r\n ", "", ""},
		{"same key in sibling objects", `[{"a":1},{"a":2}]`, "", ""},
		{"same key at two levels", `{"a":{"a":1}}`, "", ""},
		{"unicode", `{"é":"日本語 🎉"}`, "", ""},
		{"escaped surrogate pair", `"\ud83c\udf89"`, "", ""},
		{"exactly the limit", deep(strictjson.DefaultMaxDepth), "", ""},
		{"escaped names that differ", `{"a":1,"\u0062":2,"a\"":3}`, "", ""},
		{"string values that repeat a name", `{"a":"a","b":["a","b"],"c":"c"}`, "", ""},
		{"whitespace before the colon", "{\"a\" :1,\"b\"\n:{\"a\"\t:2}}", "", ""},
		{"many members", manyMembers(100, false), "", ""},
		{"many members, the last repeated", manyMembers(100, true), strictjson.RuleDuplicateKey, "/m0"},
		{"duplicate after a closed sibling", `{"a":{"b":1},"b":2,"a":3}`, strictjson.RuleDuplicateKey, "/a"},
		{"duplicate spaced", `{"a" : 1 , "a" : 2}`, strictjson.RuleDuplicateKey, "/a"},

		{"empty", ``, strictjson.RuleSyntax, ""},
		{"whitespace", "  \n", strictjson.RuleSyntax, ""},
		{"truncated", `{"a":`, strictjson.RuleSyntax, ""},
		{"not JSON", `hello`, strictjson.RuleSyntax, ""},
		{"trailing word", `{"a":1} xyz`, strictjson.RuleSyntax, ""},
		{"two objects", `{}{}`, strictjson.RuleSyntax, ""},
		{"two scalars", `1 2`, strictjson.RuleSyntax, ""},
		{"trailing bracket", `{}]`, strictjson.RuleSyntax, ""},
		{"raw control character", "\"a\x01b\"", strictjson.RuleSyntax, ""},
		{"one past the limit", deep(strictjson.DefaultMaxDepth + 1), strictjson.RuleTooDeep, "/0/0*"},
		{"5000 deep, unterminated", strings.Repeat("[", 5000), strictjson.RuleTooDeep, "/0/0*"},
		{"5000 deep objects", strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000), strictjson.RuleTooDeep, "/a/a*"},
		{"duplicate key", `{"method":"a","method":"b"}`, strictjson.RuleDuplicateKey, "/method"},
		{"duplicate after unescaping", `{"a":1,"\u0061":2}`, strictjson.RuleDuplicateKey, "/a"},
		{"duplicate nested", `{"params":{"arguments":{"x":1,"y":2,"x":3}}}`, strictjson.RuleDuplicateKey, "/params/arguments/x"},
		{"duplicate in array element", `[0,{"k":1,"k":1}]`, strictjson.RuleDuplicateKey, "/1/k"},
		{"duplicate with pointer escapes", `{"a/b":{"c~d":1,"c~d":2}}`, strictjson.RuleDuplicateKey, "/a~1b/c~0d"},
		{"invalid UTF-8 in a string", "{\"q\":\"\xff\"}", strictjson.RuleUTF8, ""},
		{"invalid UTF-8 in a key", "{\"\xc3\x28\":1}", strictjson.RuleUTF8, ""},
		{"truncated multibyte at the end", "\"\xe2\x82", strictjson.RuleUTF8, ""},
		{"UTF-8 encoded surrogate", "\"\xed\xa0\x80\"", strictjson.RuleUTF8, ""},
		{"invalid UTF-8 after the value", "{} \xff", strictjson.RuleUTF8, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, mode := range []string{"bytes", "one byte at a time"} {
				var err error
				if mode == "bytes" {
					err = strictjson.Check([]byte(tc.in), 0)
				} else {
					err = strictjson.CheckReader(iotest.OneByteReader(strings.NewReader(tc.in)), 0)
				}
				if tc.rule == "" {
					if err != nil {
						t.Fatalf("%s: %v, want accepted", mode, err)
					}
					continue
				}
				var e *strictjson.Error
				if !errors.As(err, &e) {
					t.Fatalf("%s: %v, want *Error %s", mode, err, tc.rule)
				}
				if e.Rule != tc.rule || !pointerMatches(e.Pointer, tc.pointer) {
					t.Fatalf("%s: rule %q pointer %q (%v), want %q %q", mode, e.Rule, e.Pointer, e, tc.rule, tc.pointer)
				}
				if e.Message == "" || strings.Contains(e.Message, "method") {
					t.Fatalf("%s: message %q must explain without echoing", mode, e.Message)
				}
			}
		})
	}
}

// manyMembers is an object with n members m0, m1, …, and when repeat is
// set one more that repeats m0.
func manyMembers(n int, repeat bool) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		fmt.Fprintf(&b, `"m%d":%d,`, i, i)
	}
	if repeat {
		b.WriteString(`"m0":0,`)
	}
	return strings.TrimSuffix(b.String(), ",") + "}"
}

// TestCheckAllocations: accepting a typical JSON-RPC message, which every
// governed MCP call pays, allocates nothing.
func TestCheckAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	msg := []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"ticket.search",` +
		`"arguments":{"query":"charged twice","tags":["a","b"],"limit":10},"_meta":{"progressToken":3}}}`)
	if n := testing.AllocsPerRun(100, func() {
		if err := strictjson.Check(msg, 0); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Check allocates %v times per message, want 0", n)
	}
}

// pointerMatches compares a pointer with a want that may end in "*" (any
// continuation, for the long pointers of deep documents).
func pointerMatches(got, want string) bool {
	if p, ok := strings.CutSuffix(want, "*"); ok {
		return strings.HasPrefix(got, p) && len(got) <= 256
	}
	return got == want
}

func TestCheckEmpty(t *testing.T) {
	for _, in := range []string{"", " ", "\n\t "} {
		if err := strictjson.Check([]byte(in), 0); !errors.Is(err, strictjson.ErrEmpty) {
			t.Errorf("%q: %v, want ErrEmpty", in, err)
		}
	}
	if err := strictjson.Check([]byte(`{`), 0); errors.Is(err, strictjson.ErrEmpty) {
		t.Errorf("truncated document reported as empty")
	}
}

func TestCheckDepthLimit(t *testing.T) {
	in := []byte(`{"a":[{"b":[1]}]}`) // 4 levels
	if err := strictjson.Check(in, 4); err != nil {
		t.Fatalf("limit 4: %v", err)
	}
	var e *strictjson.Error
	if err := strictjson.Check(in, 3); !errors.As(err, &e) || e.Rule != strictjson.RuleTooDeep || e.Pointer != "/a/0/b" {
		t.Fatalf("limit 3: %v, want too_deep at /a/0/b", err)
	}
}

// TestCheckStopsEarly: a document is refused at its offending prefix,
// without reading the rest of the stream.
func TestCheckStopsEarly(t *testing.T) {
	prefix := strings.Repeat("[", strictjson.DefaultMaxDepth+1)
	r := &countingReader{r: io.MultiReader(strings.NewReader(prefix), infinite{})}
	var e *strictjson.Error
	if err := strictjson.CheckReader(r, 0); !errors.As(err, &e) || e.Rule != strictjson.RuleTooDeep {
		t.Fatalf("%v, want too_deep", err)
	}
	if r.n > 1<<20 {
		t.Fatalf("read %d bytes of an endless stream", r.n)
	}
}

func TestCheckReadError(t *testing.T) {
	boom := errors.New("boom")
	err := strictjson.CheckReader(io.MultiReader(strings.NewReader(`{"a":`), iotest.ErrReader(boom)), 0)
	if !errors.Is(err, boom) {
		t.Fatalf("%v, want the reader's error", err)
	}
	var e *strictjson.Error
	if errors.As(err, &e) {
		t.Fatalf("a read failure reported as a rule: %v", e)
	}
}

func TestPointerBounded(t *testing.T) {
	long := strings.Repeat("k", 1000)
	err := strictjson.Check([]byte(`{"a":{"`+long+`":1,"`+long+`":2}}`), 0)
	var e *strictjson.Error
	if !errors.As(err, &e) || e.Rule != strictjson.RuleDuplicateKey || e.Pointer != "/a" {
		t.Fatalf("%v, want duplicate_key at the enclosing /a", err)
	}
}

type infinite struct{}

func (infinite) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = '['
	}
	return len(p), nil
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// FuzzCheck: Check never panics; what it accepts, encoding/json accepts as
// one value of valid UTF-8 within the depth limit; what encoding/json
// accepts and Check refuses breaks the depth or duplicate-key rule; and
// the streaming and in-memory forms agree on what they accept (which
// rule a refused document breaks first may depend on how it was read).
func FuzzCheck(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `[]`, `"x"`, `1`, `{"a":1} xyz`, `{}{}`, `{"a":1,"a":2}`, `{"a":1,"\u0061":2}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"x":1,"x":2},"_meta":{}}}`,
		"{\"q\":\"\xff\"}", "\"\xe2\x82\"", strings.Repeat("[", 200) + strings.Repeat("]", 200),
		strings.Repeat(`{"a":`, 130) + "0" + strings.Repeat("}", 130), `[1,2,{"b":[null,true,false]}]`,
		`"\ud800"`, `1e999`, `-0.0e-0`, `{"a":[}`, `{"a" 1}`,
	} {
		f.Add([]byte(s))
	}
	const limit = 16
	f.Fuzz(func(t *testing.T, in []byte) {
		err := strictjson.Check(in, limit)
		serr := strictjson.CheckReader(iotest.OneByteReader(bytes.NewReader(in)), limit)
		if (err == nil) != (serr == nil) {
			t.Fatalf("bytes: %v, stream: %v", err, serr)
		}
		if err == nil {
			if !json.Valid(in) || !utf8.Valid(in) || depth(in) > limit {
				t.Fatalf("accepted %q", in)
			}
			return
		}
		var e *strictjson.Error
		if !errors.As(err, &e) {
			t.Fatalf("%v is not an *Error", err)
		}
		if json.Valid(in) && utf8.Valid(in) {
			switch e.Rule {
			case strictjson.RuleTooDeep:
				if depth(in) <= limit {
					t.Fatalf("%q refused as too deep: %v", in, e)
				}
			case strictjson.RuleDuplicateKey:
			default:
				t.Fatalf("valid %q refused: %v", in, e)
			}
		}
	})
}

// depth is the maximum bracket nesting of a valid JSON document.
func depth(in []byte) int {
	d, maxd, inStr, esc := 0, 0, false, false
	for _, b := range in {
		switch {
		case inStr && esc:
			esc = false
		case inStr && b == '\\':
			esc = true
		case inStr && b == '"':
			inStr = false
		case inStr:
		case b == '"':
			inStr = true
		case b == '{' || b == '[':
			d++
			maxd = max(maxd, d)
		case b == '}' || b == ']':
			d--
		}
	}
	return maxd
}
