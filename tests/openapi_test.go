package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// TestOpenAPIDescribesWalkthrough fetches /openapi.json from `mandate
// dev`, checks it is OpenAPI 3.1, and validates the README walk-through's
// requests and responses — successes over a command's own route and over
// /v1/commands/{code}:execute, and problem+json refusals (401, 403
// authorization.permission_denied, 400 schema.invalid, 422
// confirmation.required, 404) — against the schemas it documents for
// that route and status.
func TestOpenAPIDescribesWalkthrough(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dev := startDev(t)
	code, hdr, raw := doRaw(t, http.MethodGet, dev.base+"/openapi.json", "", "")
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
		t.Fatalf("/openapi.json: %d %s", code, hdr.Get("Content-Type"))
	}
	spec := newOpenAPISpec(t, raw)
	if v := spec.doc["openapi"]; v != "3.1.0" {
		t.Fatalf("openapi %v", v)
	}

	// The schemas bite: an unknown member, a number for an int64 string and
	// a problem without its code are each refused.
	execOp := spec.operation(t, "/v1/commands/{code}:execute", "POST")
	okLoc, _ := spec.responseSchema(t, execOp, 200, "application/json")
	forbidden, _ := spec.responseSchema(t, execOp, 403, "application/problem+json")
	auditOp := spec.operation(t, "/v1/audit/records", "GET")
	recordsLoc, _ := spec.responseSchema(t, auditOp, 200, "application/json")
	for _, bad := range []struct{ loc, body string }{
		{okLoc, `{"invocation_id":"i","result":{},"audit_id":"a","replayed":false,"extra":1}`},
		{recordsLoc, `{"records":[{"seq":7}],"next_page_token":""}`},
		{forbidden, `{"type":"about:blank","title":"Forbidden","status":403,"retriable":false}`},
	} {
		if spec.valid(t, bad.loc, []byte(bad.body)) {
			t.Fatalf("%s accepts %s", bad.loc, bad.body)
		}
	}

	var invocation string
	for _, tc := range []struct {
		name, method, path, route, user, body string
		want                                  int
		wantCode                              string
	}{
		{name: "ticket.search over its own route", method: "GET", path: "/v1/tickets?query=charged%20twice", route: "/v1/tickets",
			user: "alice", want: 200},
		{name: "ticket.search through execute", method: "POST", path: "/v1/commands/ticket.search:execute", route: "/v1/commands/{code}:execute",
			user: "alice", body: `{"input":{"query":"charged twice"}}`, want: 200},
		{name: "a ticket", method: "GET", path: "/v1/tickets/T-1001", route: "/v1/tickets/{ticket_id}", user: "alice", want: 200},
		{name: "the caller's tools", method: "GET", path: "/v1/catalog/tools", route: "/v1/catalog/tools", user: "support-bot@alice", want: 200},
		{name: "one tool", method: "GET", path: "/v1/catalog/tools/ticket.search", route: "/v1/catalog/tools/{code}", user: "alice", want: 200},
		{name: "no token", method: "POST", path: "/v1/commands/ticket.search:execute", route: "/v1/commands/{code}:execute",
			body: `{"input":{"query":"x"}}`, want: 401, wantCode: "authentication.missing_credentials"},
		{name: "refund the agent may not make", method: "POST", path: "/v1/tickets/T-1001:refund", route: "/v1/tickets/{ticket_id}:refund",
			user:     "support-bot@alice",
			body:     `{"amount":{"currency_code":"EUR","amount_minor":"100"},"reason":"dup","cardholder_reference":"CH4242424242"}`,
			want:     403,
			wantCode: "authorization.permission_denied"},
		{name: "refund through execute the agent may not make", method: "POST", path: "/v1/commands/ticket.refund:execute", route: "/v1/commands/{code}:execute",
			user:     "support-bot@alice",
			body:     `{"input":{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"100"},"reason":"dup","cardholder_reference":"CH4242424242"}}`,
			want:     403,
			wantCode: "authorization.permission_denied"},
		{name: "input that breaks the schema", method: "POST", path: "/v1/commands/ticket.search:execute", route: "/v1/commands/{code}:execute",
			user: "alice", body: `{"input":{"query":"x","no_such_field":1}}`, want: 400, wantCode: "schema.invalid"},
		{name: "refund that needs a human", method: "POST", path: "/v1/tickets/T-1001:refund", route: "/v1/tickets/{ticket_id}:refund",
			user:     "carol",
			body:     `{"amount":{"currency_code":"EUR","amount_minor":"100"},"reason":"dup","cardholder_reference":"CH4242424242"}`,
			want:     422,
			wantCode: "confirmation.required"},
		{name: "unknown command", method: "POST", path: "/v1/commands/no.such:execute", route: "/v1/commands/{code}:execute",
			user: "alice", body: `{"input":{}}`, want: 404, wantCode: "command.not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			op := spec.operation(t, tc.route, tc.method)
			switch {
			case tc.wantCode == "schema.invalid":
				// The document types Execute's input per command: it
				// predicts the refusal.
				if spec.valid(t, spec.requestSchema(t, op), []byte(tc.body)) {
					t.Fatalf("the document accepts %s, which is refused as schema.invalid", tc.body)
				}
			case tc.body != "":
				spec.validate(t, "request body", spec.requestSchema(t, op), []byte(tc.body))
			}
			code, hdr, raw := doRaw(t, tc.method, dev.base+tc.path, dev.tokens[tc.user], tc.body)
			if code != tc.want {
				t.Fatalf("%s %s: %d, want %d: %s", tc.method, tc.path, code, tc.want, raw)
			}
			media, _, _ := mime.ParseMediaType(hdr.Get("Content-Type"))
			schemaLoc, documented := spec.responseSchema(t, op, code, media)
			if !documented {
				t.Fatalf("%s %s answered %d %s, which the document does not describe", tc.method, tc.route, code, media)
			}
			spec.validate(t, fmt.Sprintf("%d %s", code, media), schemaLoc, raw)
			if tc.wantCode != "" {
				var p map[string]any
				_ = json.Unmarshal(raw, &p)
				if p["code"] != tc.wantCode {
					t.Fatalf("code %v, want %s: %s", p["code"], tc.wantCode, raw)
				}
				if media != "application/problem+json" {
					t.Fatalf("a refusal as %s", media)
				}
			}
			if code == 200 && tc.method == "POST" {
				var r map[string]any
				_ = json.Unmarshal(raw, &r)
				invocation, _ = r["invocation_id"].(string)
			}
		})
	}
	// The audit trail of the search, as its user reads it (or is refused).
	if invocation != "" {
		op := spec.operation(t, "/v1/audit/invocations/{invocation_id}", "GET")
		code, hdr, raw := doRaw(t, http.MethodGet, dev.base+"/v1/audit/invocations/"+url.PathEscape(invocation), dev.tokens["olive"], "")
		media, _, _ := mime.ParseMediaType(hdr.Get("Content-Type"))
		loc, ok := spec.responseSchema(t, op, code, media)
		if !ok {
			t.Fatalf("audit Get answered %d %s, which the document does not describe", code, media)
		}
		spec.validate(t, fmt.Sprintf("audit Get %d", code), loc, raw)
		t.Logf("audit Get as olive: %d %s, as documented", code, media)
	}
}

