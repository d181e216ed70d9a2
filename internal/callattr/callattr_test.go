package callattr_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/mandate-dev/mandate/internal/callattr"
)

func TestCheck(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	cases := []struct {
		name, attr, value, rule string
	}{
		{"absent", callattr.Conversation, "", ""},
		{"plain conversation", callattr.Conversation, "conv-42 ünïcode", ""},
		{"conversation at the limit", callattr.Conversation, strings.Repeat("c", 255), ""},
		{"conversation over the limit", callattr.Conversation, strings.Repeat("c", 256), callattr.RuleTooLong},
		{"NUL", callattr.Conversation, "a\x00b", callattr.RuleControl},
		{"newline", callattr.Conversation, "a\nb", callattr.RuleControl},
		{"bidi override", callattr.Conversation, "a\u202eb", callattr.RuleControl},
		{"zero width", callattr.IdempotencyKey, "k\u200bey", callattr.RuleControl},
		{"invalid UTF-8", callattr.Conversation, "a\xffb", callattr.RuleUTF8},
		{"key over the limit", callattr.IdempotencyKey, strings.Repeat("k", 256), callattr.RuleTooLong},
		{"grant id", callattr.ApprovalGrant, "AbC_-0123456789abcdefg", ""},
		{"grant with a slash", callattr.ApprovalGrant, "../x", callattr.RuleFormat},
		{"session with a space", callattr.MCPSession, "a b", callattr.RuleFormat},
		{"traceparent", callattr.TraceParent, tp, ""},
		{"traceparent upper case", callattr.TraceParent, strings.ToUpper(tp), callattr.RuleFormat},
		{"traceparent zero trace id", callattr.TraceParent, "00-00000000000000000000000000000000-00f067aa0ba902b7-01", callattr.RuleFormat},
		{"traceparent version ff", callattr.TraceParent, "ff" + tp[2:], callattr.RuleFormat},
		{"traceparent v00 with a tail", callattr.TraceParent, tp + "-x", callattr.RuleFormat},
		{"traceparent future version with a tail", callattr.TraceParent, "01" + tp[2:] + "-x", ""},
		{"traceparent short", callattr.TraceParent, tp[:40], callattr.RuleFormat},
		{"tracestate", callattr.TraceState, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", ""},
		{"tracestate non-ASCII", callattr.TraceState, "k=é", callattr.RuleFormat},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := callattr.Check(c.attr, c.value)
			switch {
			case c.rule == "" && got != nil:
				t.Fatalf("Check(%q) = %+v, want valid", c.value, got)
			case c.rule != "" && got == nil:
				t.Fatalf("Check(%q) = valid, want %s", c.value, c.rule)
			case got != nil && (got.Rule != c.rule || got.Name != c.attr):
				t.Fatalf("Check(%q) = %+v, want rule %s", c.value, got, c.rule)
			case got != nil && callattr.Safe(got.Value, callattr.MaxMarked) != got.Value:
				t.Fatalf("the marked value %q is not safe to record", got.Value)
			}
		})
	}
}

func TestMark(t *testing.T) {
	cases := []struct{ in, want string }{
		{"abc", "[invalid] abc"},
		{"a\x00b", `[invalid] a\u{0000}b`},
		{"25.00 EUR\u202e", `[invalid] 25.00 EUR\u{202E}`},
		{"a\xffb", `[invalid] a\xffb`},
		{`back\slash`, `[invalid] back\\slash`},
	}
	for _, c := range cases {
		if got := callattr.Mark(c.in); got != c.want {
			t.Errorf("Mark(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	long := callattr.Mark(strings.Repeat("é", 300))
	if len(long) > callattr.MaxMarked || !utf8.ValidString(long) || !strings.HasSuffix(long, "…(600 bytes)") {
		t.Fatalf("Mark(long) = %q (%d bytes)", long, len(long))
	}
}

func FuzzMark(f *testing.F) {
	for _, s := range []string{"", "abc", "a\x00b", "\u202e", "\xff\xfe", strings.Repeat("\\", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m := callattr.Mark(s)
		if len(m) > callattr.MaxMarked || !utf8.ValidString(m) || strings.ContainsAny(m, "\x00\u202e\u2066") {
			t.Fatalf("Mark(%q) = %q", s, m)
		}
		if callattr.Safe(m, callattr.MaxMarked) != m {
			t.Fatalf("Mark(%q) = %q is not Safe", s, m)
		}
		for _, name := range []string{callattr.Conversation, callattr.IdempotencyKey, callattr.TraceParent, callattr.ApprovalGrant} {
			if inv := callattr.Check(name, s); inv != nil && callattr.Safe(inv.Value, callattr.MaxMarked) != inv.Value {
				t.Fatalf("Check(%s, %q) marked %q unsafely", name, s, inv.Value)
			}
		}
	})
}
