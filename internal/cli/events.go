package cli

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/services/executor"
	"github.com/mandate-dev/mandate/services/executor/outbox"
)

// eventsFlags configure where the executor's domain events go and how long the store keeps
// them.
type eventsFlags struct {
	url                 config.Secret
	stream, prefix      string
	keep, purgeInterval time.Duration
}

func (f *eventsFlags) declare(s *config.Set) {
	s.SecretVar(&f.url, "events-url", "NATS server(s) the event outbox is relayed to with JetStream (nats://host:4222); empty: events stay in the store only")
	s.String(&f.stream, "events-stream", outbox.DefaultStream, "JetStream stream of the events (created over <events-subject-prefix>.> if missing)")
	s.String(&f.prefix, "events-subject-prefix", outbox.DefaultPrefix, "first token of event subjects: <prefix>.<tenant>.<command>")
	s.Duration(&f.keep, "events-keep", 24*time.Hour, "how long events stay in the store after their commit (once delivered, when --events-url is set)")
	s.Duration(&f.purgeInterval, "purge-interval", 10*time.Minute, "how often delivered events and expired idempotency keys are purged")
	s.Check(func() error {
		if f.keep <= 0 {
			return s.Errorf("events-keep", "must be positive")
		}
		if f.purgeInterval <= 0 {
			return s.Errorf("purge-interval", "must be positive")
		}
		return nil
	})
}

// loops returns the outbox relay (with --events-url) and the purger, for the process to run
// in the background. Without a relay, the purger also drops old undelivered events: nobody
// would ever deliver them. The relay's broker connection is closed with cl.
func (f *eventsFlags) loops(store executor.Store, log *slog.Logger, cl *closers) ([]func(context.Context) error, error) {
	var runs []func(context.Context) error
	if f.url.Set() {
		r, err := outbox.New(outbox.Config{Store: store, URL: f.url.Reveal(), Stream: f.stream, Prefix: f.prefix, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("--events-url: %w", err)
		}
		cl.add(r.Close)
		runs = append(runs, r.Run)
	}
	p := outbox.Purger{Store: store, Every: f.purgeInterval, KeepEvents: f.keep, Undelivered: !f.url.Set(), Logger: log}
	return append(runs, p.Run), nil
}

// runEvents dispatches `mandate events <sub>`.
func runEvents(ctx context.Context, args []string, io IO) error {
	if len(args) > 0 && args[0] == "tail" {
		return runEventsTail(ctx, args[1:], io)
	}
	fmt.Fprintln(io.Stderr, "Usage: mandate events tail --tenant TENANT [--command CODE] [--all]")
	return errUsage
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
