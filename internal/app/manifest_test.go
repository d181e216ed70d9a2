package app

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/examples/policy"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/manifest/manifesttest"
)

// TestServicesRefuseToStartWithoutAManifest: outside `mandate dev` no
// service falls back to the sample; the refusal names the flags and how to
// ask for the sample.
func TestServicesRefuseToStartWithoutAManifest(t *testing.T) {
	env := map[string]string{"MANDATE_DEV_SECRET": testSecret, "MANDATE_SERVICE_SECRET": testSecret, "MANDATE_STORE": "memory"}
	for _, args := range [][]string{
		{"catalog"}, {"confirm"}, {"mcpbridge"},
		{"executor", "--backend", "examples.helpdesk.v1.HelpdeskService=127.0.0.1:1"},
	} {
		t.Run(args[0], func(t *testing.T) {
			code, _, errOut := run(t, env, args...)
			want := "--manifest and --descriptors are required (or --manifest=sample for the embedded helpdesk sample)"
			if code != 1 || !strings.Contains(errOut, want) {
				t.Fatalf("exit %d, stderr %q; want 1 and %q", code, errOut, want)
			}
		})
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"MANDATE_MANIFEST": "sample", "MANDATE_DESCRIPTORS": "d.binpb"}, "does not go with --manifest=sample"},
		{map[string]string{"MANDATE_MANIFEST": "m.json"}, "--descriptors (MANDATE_DESCRIPTORS) is required with --manifest"},
		{map[string]string{"MANDATE_DESCRIPTORS": "d.binpb"}, "--manifest (MANDATE_MANIFEST) is required with --descriptors"},
	} {
		for k, v := range env {
			tc.env[k] = v
		}
		code, _, errOut := run(t, tc.env, "catalog")
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", tc.env, code, errOut, tc.want)
		}
	}
}

// TestVersionPrintsTheManifestItWouldLoad: `mandate version` prints the
// digest of the --manifest pair (or MANDATE_MANIFEST's), the sample's
// only when none is given.
func TestVersionPrintsTheManifestItWouldLoad(t *testing.T) {
	v := manifesttest.Variant(t, t.TempDir())
	for _, tc := range []struct {
		name                   string
		env                    map[string]string
		args                   []string
		wantManifest, wantDigs string
	}{
		{"none", nil, nil, "sample", manifest.SampleDigest()},
		{"flags", nil, []string{"--manifest", v.Manifest, "--descriptors", v.Descriptors}, v.Manifest, v.Digest},
		{"variables", map[string]string{"MANDATE_MANIFEST": v.Manifest, "MANDATE_DESCRIPTORS": v.Descriptors}, nil, v.Manifest, v.Digest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := run(t, tc.env, append([]string{"version", "--json"}, tc.args...)...)
			var got map[string]string
			if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
				t.Fatalf("exit %d: %s%s", code, out, errOut)
			}
			if got["manifest"] != tc.wantManifest || got["manifest_digest"] != tc.wantDigs {
				t.Fatalf("manifest %q digest %q, want %q %q", got["manifest"], got["manifest_digest"], tc.wantManifest, tc.wantDigs)
			}
		})
	}
	if v.Digest == manifest.SampleDigest() {
		t.Fatal("the variant has the sample's digest")
	}
}

// TestUnknownVariableIsReported: every command warns about a MANDATE_*
// variable no command reads, naming the nearest known one.
func TestUnknownVariableIsReported(t *testing.T) {
	var out, errOut bytes.Buffer
	environ := func() []string { return []string{"MANDATE_POLCY=p.yaml", "MANDATE_JSON=true"} }
	code := Run(context.Background(), []string{"version"}, IO{Stdout: &out, Stderr: &errOut, Env: func(string) (string, bool) { return "", false }, Environ: environ})
	want := "mandate: warning: MANDATE_POLCY is not a Mandate setting and is ignored; did you mean MANDATE_POLICY?\n"
	if code != 0 || errOut.String() != want {
		t.Fatalf("exit %d, stderr %q; want %q", code, errOut.String(), want)
	}
}

// TestFlagVariablesAreEveryFlag keeps config.FlagVariables, the variables
// no warning is given for, equal to what the commands declare.
func TestFlagVariablesAreEveryFlag(t *testing.T) {
	_ = reference(t) // every command's -h declares its flags
	declared := config.Declared()
	for _, v := range declared {
		if !slices.Contains(config.FlagVariables, v) {
			t.Errorf("%s is a flag's variable missing from config.FlagVariables", v)
		}
	}
	for _, v := range config.FlagVariables {
		if !slices.Contains(declared, v) {
			t.Errorf("config.FlagVariables lists %s, which no command declares", v)
		}
	}
}

