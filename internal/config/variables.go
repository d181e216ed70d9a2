package config

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/mandate-dev/mandate/internal/suggest"
)

// FlagVariables are the variables of every flag of every Mandate command
// (a test in internal/app keeps the list equal to what the commands
// declare): the variables a deployment may set for any of them.
var FlagVariables = []string{
	"MANDATE_ACTOR_KIND", "MANDATE_ADVERTISE_URL", "MANDATE_AGENT", "MANDATE_ALL", "MANDATE_APPROVAL_BASE_URL",
	"MANDATE_APPROVED", "MANDATE_APPROVER", "MANDATE_AS", "MANDATE_AUDIENCE", "MANDATE_AUDIT_ADDR",
	"MANDATE_AUDIT_RELAY_LINGER", "MANDATE_AUDIT_RETAIN", "MANDATE_AUDIT_STREAM_MAX_AGE", "MANDATE_AUTHORIZATION_SERVER", "MANDATE_BACKEND",
	"MANDATE_CATALOG_ADDR", "MANDATE_COMMAND", "MANDATE_CONFIRM_ADDR", "MANDATE_CONFIRM_SIDE_EFFECTS",
	"MANDATE_CONVERSATION", "MANDATE_DATABASE_REPLY_TIMEOUT", "MANDATE_DATABASE_URL",
	"MANDATE_DEFAULT_DEADLINE", "MANDATE_DESCRIPTORS", "MANDATE_DEV_SECRET", "MANDATE_DRY_RUN",
	"MANDATE_EVENTS_KEEP", "MANDATE_EVENTS_STREAM", "MANDATE_EVENTS_SUBJECT_PREFIX", "MANDATE_EVENTS_URL",
	"MANDATE_EXECUTOR_ADDR", "MANDATE_F", "MANDATE_FAIL_ON", "MANDATE_FORCE", "MANDATE_FORMAT", "MANDATE_FROM",
	"MANDATE_GRPC_ADDR", "MANDATE_GRPC_KEEPALIVE_TIME", "MANDATE_GRPC_MAX_CONNECTION_AGE",
	"MANDATE_GRPC_MAX_CONNECTION_AGE_GRACE", "MANDATE_GRPC_SERVICE", "MANDATE_GRPC_TARGET", "MANDATE_HELD_FILE",
	"MANDATE_HTTP_ADDR", "MANDATE_ID", "MANDATE_IDEMPOTENCY_TTL", "MANDATE_IDLE_TIMEOUT", "MANDATE_INVOCATION",
	"MANDATE_ISSUER", "MANDATE_JSON", "MANDATE_JWKS_FILE", "MANDATE_LEASE", "MANDATE_LIMIT",
	"MANDATE_LOGIN_URL", "MANDATE_LOG_LEVEL", "MANDATE_MANIFEST", "MANDATE_MAX_SESSIONS", "MANDATE_METRICS", "MANDATE_MODEL",
	"MANDATE_MODEL_VERSION", "MANDATE_MODULE", "MANDATE_OIDC_ISSUER", "MANDATE_ORG", "MANDATE_OTLP_ENDPOINT",
	"MANDATE_OUTCOME", "MANDATE_OVERRIDES", "MANDATE_OVERRIDE_RECEIPT", "MANDATE_PAGE_TOKEN", "MANDATE_PHASE",
	"MANDATE_POLICY", "MANDATE_PURGE_INTERVAL", "MANDATE_RATE_BURST", "MANDATE_RATE_LIMIT", "MANDATE_REASON",
	"MANDATE_RECONCILE_AFTER", "MANDATE_RECONCILE_INTERVAL", "MANDATE_REDRIVE", "MANDATE_REPLACE",
	"MANDATE_RESOURCE_URL", "MANDATE_RETAIN_CHALLENGES", "MANDATE_RISK", "MANDATE_SAMPLE", "MANDATE_SEED", "MANDATE_SERVICE",
	"MANDATE_SERVICE_SECRET", "MANDATE_SESSION_TIMEOUT", "MANDATE_SIDE_EFFECT", "MANDATE_SINCE",
	"MANDATE_STAGE", "MANDATE_STATE_SECRET", "MANDATE_STORE", "MANDATE_STRICT", "MANDATE_TENANT",
	"MANDATE_TIMEOUT", "MANDATE_TO", "MANDATE_TOKEN", "MANDATE_TOKENS_FILE", "MANDATE_TTL", "MANDATE_URL",
	"MANDATE_USER", "MANDATE_WEBHOOK_SECRET", "MANDATE_WEBHOOK_URL",
}

// OtherVariables are MANDATE_* variables read by the tests, the benchmark
// and the deploy files rather than by a flag.
var OtherVariables = []string{
	"MANDATE_BENCH_CALLERS", "MANDATE_BENCH_PROFILE_DIR", "MANDATE_CHROMIUM", "MANDATE_CLI_TEST_CHILD", "MANDATE_IMAGE",
	"MANDATE_MIGRATE_TEST_CHILD_DSN", "MANDATE_REPORT_RSS", "MANDATE_REQUIRE_BROWSER", "MANDATE_REQUIRE_IDP", "MANDATE_REQUIRE_NODE",
	"MANDATE_REQUIRE_POSTGRES", "MANDATE_SCREENSHOTS", "MANDATE_TEST_DATABASE_URL",
}

// declared records every variable a Set declared in this process, for the
// test that keeps FlagVariables complete.
var declared sync.Map

// Declared returns the variables declared by the Sets of this process,
// sorted.
func Declared() []string {
	var out []string
	declared.Range(func(k, _ any) bool {
		out = append(out, k.(string))
		return true
	})
	sort.Strings(out)
	return out
}

// Unknown is a MANDATE_* variable no Mandate command reads.
type Unknown struct {
	Name string
	// Nearest is the known variable it most likely misspells, "" when none
	// is close.
	Nearest string
}

// UnknownVariables returns the MANDATE_* variables of environ ("NAME=value"
// entries, as os.Environ gives them) that no Mandate command reads, sorted.
// Their values are never looked at: one may be a secret.
func UnknownVariables(environ []string) []Unknown {
	known := append(slices.Clone(FlagVariables), OtherVariables...)
	var out []Unknown
	seen := map[string]bool{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "MANDATE_") || slices.Contains(known, name) || seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, Unknown{Name: name, Nearest: nearest(name, FlagVariables)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// WarnUnknown writes a warning to w for every unknown MANDATE_* variable
// of environ: a setting that would otherwise be ignored silently.
func WarnUnknown(w io.Writer, environ []string) {
	for _, u := range UnknownVariables(environ) {
		if u.Nearest != "" {
			fmt.Fprintf(w, "mandate: warning: %s is not a Mandate setting and is ignored; did you mean %s?\n", u.Name, u.Nearest)
			continue
		}
		fmt.Fprintf(w, "mandate: warning: %s is not a Mandate setting and is ignored\n", u.Name)
	}
}

// nearest returns the candidate closest to name by edit distance when it
// is close enough to be a misspelling (at most a third of the name's
// letters after the prefix differ), else "".
func nearest(name string, candidates []string) string {
	return suggest.Nearest(name, candidates, (len(name)-len("MANDATE_"))/3)
}
