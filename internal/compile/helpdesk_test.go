package compile_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/compile"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/tooldesc"
)

// TestHelpdeskManifestGolden compiles the helpdesk protos in-process and
// compares every command with the committed gen/manifest/manifest.json, the
// golden file `make generate` rewrites. Digests are left out: they cover
// the descriptor bytes, which depend on the compiler that produced them.
func TestHelpdeskManifestGolden(t *testing.T) {
	root := repoRoot(t)
	// buf generates every file under proto/: the same targets here.
	targets := protoFiles(t, filepath.Join(root, "proto"))
	set := compileProtos(t, filepath.Join(root, "proto"), targets...)
	out, err := compile.Compile(set, targets)
	if err != nil {
		t.Fatalf("helpdesk refused: %v", err)
	}
	got := commandsJSON(t, out.Manifest)
	committed, err := os.ReadFile(filepath.Join(root, "gen", "manifest", "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := commandsJSON(t, committed)
	if !bytes.Equal(got, want) {
		t.Fatalf("compiled helpdesk commands differ from gen/manifest/manifest.json; run `make generate` and review the diff")
	}
	var m manifest.Manifest
	if err := json.Unmarshal(committed, &m); err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, c := range m.Commands {
		codes = append(codes, c.Code)
	}
	wantCodes := "customer.erase,expense.report.approve,expense.report.create,expense.report.recall,expense.report.submit,ops.review,ticket.get,ticket.refund,ticket.search"
	if strings.Join(codes, ",") != wantCodes {
		t.Errorf("codes %v, want %s", codes, wantCodes)
	}
}

func protoFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".proto") {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func commandsJSON(t *testing.T, raw []byte) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	b, err := manifest.Canonical(m["commands"], true)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BenchmarkLoadAndProject loads a synthetic 1,000-command manifest and
// projects every tool descriptor, as a catalog does at start-up.
func BenchmarkLoadAndProject(b *testing.B) {
	const n = 1000
	var src strings.Builder
	src.WriteString(`syntax = "proto3";
package bench.v1;
import "buf/validate/validate.proto";
import "mandate/v1/options.proto";
message Money { string currency_code = 1 [(buf.validate.field).string.pattern = "^[A-Z]{3}$"]; int64 amount_minor = 2 [(buf.validate.field).int64 = {gt: 0, lte: 100000000}]; }
message Req {
  string id = 1 [(buf.validate.field).required = true, (buf.validate.field).string.pattern = "^X-[0-9]{4}$"];
  Money amount = 2 [(buf.validate.field).required = true];
  repeated string tags = 3 [(buf.validate.field).repeated = {max_items: 10, unique: true}];
  string secret = 4 [(mandate.v1.field).sensitive = true];
}
message Resp { string id = 1; Money amount = 2; }
service BenchService {
`)
	for i := range n {
		fmt.Fprintf(&src, "  rpc Op%04d(Req) returns (Resp) { option (mandate.v1.command) = {code: \"bench.op%04d\" agent_hint: \"Benchmark operation %d.\" risk: RISK_L3 side_effects: \"ledger\" permissions: \"bench.write\"}; }\n", i, i, i)
	}
	src.WriteString("}\n")
	dir := b.TempDir()
	writeFile(b, filepath.Join(dir, "bench.proto"), src.String())
	out, err := compile.Compile(compileProtos(b, dir, "bench.proto"), []string{"bench.proto"})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		s, err := manifest.Load(out.Manifest, out.DescriptorSet)
		if err != nil {
			b.Fatal(err)
		}
		if tools := tooldesc.FromSet(s, tooldesc.Options{}); len(tools) != n {
			b.Fatalf("%d tools", len(tools))
		}
	}
	b.ReportMetric(float64(len(out.Manifest)), "manifest-bytes")
}
