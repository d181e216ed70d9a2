package mcpbridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/internal/callattr"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/schema"
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
// A tools/call whose envelope is sound but whose arguments or _meta repeat
// a member is still an attempt to call a tool: the executor refuses it
// (schema.invalid at schema_validate for the arguments,
// request.invalid_metadata for _meta) and audits it, and the JSON-RPC
// error's data names its invocation id. Other messages the transport cannot
// read leave no audit row. An empty body, and one over the SDK's size limit
// (413), are left to the SDK to answer as before; the body it reads is the
// one checked.
func (b *Bridge) checkEnvelope(next http.Handler) http.Handler {
	const limit = mcp.DefaultMaxRequestBodyBytes // the SDK's own limit
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		// One allocation holds the limit, the read buffer and the body the
		// SDK reads again (replayBody), rather than one for each and a
		// MultiReader per request.
		rb := &replayBody{limited: io.LimitedReader{R: r.Body, N: limit + 1}, rest: r.Body}
		buf := &rb.buf
		// Room for the declared length, up to a size no idle connection
		// should hold before sending it; larger bodies grow as they arrive.
		const pregrow = 64 << 10
		if r.ContentLength > 0 && r.ContentLength <= pregrow {
			buf.Grow(int(r.ContentLength) + bytes.MinRead)
		}
		_, readErr := buf.ReadFrom(&rb.limited)
		var (
			err  error
			read = buf.Len() // of the body, by the checker
		)
		if readErr == nil && read <= limit {
			err = strictjson.Check(buf.Bytes(), 0)
		} else {
			// Too large or cut short: the checker reads the prefix it
			// needs, and refuses only what it finds within the limit.
			cr := &countingReader{r: bytes.NewReader(buf.Bytes()), end: readErr}
			err = strictjson.CheckReader(cr, 0)
			read = cr.n
		}
		if err != nil && read <= limit && !errors.Is(err, strictjson.ErrEmpty) {
			if se, ok := errors.AsType[*strictjson.Error](err); ok {
				writeEnvelopeError(w, se, b.auditEnvelope(r, buf.Bytes()[:read], se))
				return
			}
		}
		// Accepted, empty, too large or unreadable: the SDK reads the same
		// bytes (and the rest) and answers as it always has.
		rb.read.Reset(buf.Bytes())
		r.Body = rb
		next.ServeHTTP(w, r)
	})
}

// replayBody is a request body the bridge read ahead: the bytes it read,
// then whatever of the original body is left.
type replayBody struct {
	limited io.LimitedReader // the read ahead: up to the SDK's limit and one byte
	buf     bytes.Buffer
	read    bytes.Reader // over buf's bytes
	rest    io.ReadCloser
}

func (b *replayBody) Read(p []byte) (int, error) {
	if b.read.Len() > 0 {
		return b.read.Read(p)
	}
	return b.rest.Read(p)
}

func (b *replayBody) Close() error { return b.rest.Close() }

// countingReader counts the bytes read through it and, when end is set,
// fails with end where r ends: the body's own read error, in its place.
type countingReader struct {
	r   io.Reader
	end error
	n   int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	if errors.Is(err, io.EOF) && c.end != nil {
		err = c.end
	}
	return n, err
}

// auditEnvelope runs a tools/call refused for a duplicate member in its
// arguments or _meta through the executor, which refuses it and audits
// the attempt, and returns the invocation id ("" when the message is no
// such call). body is read leniently here only to learn the tool's name.
func (b *Bridge) auditEnvelope(r *http.Request, body []byte, se *strictjson.Error) string {
	var ptr string
	var isMeta bool
	switch {
	case se.Rule != strictjson.RuleDuplicateKey:
		return ""
	case strings.HasPrefix(se.Pointer, "/params/arguments/"):
		ptr = strings.TrimPrefix(se.Pointer, "/params/arguments")
	case strings.HasPrefix(se.Pointer, "/params/_meta/"):
		ptr, isMeta = strings.TrimPrefix(se.Pointer, "/params/_meta"), true
	default:
		return ""
	}
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &msg) != nil || msg.Method != "tools/call" || msg.Params.Name == "" {
		return ""
	}
	ctx, _, ok := withCaller(r.Context(), auth.TokenInfoFromContext(r.Context()))
	if !ok {
		return ""
	}
	call := toolCall{Code: msg.Params.Name, Input: []byte("{}")}
	if isMeta {
		call.Invalid = []callattr.Invalid{{Name: "_meta", Rule: callattr.RuleFormat, Reason: "repeats the member " + ptr, Value: callattr.Mark(ptr)}}
	} else {
		call.InputError = &schema.InvalidError{Violations: []schema.Violation{{Pointer: ptr, Rule: se.Rule, Message: se.Message}}}
	}
	_, err := b.execute(ctx, call)
	if fe, ok := failure.FromStatus(failure.ToStatus(err)); ok {
		return fe.InvocationID
	}
	return ""
}

func writeEnvelopeError(w http.ResponseWriter, se *strictjson.Error, invocation string) {
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
			"data":    envelopeData(se, invocation),
		},
	})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write(body)
}

func envelopeData(se *strictjson.Error, invocation string) map[string]string {
	d := map[string]string{"rule": se.Rule, "pointer": se.Pointer}
	if invocation != "" {
		d["invocation_id"] = invocation
	}
	return d
}
