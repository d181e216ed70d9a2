package clicore

import (
	"errors"

	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// SampleManifest is the --manifest value that selects the embedded
// helpdesk sample.
const SampleManifest = "sample"

// ErrNoManifest is the refusal of a service started without a manifest:
// outside `mandate dev` none falls back to the sample silently.
var ErrNoManifest = errors.New("--manifest and --descriptors are required (or --manifest=sample for the embedded helpdesk sample)")

// ManifestFlags select the manifest: a deployment's own pair of files, or
// the embedded helpdesk sample when asked for by name (--manifest=sample).
type ManifestFlags struct {
	manifest, descriptors string
	// optional: no --manifest means the sample (`mandate dev`, `mandate
	// version`), not a refusal.
	optional bool
}

// ManifestFiles selects a deployment's own pair of files, as the flags
// --manifest and --descriptors do (for a command built in code, e.g. a
// test of `mandate dev`).
func ManifestFiles(manifestPath, descriptorsPath string) ManifestFlags {
	return ManifestFlags{manifest: manifestPath, descriptors: descriptorsPath}
}

// Declare declares --manifest and --descriptors on s; a service started
// without them refuses to start (ErrNoManifest).
func (m *ManifestFlags) Declare(s *config.Set) {
	m.declare(s, "manifest.json of the deployment, or \"sample\" for the embedded helpdesk sample (required)")
	s.Check(func() error {
		if m.manifest == "" {
			return ErrNoManifest
		}
		return nil
	})
}

// DeclareOptional is Declare for a command that runs the sample when no
// manifest is given.
func (m *ManifestFlags) DeclareOptional(s *config.Set) {
	m.optional = true
	m.declare(s, "manifest.json of the deployment, or \"sample\" (default: the embedded helpdesk sample)")
}

func (m *ManifestFlags) declare(s *config.Set, help string) {
	s.String(&m.manifest, "manifest", "", help)
	s.String(&m.descriptors, "descriptors", "", "descriptors.binpb that goes with --manifest")
	s.Check(func() error {
		switch {
		case m.manifest == SampleManifest && m.descriptors != "":
			return s.Errorf("descriptors", "does not go with --manifest=sample: the sample embeds its descriptors")
		case m.manifest == SampleManifest:
			return nil
		case m.manifest == "" && m.descriptors != "":
			return s.Errorf("manifest", "is required with --descriptors")
		case m.manifest != "" && m.descriptors == "":
			return s.Errorf("descriptors", "is required with --manifest")
		}
		return nil
	})
}

// Given reports whether a deployment's own manifest files were given.
func (m *ManifestFlags) Given() bool { return m.manifest != "" && m.manifest != SampleManifest }

// Path is the --manifest value: a file, "sample", or "" when none was given.
func (m *ManifestFlags) Path() string { return m.manifest }

// Load loads the selected manifest.
func (m *ManifestFlags) Load() (*manifest.Set, error) {
	switch {
	case m.manifest == SampleManifest, m.manifest == "" && m.optional:
		return manifest.Embedded()
	case m.manifest == "":
		return nil, ErrNoManifest
	}
	return manifest.LoadFiles(m.manifest, m.descriptors)
}
