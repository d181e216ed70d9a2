package app

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestProtoExport: `mandate proto export DIR` writes the contract and the
// third-party protos under their import paths with their licences, and
// refuses to overwrite without --force.
func TestProtoExport(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	io := IO{Stdout: &out, Stderr: &errb, Env: func(string) (string, bool) { return "", false }}
	if code := Run(context.Background(), []string{"proto", "export", dir}, io); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, f := range []string{
		"mandate/v1/options.proto", "mandate/v1/errors.proto", "mandate/v1/receipt.proto",
		"buf/validate/validate.proto", "google/api/annotations.proto", "google/api/http.proto", "google/api/field_behavior.proto",
		"licenses/protovalidate/LICENSE", "licenses/googleapis/LICENSE",
	} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || len(b) == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "licenses/protovalidate/LICENSE")); !strings.Contains(string(b), "Apache License") {
		t.Error("protovalidate's licence is not the Apache licence it ships with")
	}
	if _, err := os.Stat(filepath.Join(dir, "examples")); err == nil {
		t.Error("the sample's protos were exported")
	}
	errb.Reset()
	if code := Run(context.Background(), []string{"proto", "export", dir}, io); code == 0 || !strings.Contains(errb.String(), "--force") {
		t.Fatalf("a second export over the first: exit %d, %s", code, errb.String())
	}
	if code := Run(context.Background(), []string{"proto", "export", "--force", dir}, io); code != 0 {
		t.Fatalf("--force: exit %d: %s", code, errb.String())
	}
}
