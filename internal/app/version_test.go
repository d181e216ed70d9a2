package app

import (
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/manifest"
)

func TestReadVersion(t *testing.T) {
	cases := []struct {
		name string
		bi   *debug.BuildInfo
		ok   bool
		want versionInfo
	}{
		{"no build info", nil, false, versionInfo{Version: "(devel)", Commit: "unknown", Modified: "unknown", Go: runtime.Version(), ManifestDigest: "d"}},
		{"work tree without VCS stamp", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}}, true,
			versionInfo{Version: "(devel)", Commit: "unknown", Modified: "unknown", Go: "go1.26.0", ManifestDigest: "d"}},
		{"tagged and stamped", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"}, {Key: "vcs.modified", Value: "true"},
		}}, true, versionInfo{Version: "v1.2.3", Commit: "0123456789abcdef0123456789abcdef01234567", Modified: "true", Go: "go1.26.8", ManifestDigest: "d"}},
		{"clean tree", &debug.BuildInfo{GoVersion: "go1.26.8", Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "false"}}}, true,
			versionInfo{Version: "(devel)", Commit: "abc", Modified: "false", Go: "go1.26.8", ManifestDigest: "d"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := readVersion(tc.bi, tc.ok, "d"); got != tc.want {
				t.Fatalf("readVersion = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestVersionCommand(t *testing.T) {
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, nil, "version")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	keys := []string{"version", "commit", "modified", "go", "manifest", "manifest_digest"}
	if len(lines) != len(keys) {
		t.Fatalf("%d lines, want %d: %q", len(lines), len(keys), out)
	}
	got := map[string]string{}
	for i, l := range lines {
		k, v, ok := strings.Cut(l, ": ")
		if !ok || k != keys[i] || v == "" {
			t.Fatalf("line %d %q, want %q: <value>", i, l, keys[i])
		}
		got[k] = v
	}
	if got["manifest_digest"] != set.Digest() || got["go"] != runtime.Version() {
		t.Errorf("digest %q go %q, want %q %q", got["manifest_digest"], got["go"], set.Digest(), runtime.Version())
	}

	code, out, errOut = run(t, nil, "version", "--json")
	if code != 0 {
		t.Fatalf("--json: exit %d: %s", code, errOut)
	}
	var v map[string]string
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("--json output is not one JSON object of strings: %v\n%s", err, out)
	}
	for _, k := range keys {
		if v[k] != got[k] {
			t.Errorf("--json %s = %q, text says %q", k, v[k], got[k])
		}
	}
	if code, _, _ := run(t, nil, "version", "extra"); code == 0 {
		t.Error("an unexpected argument was accepted")
	}
}
