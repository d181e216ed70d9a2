// Command mandate-bench measures what governance costs: it drives a read,
// ticket.search, and a write, expense.report.create with a fresh
// idempotency key per call (-commands), over MCP (the go-sdk client,
// loopback) through `mandate dev`, through the services as separate
// processes over Postgres (when a server answers), and through an
// ungoverned reference — a plain go-sdk MCP server whose tools call the
// same helpdesk backend in process — side by side in one run, and prints,
// one section per command, a table of throughput ratio, p50 latencies,
// server CPU and allocations per call. With the database, the separate
// processes are also set against their own ungoverned reference — a plain
// go-sdk server calling the topology's helpdesk service over gRPC, on the
// same Postgres — in a second table, one call of each command is traced
// span by span, and the audit Writer's acknowledged appends are compared
// with pgbench's single-row commits at 16 clients. It ends with issue #28's
// targets, per command, read from the run's own numbers.
//
//	make bench-governed            # or: go run ./cmd/mandate-bench
//
// Every server runs in a child process of this binary (it re-executes
// itself), so each one's CPU time and allocations are its own, read from
// getrusage and runtime.MemStats through a loopback stats endpoint.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	switch {
	case len(os.Args) > 2 && os.Args[1] == childMode:
		err = runChild(ctx, os.Args[2], os.Args[3:])
	case len(os.Args) > 3 && os.Args[1] == referenceMode:
		var backend string // the in-memory helpdesk unless a service's address follows
		if len(os.Args) > 4 {
			backend = os.Args[4]
		}
		err = runReference(ctx, os.Args[2], os.Args[3], backend)
	default:
		var cfg config
		if cfg, err = parseFlags(os.Args[1:]); err == nil {
			err = run(ctx, cfg, os.Stdout)
		}
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mandate-bench:", err)
		os.Exit(1)
	}
}
