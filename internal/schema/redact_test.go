package schema

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"
)

func TestRedact(t *testing.T) {
	cases := []struct {
		name, in     string
		pointers     []string
		want         string
		wantWithheld string
	}{
		{"top level", `{"ticket_id":"T-1001","cardholder_reference":"CH4242424242"}`, []string{"/cardholder_reference"},
			`{"cardholder_reference":"[withheld]","ticket_id":"T-1001"}`, "/cardholder_reference"},
		{"absent field", `{"ticket_id":"T-1001"}`, []string{"/cardholder_reference"}, `{"ticket_id":"T-1001"}`, ""},
		{"list wildcard", `{"parties":[{"tax_id":"A"},{"tax_id":"B","name":"n"}]}`, []string{"/parties/*/tax_id"},
			`{"parties":[{"tax_id":"[withheld]"},{"name":"n","tax_id":"[withheld]"}]}`, "/parties/0/tax_id,/parties/1/tax_id"},
		{"nested object value", `{"card":{"number":"4242"}}`, []string{"/card"}, `{"card":"[withheld]"}`, "/card"},
		{"not an object", `[1,2]`, []string{"/x"}, `{}`, ""},
		{"not JSON", `card=4242`, []string{"/card"}, `{}`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, withheld := Redact([]byte(tc.in), tc.pointers)
			if string(out) != tc.want || strings.Join(withheld, ",") != tc.wantWithheld {
				t.Fatalf("Redact = %s %v, want %s %s", out, withheld, tc.want, tc.wantWithheld)
			}
			if strings.Contains(string(out), "4242") {
				t.Fatal("sensitive value survived")
			}
		})
	}
}

// redactCorpus are inputs whose re-encoding is easy to get wrong: key
// order, escapes, HTML characters, line separators, invalid UTF-8, numbers
// as written, nesting, empty containers.
var redactCorpus = []string{
	`{}`,
	` {"b":1,"a":2} `,
	`{"z":{"y":[1,2.50,-3e10,{"x":null}],"a":true},"m":false,"":""}`,
	`{"s":"quote \" backslash \\ slash / tab \t nl \n cr \r bs \b ff \f ctl \u0001 \u001f del \u007f"}`,
	`{"html":"<a href='x'>&amp;</a>","sep":"\u2028 and \u2029","emoji":"😀 é 漢"}`,
	"{\"bad\":\"\xff\xfe invalid \xc3\x28 utf8\",\"k\xff\":1}",
	`{"n":[0,-0,1.0,1e-7,123456789012345678901234567890,-1.5E+3]}`,
	`{"nested":{"a":{"b":{"c":[[],{},[{}]]}}},"A":1,"a":2,"_":3,"~":4}`,
	`{"keys":{"é":1,"e":2,"E":3,"10":4,"9":5,"a b":6,"a\"b":7}}`,
}

// TestRedactEncodesAsMarshal pins Redact's JSON to json.Marshal of the
// decoded document, which it was before it encoded the document itself:
// the redacted arguments are in audit rows, whose hashes chain.
func TestRedactEncodesAsMarshal(t *testing.T) {
	for _, in := range redactCorpus {
		want := marshalDecoded(t, in)
		got, _ := Redact([]byte(in), nil)
		if string(got) != want {
			t.Errorf("Redact(%q)\n got %s\nwant %s", in, got, want)
		}
	}
}

func marshalDecoded(t testing.TB, in string) string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(in))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%q: %v", in, err)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestArgumentsRedactAsRedact: redacting the arguments Decode parsed is
// Redact of the input, withheld pointers included.
func TestArgumentsRedactAsRedact(t *testing.T) {
	d, err := NewDecoder(nil, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	md := (&structpb.Struct{}).ProtoReflect().Descriptor()
	pointers := []string{"/z/y/*/x", "/html", "/keys/*", "/nested/a/b/c/2/*", "/absent", "/s~1t"}
	inputs := append([]string{`{"s/t":"x","html":1}`, ``, `  `}, redactCorpus...)
	for _, in := range inputs {
		if !utf8.ValidString(in) {
			continue // protojson refuses it: Decode never returns its arguments
		}
		msg, args, err := d.DecodeArguments(md, []byte(in))
		if err != nil || msg == nil {
			t.Fatalf("DecodeArguments(%q): %v", in, err)
		}
		got, gotWithheld := args.Redact(pointers)
		want, wantWithheld := Redact([]byte(in), pointers)
		if string(got) != string(want) || !slices.Equal(gotWithheld, wantWithheld) {
			t.Errorf("%q: arguments redact to %s %v, Redact to %s %v", in, got, gotWithheld, want, wantWithheld)
		}
	}
	if got, withheld := (Arguments{}).Redact(pointers); string(got) != "{}" || withheld != nil {
		t.Errorf("zero Arguments redact to %s %v", got, withheld)
	}
}

// FuzzRedactEncodesAsMarshal: for any JSON object, Redact without
// pointers is json.Marshal of its decoded document.
func FuzzRedactEncodesAsMarshal(f *testing.F) {
	for _, in := range redactCorpus {
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, in string) {
		dec := json.NewDecoder(strings.NewReader(in))
		dec.UseNumber()
		var doc any
		if dec.Decode(&doc) != nil {
			return
		}
		if _, ok := doc.(map[string]any); !ok {
			return
		}
		want, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := Redact([]byte(in), nil); string(got) != string(want) {
			t.Fatalf("Redact(%q)\n got %s\nwant %s", in, got, want)
		}
	})
}

// BenchmarkRedactArguments is the schema stage's decoding and redaction of
// one input: before the arguments were kept, Redact parsed it a second
// time and encoding/json re-encoded it.
func BenchmarkRedactArguments(b *testing.B) {
	d, err := NewDecoder(nil, Limits{})
	if err != nil {
		b.Fatal(err)
	}
	md := (&structpb.Struct{}).ProtoReflect().Descriptor()
	in := []byte(`{"query":"charged twice","status":"open","limit":20,"card":{"number":"4242"}}`)
	pointers := []string{"/card/number"}
	b.Run("decode+Redact", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := d.Decode(md, in); err != nil {
				b.Fatal(err)
			}
			Redact(in, pointers)
		}
	})
	b.Run("DecodeArguments+Arguments.Redact", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, args, err := d.DecodeArguments(md, in)
			if err != nil {
				b.Fatal(err)
			}
			args.Redact(pointers)
		}
	})
}
