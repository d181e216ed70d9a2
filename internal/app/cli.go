// Package cli implements the subcommands of the all-in-one mandate binary.
// Each subcommand parses its flags (with MANDATE_* fallbacks), validates
// them and calls the packages that do the work; nothing here holds
// business logic. The services' own commands live in
// internal/app/<service>cmd, which the per-service binaries
// (cmd/mandate-<service>) run alone; this package adds `mandate dev`, which
// builds them all in one process, and the operator tools.
package app

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/mandate-dev/mandate/internal/app/catalogcmd"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/app/confirmcmd"
	"github.com/mandate-dev/mandate/internal/app/executorcmd"
	"github.com/mandate-dev/mandate/internal/app/helpdeskcmd"
	"github.com/mandate-dev/mandate/internal/app/mcpbridgecmd"
)

// IO is what a subcommand reads and writes.
type IO = clicore.IO

// Defaults shared by the subcommands and the services.
const (
	DefaultIssuer   = clicore.DefaultIssuer
	DefaultAudience = clicore.DefaultAudience
)

type command struct {
	summary string
	run     clicore.RunFunc
}

var commands = map[string]command{
	"token":       {"mint a development token signed with the dev secret", runToken},
	"migrate":     {"apply every service's database migrations (idempotent, safe to run concurrently)", runMigrate},
	"policy":      {"manage the policy directory: `mandate policy apply -f FILE`, `mandate policy simulate --policy FILE`", runPolicy},
	"manifest":    {"compare two manifests for what they promise: `mandate manifest diff OLD NEW` (docs/governance-diff.md)", runManifest},
	"proto":       {"write the .proto files your service's build imports: `mandate proto export DIR`", runProto},
	"init":        {"scaffold a module for a service of your own: `mandate init DIR --service NAME`", runInit},
	"audit":       {"run the audit service; `mandate audit query|verify` read the trail, `resolve` and `dead-letters` are the operator's", runAudit},
	"catalog":     {"run the catalog: tool lists per principal, manifest reads, ops.review", catalogcmd.Run},
	"confirm":     {"run the confirm service and its approval pages", confirmcmd.Run},
	"dev":         {"run the whole suite in one process on in-memory stores: the helpdesk sample, or --manifest with its --backend and --policy", runDev},
	"events":      {"follow domain events on NATS JetStream: `mandate events tail --tenant T`", runEvents},
	"executor":    {"run the executor: the governed pipeline and proxy in front of the backends", executorcmd.Run},
	"helpdesk":    {"run the helpdesk sample backend (serves only calls relayed by the executor)", helpdeskcmd.Run},
	"mcpbridge":   {"run the MCP bridge (Streamable HTTP) over the catalog, executor and confirm services", mcpbridgecmd.Run},
	"healthcheck": {"probe a service's /healthz or gRPC health; exit 0 only when serving (container health checks)", runHealthcheck},
	"version":     {"print the module version, VCS commit, Go version and the digest of the manifest --manifest selects (--json)", runVersion},
}

// Run runs the subcommand named by args[0] and returns the exit code.
func Run(ctx context.Context, args []string, io IO) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(io.Stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(io.Stderr, "mandate: unknown command %q\n\n", args[0])
		usage(io.Stderr)
		return 2
	}
	clicore.WarnUnknownVariables(io)
	return clicore.ExitCode("mandate "+args[0], cmd.run(ctx, args[1:], io), io.Stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: mandate <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Every flag also reads MANDATE_<FLAG_NAME>, e.g. --database-url from MANDATE_DATABASE_URL.")
	fmt.Fprintln(w, "Run `mandate <command> -h` for its flags.")
}

func joinLines(lines ...string) string { return strings.Join(lines, "\n") }
