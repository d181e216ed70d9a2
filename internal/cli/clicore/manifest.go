package clicore

import (
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// ManifestFlags select the manifest: the embedded sample domain, or a
// deployment's own pair of files.
type ManifestFlags struct{ manifest, descriptors string }

// Declare declares --manifest and --descriptors on s.
func (m *ManifestFlags) Declare(s *config.Set) {
	s.String(&m.manifest, "manifest", "", "manifest.json of the deployment (default: the embedded helpdesk sample)")
	s.String(&m.descriptors, "descriptors", "", "descriptors.binpb that goes with --manifest")
	s.Check(func() error {
		if (m.manifest == "") != (m.descriptors == "") {
			return s.Errorf("manifest", "and --descriptors must be given together")
		}
		return nil
	})
}

// Load loads the selected manifest.
func (m *ManifestFlags) Load() (*manifest.Set, error) {
	if m.manifest == "" {
		return manifest.Embedded()
	}
	return manifest.LoadFiles(m.manifest, m.descriptors)
}
