// Package manifesttest writes manifests for tests: the helpdesk sample as
// files, and a variant of it that differs from the sample (another digest,
// the same descriptors), to show services that disagree refusing each
// other.
package manifesttest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	genmanifest "github.com/mandate-dev/mandate/gen/manifest"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// Files is a manifest written to disk.
type Files struct {
	Manifest, Descriptors string
	// Digest is the manifest's digest.
	Digest string
}

// Sample writes the embedded sample's manifest and descriptors to dir.
func Sample(t testing.TB, dir string) Files {
	t.Helper()
	return write(t, dir, "sample", genmanifest.Manifest)
}

// Variant writes to dir a manifest that declares the sample's commands
// with one description changed: a valid manifest of another digest over
// the sample's descriptors, as a deployment one build behind would run.
func Variant(t testing.TB, dir string) Files {
	t.Helper()
	var m manifest.Manifest
	if err := json.Unmarshal(genmanifest.Manifest, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Commands) == 0 {
		t.Fatal("the sample declares no command")
	}
	m.Commands[0].Description += " (variant)"
	b, err := manifest.Encode(&m)
	if err != nil {
		t.Fatal(err)
	}
	return write(t, dir, "variant", b)
}

func write(t testing.TB, dir, name string, manifestJSON []byte) Files {
	t.Helper()
	f := Files{Manifest: filepath.Join(dir, name+".manifest.json"), Descriptors: filepath.Join(dir, name+".descriptors.binpb")}
	if err := os.WriteFile(f.Manifest, manifestJSON, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Descriptors, genmanifest.DescriptorSet, 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := manifest.Load(manifestJSON, genmanifest.DescriptorSet)
	if err != nil {
		t.Fatal(err)
	}
	f.Digest = set.Digest()
	return f
}
