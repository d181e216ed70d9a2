// Command mandate is the single Mandate binary: one subcommand per service
// and the operator tools. Run `mandate help` for the list.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/mandate-dev/mandate/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := app.Run(ctx, os.Args[1:], app.IO{Stdout: os.Stdout, Stderr: os.Stderr, Env: os.LookupEnv, Environ: os.Environ})
	stop()
	os.Exit(code)
}
