// Package cli implements the subcommands of the mandate binary. Each
// subcommand parses its flags (with MANDATE_* fallbacks), validates them
// and calls the packages that do the work; nothing here holds business
// logic.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// IO is what a subcommand reads and writes.
type IO struct {
	Stdout io.Writer
	Stderr io.Writer
	// Env looks up environment variables (os.LookupEnv in production).
	Env func(string) (string, bool)
}

// Defaults shared by the subcommands and the services.
const (
	DefaultIssuer      = "mandate-dev"
	DefaultAudience    = "mandate"
	defaultDatabaseURL = ""
)

type command struct {
	summary string
	run     func(ctx context.Context, args []string, io IO) error
}

var commands = map[string]command{
	"token":       {"mint a development token signed with the dev secret", runToken},
	"migrate":     {"apply every service's database migrations (idempotent, safe to run concurrently)", runMigrate},
	"policy":      {"manage the policy directory: `mandate policy apply -f FILE`", runPolicy},
	"audit":       {"run the audit service; `mandate audit query|verify` read the trail", runAudit},
	"catalog":     {"run the catalog: tool lists per principal, manifest reads, ops.review", runCatalog},
	"confirm":     {"run the confirm service and its approval pages", runConfirm},
	"dev":         {"run the whole suite in one process on in-memory stores, with the helpdesk sample", runDev},
	"events":      {"follow domain events on NATS JetStream: `mandate events tail --tenant T`", runEvents},
	"executor":    {"run the executor: the governed pipeline and proxy in front of the backends", runExecutor},
	"helpdesk":    {"run the helpdesk sample backend (serves only calls relayed by the executor)", runHelpdesk},
	"mcpbridge":   {"run the MCP bridge (Streamable HTTP) over the catalog, executor and confirm services", runMCPBridge},
	"healthcheck": {"probe a service's /healthz or gRPC health; exit 0 only when serving (container health checks)", runHealthcheck},
	"version":     {"print the module version, VCS commit, Go version and embedded manifest digest (--json)", runVersion},
}

// errUsage marks errors already explained by usage output.
var errUsage = errors.New("usage")

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
	if err := cmd.run(ctx, args[1:], io); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if !errors.Is(err, errUsage) {
			fmt.Fprintf(io.Stderr, "mandate %s: %v\n", args[0], err)
		}
		return 1
	}
	return 0
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