// TestDevPrincipalsOfTheDemo: the tokens of the demo policy are the ones
// `mandate dev` has always written.
func TestDevPrincipalsOfTheDemo(t *testing.T) {
	pol, err := directory.ParsePolicy("demo.yaml", policy.Demo)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range devPrincipals(pol) {
		names = append(names, p.name)
		if p.name == "payout-bot@carol" && (p.org != "finance" || p.tenant != "acme" || p.user != "carol" || p.agent != "payout-bot") {
			t.Errorf("payout-bot: %+v", p)
		}
	}
	slices.Sort(names)
	want := []string{"alice", "bob", "carol", "dave", "finance-bot@carol", "olive", "payout-bot@carol", "support-bot@alice"}
	if !slices.Equal(names, want) {
		t.Fatalf("names %v, want %v", names, want)
	}
}

const ownPolicy = `version: 1
tenants:
  - id: initech
    display_name: Initech
    features: []
    roles:
      eng: [ticket.read]
    users:
      - {id: peter, org: eng, roles: [eng]}
      - {id: milton, org: eng, roles: [eng], disabled: true}
    agents:
      - {id: tps-bot, user: peter}
  - id: acme
    display_name: Acme
    roles:
      eng: [ticket.read]
    users:
      - {id: peter, org: lab, roles: [eng]}
`

// TestDevRunsAnotherManifestAndPolicy: with --manifest, --descriptors,
// --backend and --policy, `mandate dev` serves that manifest (its digest in
// /healthz), writes tokens for the policy's active users and agents, and
// refuses a manifest whose service no --backend names.
func TestDevRunsAnotherManifestAndPolicy(t *testing.T) {
	dir := t.TempDir()
	v := manifesttest.Variant(t, dir)
	polFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(polFile, []byte(ownPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	d := devSettings{httpAddr: "127.0.0.1:0", grpcAddr: "127.0.0.1:0", tokensFile: filepath.Join(dir, "tokens.json"),
		manifest: clicore.ManifestFiles(v.Manifest, v.Descriptors), policyFile: polFile}
	d.events.Keep, d.events.PurgeInterval = time.Hour, time.Hour
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	env := func(string) (string, bool) { return "", false }

	var cl0 clicore.Closers
	_, err := startDev(t.Context(), d, log, IO{Stdout: io.Discard, Stderr: io.Discard, Env: env}, &cl0)
	cl0.Close()
	if err == nil || !strings.Contains(err.Error(), "--backend names no address for examples.helpdesk.v1.HelpdeskService") {
		t.Fatalf("without --backend: %v", err)
	}

	d.backends = []string{"examples.helpdesk.v1.HelpdeskService=127.0.0.1:1"}
	var out bytes.Buffer
	var cl clicore.Closers
	defer cl.Close()
	p, err := startDev(t.Context(), d, log, IO{Stdout: &out, Stderr: io.Discard, Env: env}, &cl)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "Serving manifest "+v.Digest+"; policy "+polFile) ||
		!strings.Contains(out.String(), "backend examples.helpdesk.v1.HelpdeskService: 127.0.0.1:1") || strings.Contains(out.String(), "ticket.search") {
		t.Fatalf("banner:\n%s", out.String())
	}
	b, err := os.ReadFile(d.tokensFile)
	if err != nil {
		t.Fatal(err)
	}
	var tokens map[string]string
	if err := json.Unmarshal(b, &tokens); err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range tokens {
		names = append(names, n)
	}
	slices.Sort(names)
	if want := []string{"acme/peter", "peter", "tps-bot@peter"}; !slices.Equal(names, want) {
		t.Fatalf("tokens for %v, want %v", names, want)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("mandate dev: %v", err)
		}
	}()
	healthz := "http://" + strings.Fields(strings.SplitN(out.String(), "health http://", 2)[1])[0]
	var body struct {
		ManifestDigest string `json:"manifest_digest"`
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if resp, err := http.Get(healthz); err == nil { //nolint:noctx // test polling
			_ = json.NewDecoder(resp.Body).Decode(&body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("never healthy")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if body.ManifestDigest != v.Digest {
		t.Fatalf("/healthz manifest_digest %q, want %q", body.ManifestDigest, v.Digest)
	}
}
