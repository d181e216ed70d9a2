package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/pluginpb"

	"github.com/mandate-dev/mandate/internal/compile/compiletest"
)

// TestWarningsArePrintedAndTheBuildGoesOn: a warning rule (MANDATE1017, an
// L3 recall) reaches stderr and the manifest is still written.
func TestWarningsArePrintedAndTheBuildGoesOn(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "w.proto"), []byte(`syntax = "proto3";
package w.v1;
import "mandate/v1/options.proto";
message Req { string id = 1; }
service S {
  rpc A(Req) returns (Req) { option (mandate.v1.command) = {code: "w.submit" agent_hint: "h" risk: RISK_L1 reversible: true recall: "w.undo"}; }
  rpc B(Req) returns (Req) { option (mandate.v1.command) = {code: "w.undo" agent_hint: "h" risk: RISK_L3}; }
}
`))
	set := compiletest.Protos(t, dir, "w.proto")
	var stderr bytes.Buffer
	resp := generate(&pluginpb.CodeGeneratorRequest{FileToGenerate: []string{"w.proto"}, ProtoFile: set.GetFile()}, &stderr)
	if resp.Error != nil {
		t.Fatalf("a warning refused the build: %s", resp.GetError())
	}
	if len(resp.GetFile()) != 3 {
		t.Errorf("wrote %d files, want the manifest, the descriptor set and manifest.go", len(resp.GetFile()))
	}
	for _, want := range []string{"MANDATE1017 (warning)", "w.submit", "w.undo"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr does not mention %q:\n%s", want, stderr.String())
		}
	}
}
