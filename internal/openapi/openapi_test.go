package openapi_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	genopenapi "github.com/mandate-dev/mandate/gen/openapi"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/openapi"
)

// files are the compiled-in protos of every REST route (no source info,
// so no descriptions: the structure is what these tests check).
func files() []protoreflect.FileDescriptor {
	return []protoreflect.FileDescriptor{
		mandatev1.File_mandate_v1_executor_proto,
		mandatev1.File_mandate_v1_catalog_proto,
		mandatev1.File_mandate_v1_confirm_proto,
		mandatev1.File_mandate_v1_audit_proto,
		helpdeskv1.File_examples_helpdesk_v1_helpdesk_proto,
	}
}

func build(t *testing.T) map[string]any {
	t.Helper()
	b, err := openapi.Build(files(), openapi.Options{Title: "T", Version: "v9"})
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

func get(t *testing.T, v any, path ...string) any {
	t.Helper()
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s: not an object at %q", strings.Join(path, "/"), p)
		}
		if v, ok = m[p]; !ok {
			t.Fatalf("%s: no %q", strings.Join(path, "/"), p)
		}
	}
	return v
}

func TestBuildIsDeterministic(t *testing.T) {
	a, err := openapi.Build(files(), openapi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rev := files()
	slices.Reverse(rev)
	b, err := openapi.Build(rev, openapi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("the same files in another order gave another document")
	}
}

func TestDocumentShape(t *testing.T) {
	doc := build(t)
	if v := get(t, doc, "openapi"); v != "3.1.0" {
		t.Errorf("openapi %v", v)
	}
	if v := get(t, doc, "info", "title"); v != "T" {
		t.Errorf("title %v", v)
	}
	if v := get(t, doc, "components", "securitySchemes", "bearer", "scheme"); v != "bearer" {
		t.Errorf("security scheme %v", v)
	}
	// Every route of every service, with its gRPC method.
	for path, method := range map[string]string{
		"/v1/commands/{code}:execute":           "post",
		"/v1/catalog/tools":                     "get",
		"/v1/challenges/{challenge_id}":         "get",
		"/v1/audit/records:watch":               "get",
		"/v1/tickets/{ticket_id}:refund":        "post",
		"/v1/audit/invocations/{invocation_id}": "get",
	} {
		op := get(t, doc, "paths", path, method)
		if !strings.HasPrefix(get(t, op, "x-grpc-method").(string), "/") {
			t.Errorf("%s: x-grpc-method %v", path, get(t, op, "x-grpc-method"))
		}
		// Errors are problem+json, for every status Mandate answers with.
		for _, code := range []string{"400", "401", "403", "404", "409", "422", "default"} {
			get(t, op, "responses", code, "$ref")
		}
	}
	// Proto names on the wire, int64 as a string, enums by name, unset
	// messages as null.
	rec := get(t, doc, "components", "schemas", "mandate.v1.AuditRecord", "properties").(map[string]any)
	if _, ok := rec["invocation_id"]; !ok {
		t.Errorf("AuditRecord properties are not proto names: %v", keys(rec))
	}
	if v := get(t, rec, "seq", "type"); v != "string" {
		t.Errorf("int64 seq has type %v", v)
	}
	ticket := get(t, doc, "components", "schemas", "examples.helpdesk.v1.Ticket", "properties").(map[string]any)
	if _, ok := get(t, ticket, "status").(map[string]any)["anyOf"]; ok {
		t.Error("an enum field is nullable")
	}
	if v := get(t, ticket, "status", "$ref"); v != openapi.SchemaRef("examples.helpdesk.v1.TicketStatus") {
		t.Errorf("status %v", v)
	}
	if v := get(t, doc, "components", "schemas", "examples.helpdesk.v1.TicketStatus", "type"); v != "string" {
		t.Errorf("enum type %v", v)
	}
	if v := get(t, ticket, "created_at", "type"); !reflect.DeepEqual(v, []any{"string", "null"}) {
		t.Errorf("timestamp %v", v)
	}
	// A body that binds path fields leaves them out.
	body := get(t, doc, "paths", "/v1/tickets/{ticket_id}:refund", "post", "requestBody", "content", "application/json", "schema", "properties").(map[string]any)
	if _, ok := body["ticket_id"]; ok {
		t.Error("the refund body repeats the path's ticket_id")
	}
	// GET routes read their request from the query.
	var names []string
	for _, p := range get(t, doc, "paths", "/v1/tickets", "get", "parameters").([]any) {
		names = append(names, get(t, p, "name").(string))
		if get(t, p, "in") != "query" {
			t.Errorf("parameter %v", p)
		}
	}
	if !slices.Contains(names, "query") {
		t.Errorf("ticket search parameters %v", names)
	}
}

// TestProblemSchemaMatchesProblemBody keeps the documented problem body in
// step with the one the server writes.
func TestProblemSchemaMatchesProblemBody(t *testing.T) {
	doc := build(t)
	props := get(t, doc, "components", "schemas", openapi.ProblemSchema, "properties").(map[string]any)
	want := jsonNames(reflect.TypeFor[failure.ProblemBody]())
	if got := keys(props); !slices.Equal(got, want) {
		t.Errorf("problem properties %v, ProblemBody has %v", got, want)
	}
	items := get(t, props, "errors", "items", "properties").(map[string]any)
	if got, want := keys(items), jsonNames(reflect.TypeFor[failure.ProblemViolation]()); !slices.Equal(got, want) {
		t.Errorf("problem errors[] properties %v, ProblemViolation has %v", got, want)
	}
	// Members the server always writes are required.
	var required []string
	for _, r := range get(t, doc, "components", "schemas", openapi.ProblemSchema, "required").([]any) {
		required = append(required, r.(string))
	}
	typ := reflect.TypeFor[failure.ProblemBody]()
	for i := range typ.NumField() {
		name, opts, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if always := !strings.Contains(opts, "omitempty"); always != slices.Contains(required, name) {
			t.Errorf("%s: written always %v, required %v", name, always, !always)
		}
	}
	if v := get(t, doc, "components", "responses", "Forbidden", "content"); get(t, v, "application/problem+json", "schema", "$ref") != openapi.SchemaRef(openapi.ProblemSchema) {
		t.Errorf("Forbidden content %v", v)
	}
}

// TestGeneratedDocumentIsCurrent checks the committed document against the
// generator (the full check is `make check-generated`, which has the
// comments this build lacks): same paths, same components.
func TestGeneratedDocumentIsCurrent(t *testing.T) {
	var committed map[string]any
	if err := json.Unmarshal(genopenapi.Document, &committed); err != nil {
		t.Fatalf("gen/openapi/openapi.json: %v", err)
	}
	doc := build(t)
	for _, k := range []string{"paths", "components"} {
		a := keys(get(t, committed, k).(map[string]any))
		b := keys(get(t, doc, k).(map[string]any))
		if !slices.Equal(a, b) {
			t.Errorf("%s: committed %v, generated %v; run make generate", k, a, b)
		}
	}
	if a, b := keys(get(t, committed, "components", "schemas").(map[string]any)), keys(get(t, doc, "components", "schemas").(map[string]any)); !slices.Equal(a, b) {
		t.Errorf("schemas: committed %v, generated %v; run make generate", a, b)
	}
}

// TestOpenAPILint lints the served document with Redocly CLI
// (tools/openapi-lint, strict recommended rules). It skips without node
// or tools/openapi-lint/node_modules unless MANDATE_REQUIRE_NODE=1 (CI
// runs `npm ci --prefix tools/openapi-lint`).
func TestOpenAPILint(t *testing.T) {
	if testing.Short() {
		t.Skip("runs node")
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "tools", "openapi-lint"))
	if err != nil {
		t.Fatal(err)
	}
	missing := func(why string) {
		if os.Getenv("MANDATE_REQUIRE_NODE") == "1" {
			t.Fatalf("MANDATE_REQUIRE_NODE=1 but %s", why)
		}
		t.Skip(why)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not on PATH")
	}
	cli := filepath.Join(dir, "node_modules", "@redocly", "cli", "bin", "cli.js")
	if _, err := os.Stat(cli); err != nil {
		missing("tools/openapi-lint/node_modules lacks @redocly/cli; run npm ci --prefix tools/openapi-lint")
	}
	spec := filepath.Join(t.TempDir(), "openapi.json")
	if err := os.WriteFile(spec, genopenapi.Document, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, cli, "lint", spec, "--config", filepath.Join(dir, "redocly.yaml"), "--format", "stylish")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true", "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("redocly lint: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "Your API description is valid") || strings.Contains(string(out), "You have ") {
		t.Errorf("redocly lint reported problems:\n%s", out)
	}
	t.Logf("redocly lint:\n%s", out)
}

func keys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func jsonNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
