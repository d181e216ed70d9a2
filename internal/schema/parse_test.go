package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// decoderObject is what parseObject replaced: encoding/json's Decoder
// with UseNumber, then More, then the object check.
func decoderObject(b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, errSyntax
	}
	if dec.More() {
		return nil, errTrailing
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return nil, errNotObject
	}
	return obj, nil
}

// decoderFirst is what parseFirst replaced: Decoder.Decode alone.
func decoderFirst(b []byte) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, false
	}
	return doc, true
}

var parseCorpus = []string{
	`{}`, `[]`, `1`, `"s"`, `"`, `"\u`, `true`, `null`, ``, ` `, `{`, `}`, `{"a":1}}`, `{"a":1}]`, `{"a":1} x`, `{"a":1}{}`,
	`{"a":1,}`, `{"a" 1}`, `{a:1}`, `{"a":01}`, `01`, `1x`, `-`, `-0`, `1.`, `1.5e`, `1e+9`, `-0.0E-0`,
	`{"a":[1,2,[3,{"b":null}]],"a":"dup","c":{}}`, `{"a":tru}`, `{"a":truex}`, `truex`, `nul`, `[1,]`, `[,1]`,
	`{"s":"\u00e9\ud83d\ude00\ud800\udc00\ud800x\udc00\ud800\u0041"}`, `{"s":"\uZZZZ"}`, `{"s":"\x"}`, `{"s":"\/\b\f\n\r\t\"\\"}`,
	"{\"s\":\"\xff\xc3\x28\xed\xa0\x80 ok é\"}", "{\"s\":\"tab\there\"}", "{\"s\":\"nl\nhere\"}", "{\"\xff\":1}",
	`{"s":"\ud800"}`, `{"s":"\ud800\u"}`, `{"s":"\ud800\ud800"}`, `{"s":"unterminated}`, `{"s":"\`,
	" \t\r\n{ \"a\" : [ 1 , 2 ] } \n", "{\"a\":1}\u00a0", `[[[[[]]]]]`, `{"a":{"b":{"c":{}}}}`,
	`{"n":123456789012345678901234567890.123e-45}`, `{"a":1}/`, `{"a":"b"}"`,
}

// TestParseAsTheDecoder: parseObject and parseFirst read every input as
// the encoding/json Decoder they replaced, errors and documents alike.
func TestParseAsTheDecoder(t *testing.T) {
	for _, in := range parseCorpus {
		checkParse(t, []byte(in))
	}
	for _, depth := range []int{maxNesting - 1, maxNesting, maxNesting + 1} {
		deep := strings.Repeat(`{"a":`, depth-1) + `{}` + strings.Repeat(`}`, depth-1)
		checkParse(t, []byte(deep))
		arrays := `{"a":` + strings.Repeat(`[`, depth-1) + strings.Repeat(`]`, depth-1) + `}`
		checkParse(t, []byte(arrays))
	}
}

func checkParse(t *testing.T, in []byte) {
	t.Helper()
	got, err := parseObject(in)
	want, wantErr := decoderObject(in)
	if !errors.Is(err, wantErr) || !reflect.DeepEqual(got, want) {
		t.Fatalf("parseObject(%.80q) = %v, %v; the Decoder: %v, %v", in, got, err, want, wantErr)
	}
	gotFirst, ok := parseFirst(in)
	wantFirst, wantOK := decoderFirst(in)
	if ok != wantOK || !reflect.DeepEqual(gotFirst, wantFirst) {
		t.Fatalf("parseFirst(%.80q) = %v, %v; the Decoder: %v, %v", in, gotFirst, ok, wantFirst, wantOK)
	}
}

// FuzzParseAsTheDecoder: for any input, parseObject and parseFirst read
// what encoding/json's Decoder reads.
func FuzzParseAsTheDecoder(f *testing.F) {
	for _, in := range parseCorpus {
		f.Add([]byte(in))
	}
	for _, in := range redactCorpus {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		checkParse(t, in)
	})
}

// BenchmarkParseArguments is the schema stage's reading of an input as a
// JSON document: encoding/json's Decoder before, parseObject now.
func BenchmarkParseArguments(b *testing.B) {
	in := []byte(`{"employee_id":"E-1001","amount":{"currency_code":"EUR","units":"120","nanos":500000000},"description":"Team dinner \u00e9","receipts":["r-1","r-2"]}`)
	b.Run("Decoder", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decoderObject(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parseObject", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := parseObject(in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
