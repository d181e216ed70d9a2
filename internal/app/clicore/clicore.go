// Package clicore is what every Mandate binary's commands share: the
// service flags (listen addresses, storage, tokens, logging, telemetry),
// the process group a service runs in, the closers that release what it
// opened, and the exit-code convention. It imports no service: the
// all-in-one `mandate` (internal/app) and each per-service binary
// (cmd/mandate-<service>, over internal/app/<service>cmd) link it with only
// the services they run.
package clicore

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/mandate-dev/mandate/internal/config"
)

// IO is what a command reads and writes.
type IO struct {
	Stdout io.Writer
	Stderr io.Writer
	// Env looks up environment variables (os.LookupEnv in production).
	Env func(string) (string, bool)
	// Environ lists the environment (os.Environ in production), for the
	// warning about MANDATE_* variables no command reads; nil: no check.
	Environ func() []string
}

// WarnUnknownVariables warns on io.Stderr about every MANDATE_* variable of
// the environment that no Mandate command reads (config.WarnUnknown): a
// misspelt setting is reported, never ignored silently.
func WarnUnknownVariables(io IO) {
	if io.Environ != nil {
		config.WarnUnknown(io.Stderr, io.Environ())
	}
}

// RunFunc runs a command with its arguments (the command's name removed).
type RunFunc func(ctx context.Context, args []string, io IO) error

// Defaults shared by the commands and the services.
const (
	DefaultIssuer   = "mandate-dev"
	DefaultAudience = "mandate"
)

// ErrUsage marks errors already explained by usage output.
var ErrUsage = errors.New("usage")

// ExitError is an error with the exit code it means, for a command whose
// codes say more than success or failure (`mandate manifest diff`: 1 for
// findings, 2 for bad input). Err may be nil: the command already said
// why.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode is the exit code of a command that returned err: 0 for success
// and for -h, an *ExitError's code, else 1, after printing err prefixed
// with name unless the usage output already explained it.
func ExitCode(name string, err error, stderr io.Writer) int {
	var exit *ExitError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &exit):
		if exit.Err != nil && !errors.Is(exit.Err, ErrUsage) {
			fmt.Fprintf(stderr, "%s: %v\n", name, exit.Err)
		}
		return exit.Code
	case errors.Is(err, ErrUsage):
		return 1
	default:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
}

// Main runs a single-service binary: run gets the process's arguments,
// standard streams and environment, and a context that ends on SIGINT or
// SIGTERM. It returns the exit code.
func Main(name string, run RunFunc) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	std := IO{Stdout: os.Stdout, Stderr: os.Stderr, Env: os.LookupEnv, Environ: os.Environ}
	WarnUnknownVariables(std)
	return ExitCode(name, run(ctx, os.Args[1:], std), os.Stderr)
}