// openAPISpec is a parsed OpenAPI 3.1 document whose schemas compile with
// a JSON Schema 2020-12 validator, resolving $refs inside the document.
type openAPISpec struct {
	doc      map[string]any
	compiler *jsonschema.Compiler
}

const specURL = "https://mandate.test/openapi.json"

func newOpenAPISpec(t *testing.T, raw []byte) *openAPISpec {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("/openapi.json is not JSON: %v", err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(specURL, inst); err != nil {
		t.Fatal(err)
	}
	return &openAPISpec{doc: doc, compiler: c}
}

// ptr is a JSON pointer of path elements.
func ptr(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString("/" + strings.ReplaceAll(strings.ReplaceAll(p, "~", "~0"), "/", "~1"))
	}
	return b.String()
}

func (s *openAPISpec) at(pointer string) (any, bool) {
	var v any = s.doc
	for _, p := range strings.Split(strings.TrimPrefix(pointer, "/"), "/") {
		p = strings.ReplaceAll(strings.ReplaceAll(p, "~1", "/"), "~0", "~")
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[p]; !ok {
			return nil, false
		}
	}
	return v, true
}

// operation returns the pointer of the operation of route and method.
func (s *openAPISpec) operation(t *testing.T, route, method string) string {
	t.Helper()
	p := ptr("paths", route, strings.ToLower(method))
	if _, ok := s.at(p); !ok {
		t.Fatalf("the document has no %s %s", method, route)
	}
	return p
}

func (s *openAPISpec) requestSchema(t *testing.T, op string) string {
	t.Helper()
	p := op + ptr("requestBody", "content", "application/json", "schema")
	if _, ok := s.at(p); !ok {
		t.Fatalf("%s documents no JSON body", op)
	}
	return p
}

// responseSchema returns the pointer of the schema documented for status
// and media type (following a response $ref), and whether there is one.
func (s *openAPISpec) responseSchema(t *testing.T, op string, status int, media string) (string, bool) {
	t.Helper()
	resp := op + ptr("responses", fmt.Sprint(status))
	if _, ok := s.at(resp); !ok {
		resp = op + ptr("responses", "default")
	}
	r, ok := s.at(resp)
	if !ok {
		return "", false
	}
	if ref, isRef := r.(map[string]any)["$ref"].(string); isRef {
		resp = strings.TrimPrefix(ref, "#")
	}
	p := resp + ptr("content", media, "schema")
	_, ok = s.at(p)
	return p, ok
}

func (s *openAPISpec) validate(t *testing.T, what, pointer string, raw []byte) {
	t.Helper()
	if err := s.check(t, pointer, raw); err != nil {
		t.Fatalf("%s does not match the document (%s):\n%v\n%s", what, pointer, err, raw)
	}
}

func (s *openAPISpec) valid(t *testing.T, pointer string, raw []byte) bool {
	t.Helper()
	return s.check(t, pointer, raw) == nil
}

func (s *openAPISpec) check(t *testing.T, pointer string, raw []byte) error {
	t.Helper()
	sch, err := s.compiler.Compile(specURL + "#" + pointer)
	if err != nil {
		t.Fatalf("compiling %s: %v", pointer, err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("not JSON: %v: %s", err, raw)
	}
	return sch.Validate(inst)
}

// doRaw makes one request and returns its status, headers and body.
func doRaw(t *testing.T, method, url, tok, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}
