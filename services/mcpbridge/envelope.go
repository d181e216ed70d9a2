package mcpbridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/internal/strictjson"
)

// checkEnvelope refuses a POSTed JSON-RPC message (or batch) that is not
// one strict JSON value (strictjson.Check) before the SDK reads it: the
// SDK's decoder lets the last of two "method", "params" or "id" members
// win, and so would a tool's arguments or _meta, so one body could mean
// one thing to a proxy or a log and another to Mandate.
//
// Refusals are HTTP 400 with a JSON-RPC error response (id null: which id
// a broken message meant cannot be known) whose data names the rule and
// the JSON pointer:
//
//   - -32600 Invalid Request: duplicate member names (schema.duplicate_key)
//     or nesting deeper than strictjson.DefaultMaxDepth (schema.too_deep);
//   - -32700 Parse error: invalid UTF-8 (schema.utf8), or not exactly one
//     JSON value (schema.syntax).
//
// Such a message never reaches the executor, so it leaves no audit row,
// like any other JSON-RPC message the transport cannot read. An empty
// body, and one over the SDK's size limit (413), are left to the SDK to
// answer as before; the body it reads is the one checked.
func checkEnvelope(next http.Handler) http.Handler {
	const limit = mcp.DefaultMaxRequestBodyBytes // the SDK's own limit
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		var buf bytes.Buffer
		err := strictjson.CheckReader(io.TeeReader(io.LimitReader(r.Body, limit+1), &buf), 0)
		var se *strictjson.Error
		if err != nil && buf.Len() <= limit && !errors.Is(err, strictjson.ErrEmpty) && errors.As(err, &se) {
			writeEnvelopeError(w, se)
			return
		}
		// Accepted, empty, too large or unreadable: the SDK reads the same
		// bytes (and the rest) and answers as it always has.
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf.Bytes()), r.Body), r.Body}
		next.ServeHTTP(w, r)
	})
}

func writeEnvelopeError(w http.ResponseWriter, se *strictjson.Error) {
	code, message := jsonrpc.CodeInvalidRequest, "Invalid Request: "+se.Message
	if se.Rule == strictjson.RuleSyntax || se.Rule == strictjson.RuleUTF8 {
		code, message = jsonrpc.CodeParseError, "Parse error: "+se.Message
	}
	body, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"id":      nil,
		"error": map[string]any{
			"code":    code,
			"message": message,
			"data":    map[string]string{"rule": se.Rule, "pointer": se.Pointer},
		},
	})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write(body)
}
