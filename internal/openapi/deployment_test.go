package openapi_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/compile/compiletest"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/openapi"
)

func adopterSet(t *testing.T) *manifest.Set {
	t.Helper()
	return compiletest.Set(t, "testdata", "adopter.proto")
}

func deployment(t *testing.T, set *manifest.Set, services ...string) map[string]any {
	t.Helper()
	b, err := openapi.Deployment(set, services, openapi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

func headerNames(t *testing.T, op any) []string {
	t.Helper()
	var names []string
	ps, _ := get(t, op, "parameters").([]any)
	for _, p := range ps {
		if p.(map[string]any)["in"] == "header" {
			names = append(names, p.(map[string]any)["name"].(string))
		}
	}
	slices.Sort(names)
	return names
}

func refsOf(t *testing.T, s any) []string {
	t.Helper()
	var refs []string
	for _, alt := range get(t, s, "anyOf").([]any) {
		if r, ok := alt.(map[string]any)["$ref"].(string); ok {
			refs = append(refs, r)
		}
	}
	return refs
}

// TestDeploymentDescribesTheAdoptersCommands: an executor of a manifest
// Mandate was not built with documents that manifest's routes, its
// commands on Execute, and only the services on its server.
func TestDeploymentDescribesTheAdoptersCommands(t *testing.T) {
	doc := deployment(t, adopterSet(t), "mandate.v1.ExecutorService")
	paths := keys(get(t, doc, "paths").(map[string]any))
	want := []string{"/v1/commands/{code}:check", "/v1/commands/{code}:execute", "/v1/dead-letters", "/v1/dead-letters:redrive", "/v1/invocations/{invocation_id}:resolve", "/v1/plan", "/v2/drafts/{report.id}", "/v2/reports/{report_id}"}
	if !slices.Equal(paths, want) {
		t.Fatalf("paths %v, want %v (no sample route, no other service)", paths, want)
	}
	update := get(t, doc, "paths", "/v2/drafts/{report.id}", "patch")
	if got := get(t, update, "summary"); got != "Update a report" {
		t.Errorf("summary %v, want the display name", got)
	}
	if got := get(t, update, "requestBody", "content", "application/json", "schema", "anyOf").([]any)[0].(map[string]any)["$ref"]; got != "#/components/schemas/acme.reports.v1.Report" {
		t.Errorf("PATCH body %v, want the report field's message", got)
	}
	del := get(t, doc, "paths", "/v2/reports/{report_id}", "delete")
	var query []string
	for _, p := range get(t, del, "parameters").([]any) {
		if p.(map[string]any)["in"] == "query" {
			query = append(query, p.(map[string]any)["name"].(string))
		}
	}
	if !slices.Equal(query, []string{"include_deleted"}) {
		t.Errorf("DELETE query %v, want the fields the path leaves", query)
	}
	wantHeaders := []string{"Idempotency-Key", "X-Mandate-Approval-Grant", "X-Mandate-Conversation"}
	for _, op := range []any{update, del, get(t, doc, "paths", openapi.ExecutePath, "post"), get(t, doc, "paths", openapi.CheckPath, "post")} {
		if got := headerNames(t, op); !slices.Equal(got, wantHeaders) {
			t.Errorf("%v: headers %v, want %v", get(t, op, "operationId"), got, wantHeaders)
		}
	}
	exec := get(t, doc, "paths", openapi.ExecutePath, "post")
	for _, op := range []any{exec, get(t, doc, "paths", openapi.CheckPath, "post")} {
		var codes []any
		for _, p := range get(t, op, "parameters").([]any) {
			if p.(map[string]any)["name"] == "code" {
				codes = get(t, p, "schema", "enum").([]any)
			}
		}
		if len(codes) != 4 || !slices.Contains(codes, any("acme.report.archive_all")) {
			t.Errorf("%v: code enum %v, want the four commands", get(t, op, "operationId"), codes)
		}
	}
	input := get(t, exec, "requestBody", "content", "application/json", "schema", "properties", "input")
	if got := refsOf(t, input); !slices.Equal(got, []string{"#/components/schemas/acme.reports.v1.ArchiveAllRequest",
		"#/components/schemas/acme.reports.v1.GetReportRequest", "#/components/schemas/acme.reports.v1.UpdateReportRequest"}) {
		t.Errorf("input is one of %v", got)
	}
	result := get(t, doc, "components", "schemas", "mandate.v1.ExecuteResponse", "properties", "result")
	if got := refsOf(t, result); !slices.Equal(got, []string{"#/components/schemas/acme.reports.v1.ArchiveAllResponse", "#/components/schemas/acme.reports.v1.Report"}) {
		t.Errorf("result is one of %v", got)
	}
	// Every message the document references is one of its components.
	schemas := get(t, doc, "components", "schemas").(map[string]any)
	raw, _ := json.Marshal(doc)
	for _, m := range strings.Split(string(raw), `"$ref":"#/components/schemas/`)[1:] {
		name := m[:strings.IndexByte(m, '"')]
		if _, ok := schemas[name]; !ok {
			t.Errorf("$ref to %s, which is not a component", name)
		}
	}
}

// TestDeploymentOfTheSample keeps the sample's generated operations (their
// comments) and, with the services of `mandate dev`, theirs.
func TestDeploymentOfTheSample(t *testing.T) {
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	doc := deployment(t, set, "mandate.v1.ExecutorService", "mandate.v1.CatalogService", "mandate.v1.AuditService", "mandate.v1.ConfirmService")
	refund := get(t, doc, "paths", "/v1/tickets/{ticket_id}:refund", "post")
	if d, _ := refund.(map[string]any)["description"].(string); d == "" {
		t.Error("the sample's refund lost its generated description")
	}
	if got := headerNames(t, refund); len(got) != 3 {
		t.Errorf("refund headers %v", got)
	}
	for _, p := range []string{"/v1/audit/records", "/v1/catalog/tools", "/v1/challenges/{challenge_id}:decide"} {
		get(t, doc, "paths", p)
	}
	alone := deployment(t, set, "mandate.v1.ExecutorService")
	if _, ok := get(t, alone, "paths").(map[string]any)["/v1/audit/records"]; ok {
		t.Error("an executor alone documents the audit service's routes")
	}
}

// TestDeploymentLint lints the documents of the sample and of an adopter's
// manifest with Redocly, as TestOpenAPILint lints the generated one.
func TestDeploymentLint(t *testing.T) {
	if testing.Short() {
		t.Skip("runs node")
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "tools", "openapi-lint"))
	if err != nil {
		t.Fatal(err)
	}
	node, err := exec.LookPath("node")
	cli := filepath.Join(dir, "node_modules", "@redocly", "cli", "bin", "cli.js")
	if _, serr := os.Stat(cli); err != nil || serr != nil {
		if os.Getenv("MANDATE_REQUIRE_NODE") == "1" {
			t.Fatal("MANDATE_REQUIRE_NODE=1 but node or tools/openapi-lint/node_modules is missing")
		}
		t.Skip("node or tools/openapi-lint/node_modules is missing; run npm ci --prefix tools/openapi-lint")
	}
	sample, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	for name, set := range map[string]*manifest.Set{"sample": sample, "adopter": adopterSet(t)} {
		t.Run(name, func(t *testing.T) {
			b, err := openapi.Deployment(set, []string{"mandate.v1.ExecutorService"}, openapi.Options{})
			if err != nil {
				t.Fatal(err)
			}
			spec := filepath.Join(t.TempDir(), "openapi.json")
			if err := os.WriteFile(spec, b, 0o600); err != nil {
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
		})
	}
}
