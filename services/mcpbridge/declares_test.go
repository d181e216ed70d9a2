package mcpbridge

import (
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestDeclaresTasksAsTheSDK: declaresTasks, which skips decoding
// capabilities that cannot name the tasks extension, decides as the SDK's
// ClientCapabilities does, for `_meta` capabilities as they arrive over
// the wire.
func TestDeclaresTasksAsTheSDK(t *testing.T) {
	for _, caps := range []string{
		``, `{}`, `{"roots":{"listChanged":true},"sampling":{}}`, `{"roots":"not an object"}`,
		`{"extensions":{}}`, `{"extensions":{"io.modelcontextprotocol/tasks":{}}}`,
		`{"Extensions":{"io.modelcontextprotocol/tasks":{}}}`, `{"EXTENSIONS":{"other":{}}}`,
		`{"extensions":{"io.modelcontextprotocol/tasks":null}}`, `{"extensions":"not an object"}`,
	} {
		meta := `{}`
		if caps != "" {
			meta = `{"` + mcp.MetaKeyClientCapabilities + `":` + caps + `}`
		}
		var params mcp.CallToolParamsRaw
		if err := json.Unmarshal([]byte(`{"name":"ticket.search","_meta":`+meta+`}`), &params); err != nil {
			t.Fatal(err)
		}
		req := &mcp.CallToolRequest{Params: &params}
		want := false
		if c := req.ClientCapabilities(); c != nil && c.Extensions != nil {
			_, want = c.Extensions[ExtensionTasks]
		}
		if got := declaresTasks(req); got != want {
			t.Errorf("capabilities %s: declaresTasks = %v, the SDK's capabilities say %v", caps, got, want)
		}
	}
	if !declaresTasks(&mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Meta: mcp.Meta{
		mcp.MetaKeyClientCapabilities: map[string]any{"extensions": map[string]any{ExtensionTasks: map[string]any{}}},
	}}}) {
		t.Error("the tasks extension, declared, is not seen")
	}
}
