package app

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
)

// versionInfo is what `mandate version` reports: enough to tell which
// build and which commands a running deployment has.
type versionInfo struct {
	// Version is the main module's version: a tag when built with
	// `go install …@vX.Y.Z`, "(devel)" from a work tree.
	Version string `json:"version"`
	// Commit is the VCS revision the binary was built from, "unknown" when
	// the build did not stamp it (-buildvcs=false, no .git).
	Commit string `json:"commit"`
	// Modified tells whether the work tree had uncommitted changes: "true",
	// "false" or "unknown".
	Modified string `json:"modified"`
	// Go is the toolchain that built the binary.
	Go string `json:"go"`
	// Manifest says which manifest the digest is of: "sample" (the
	// embedded helpdesk sample, which only `mandate dev` loads unasked) or
	// the --manifest file.
	Manifest string `json:"manifest"`
	// ManifestDigest is the digest of that manifest: the one the services
	// would load with the same --manifest and --descriptors (or
	// MANDATE_MANIFEST and MANDATE_DESCRIPTORS).
	ManifestDigest string `json:"manifest_digest"`
}

// readVersion fills versionInfo from the build information (ok false: the
// binary carries none) and the manifest digest.
func readVersion(bi *debug.BuildInfo, ok bool, digest string) versionInfo {
	v := versionInfo{Version: "(devel)", Commit: "unknown", Modified: "unknown", Go: runtime.Version(), ManifestDigest: digest}
	if !ok || bi == nil {
		return v
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if s.Value != "" {
				v.Commit = s.Value
			}
		case "vcs.modified":
			if s.Value == "true" || s.Value == "false" {
				v.Modified = s.Value
			}
		}
	}
	return v
}

// runVersion prints the module version, VCS commit, Go version and the
// digest of the manifest --manifest selects (the embedded sample without
// one), one `key: value` per line or as JSON.
func runVersion(_ context.Context, args []string, io IO) error {
	var (
		asJSON bool
		mf     clicore.ManifestFlags
	)
	s := config.New("version", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	s.Bool(&asJSON, "json", false, "print one JSON object instead of key: value lines")
	mf.DeclareOptional(s)
	if err := s.Parse(args); err != nil {
		return err
	}
	if s.FlagSet().NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", s.FlagSet().Arg(0))
	}
	set, err := mf.Load()
	if err != nil {
		return err
	}
	bi, ok := debug.ReadBuildInfo()
	v := readVersion(bi, ok, set.Digest())
	v.Manifest = clicore.SampleManifest
	if mf.Given() {
		v.Manifest = mf.Path()
	}
	if asJSON {
		enc := json.NewEncoder(io.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	_, err = fmt.Fprintf(io.Stdout, "version: %s\ncommit: %s\nmodified: %s\ngo: %s\nmanifest: %s\nmanifest_digest: %s\n",
		v.Version, v.Commit, v.Modified, v.Go, v.Manifest, v.ManifestDigest)
	return err
}
