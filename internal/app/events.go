package app

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/services/executor/outbox"
)

// runEvents dispatches `mandate events <sub>`.
func runEvents(ctx context.Context, args []string, io IO) error {
	if len(args) > 0 && args[0] == "tail" {
		return runEventsTail(ctx, args[1:], io)
	}
	fmt.Fprintln(io.Stderr, "Usage: mandate events tail --tenant TENANT [--command CODE] [--all]")
	return clicore.ErrUsage
}

// runEventsTail prints a tenant's events as they arrive, one CloudEvent JSON per line.
func runEventsTail(ctx context.Context, args []string, io IO) error {
	var (
		url                     config.Secret
		tenant, command, prefix string
		all                     bool
	)
	s := config.New("events tail", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	s.SecretVar(&url, "events-url", "NATS server(s) with the events stream (nats://host:4222)")
	s.String(&tenant, "tenant", "", "tenant whose events are printed")
	s.String(&command, "command", "", "print only this command's events (its code, e.g. ticket.refund)")
	s.String(&prefix, "events-subject-prefix", outbox.DefaultPrefix, "first token of event subjects, as the executor's")
	s.Bool(&all, "all", false, "print the events the stream keeps first, then new ones")
	s.Require("events-url", func() bool { return !url.Set() })
	s.Require("tenant", func() bool { return tenant == "" })
	if err := s.Parse(args); err != nil {
		return err
	}
	// Unlike the relay, the tail has nothing to do without the broker: fail at once.
	nc, err := nats.Connect(url.Reveal(), nats.Name("mandate events tail"), nats.Timeout(5*time.Second), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("--events-url: %w", err)
	}
	defer nc.Close()
	return outbox.Tail(ctx, nc, outbox.TailConfig{Tenant: tenant, Command: command, Prefix: prefix, All: all}, func(data []byte) error {
		_, err := fmt.Fprintf(io.Stdout, "%s\n", data)
		return err
	})
}
