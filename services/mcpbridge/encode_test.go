package mcpbridge

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestEncodeRanIsTheGeneralEncoding: the one-pass encoding of a result
// that ran has the bytes of the general path (the SDK's encoding of the
// result, with resultType spliced in when typed), whatever the output's
// text holds; any other shape of result is left to the general path.
func TestEncodeRanIsTheGeneralEncoding(t *testing.T) {
	info := &mcp.Implementation{Name: "mandate", Title: "Mandate", Version: Version}
	ran := func(out, id string, withInfo bool) *mcp.CallToolResult {
		r := (&Bridge{}).result(t.Context(), nil, toolCall{Code: "ticket.search"}, callResult{InvocationID: id, Output: []byte(out)})
		if withInfo {
			r.Meta[mcp.MetaKeyServerInfo] = info
		}
		return r
	}
	outputs := map[string]string{
		"object":            `{"tickets":[{"id":"T-1001","subject":"Charged twice"}]}`,
		"whitespace":        "{ \"a\" : [1, 2,\n\t3] }\n",
		"html and controls": `{"s":"<b>&amp;</b> \u2028 \u2029 \t \\ \" é 😀","n":-1.5e3}` + "\n",
		"raw html":          `{"s":"<script>&</script>"}`,
		"invalid utf-8":     "{\"s\":\"\xff\xfe ok\"}",
		"line separators":   "{\"s\":\"\u2028\u2029\"}",
		"array":             `[1,"two",null]`,
		"string":            `"just text"`,
		"empty":             "",
		"blank":             " \n ",
		"control bytes":     "{\"s\":\"a\x01b\"}",
	}
	for name, out := range outputs {
		for _, withInfo := range []bool{false, true} {
			for _, id := range []string{"inv-1", "", "<&>"} {
				for _, typed := range []bool{true, false} {
					res := ran(out, id, withInfo)
					general := res.MarshalJSON
					if typed {
						general = func() ([]byte, error) { return spliceResultType(res) }
					}
					want, wantErr := general()
					got, ok := encodeRan(res, typed)
					if wantErr != nil {
						if ok {
							t.Errorf("%s: the one-pass encoding accepted what the SDK refuses (%v): %s", name, wantErr, got)
						}
						continue
					}
					if !ok || !bytes.Equal(got, want) {
						t.Errorf("%s (info %v, id %q, typed %v):\n got %s (ok %v)\nwant %s", name, withInfo, id, typed, got, ok, want)
					}
				}
			}
		}
	}

	others := map[string]*mcp.CallToolResult{
		"refusal":        refusalResult("refused", Refusal{Code: "x", InvocationID: "inv-1"}, []byte(`{"code":"x"}`)),
		"input required": {InputRequests: mcp.InputRequestMap{}, RequestState: "s"},
		"narrated": func() *mcp.CallToolResult {
			r := ran(`{}`, "inv-1", false)
			r.Content = append(r.Content, &mcp.TextContent{Text: "narration"})
			r.Meta[MetaNarration] = Narration{Status: NarrationDone}
			return r
		}(),
		"other meta": func() *mcp.CallToolResult {
			r := ran(`{}`, "inv-1", false)
			r.Meta["other"] = "x"
			return r
		}(),
		"value structured": {Meta: mcp.Meta{MetaInvocation: "inv-1"}, Content: []mcp.Content{&mcp.TextContent{Text: "{}"}}, StructuredContent: json.RawMessage(`{}`)},
	}
	for name, res := range others {
		for _, typed := range []bool{true, false} {
			if got, ok := encodeRan(res, typed); ok {
				t.Errorf("%s: encoded in one pass: %s", name, got)
			}
		}
	}
}

// BenchmarkEncodeResult compares the one-pass encoding of a ran result
// with the general path (the SDK's encoders, resultType spliced in).
func BenchmarkEncodeResult(b *testing.B) {
	res := (&Bridge{}).result(b.Context(), nil, toolCall{Code: "ticket.search"}, callResult{InvocationID: "inv-1", Output: []byte(searchResult)})
	res.Meta[mcp.MetaKeyServerInfo] = &mcp.Implementation{Name: "mandate", Title: "Mandate", Version: Version}
	b.Run("one-pass", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := encodeRan(res, true); !ok {
				b.Fatal("not encoded in one pass")
			}
		}
	})
	b.Run("general", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := spliceResultType(res); err != nil {
				b.Fatal(err)
			}
		}
	})
}
