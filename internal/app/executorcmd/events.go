package executorcmd

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/services/executor"
	"github.com/mandate-dev/mandate/services/executor/outbox"
)

// EventsFlags configure where the executor's domain events go and how long
// the store keeps them.
type EventsFlags struct {
	URL                 config.Secret
	Stream, Prefix      string
	Keep, PurgeInterval time.Duration
}

// Declare declares the events flags on s.
func (f *EventsFlags) Declare(s *config.Set) {
	s.SecretVar(&f.URL, "events-url", "NATS server(s) the event outbox is relayed to with JetStream (nats://host:4222); empty: events stay in the store only")
	s.String(&f.Stream, "events-stream", outbox.DefaultStream, "JetStream stream of the events (created over <events-subject-prefix>.> if missing)")
	s.String(&f.Prefix, "events-subject-prefix", outbox.DefaultPrefix, "first token of event subjects: <prefix>.<tenant>.<command>")
	s.Duration(&f.Keep, "events-keep", 24*time.Hour, "how long events stay in the store after their commit (once delivered, when --events-url is set)")
	s.Duration(&f.PurgeInterval, "purge-interval", 10*time.Minute, "how often delivered events and expired idempotency keys are purged")
	s.Check(func() error {
		if f.Keep <= 0 {
			return s.Errorf("events-keep", "must be positive")
		}
		if f.PurgeInterval <= 0 {
			return s.Errorf("purge-interval", "must be positive")
		}
		return nil
	})
}

// loops returns the outbox relay (with --events-url) and the purger, for the process to run
// in the background. Without a relay, the purger also drops old undelivered events: nobody
// would ever deliver them. The relay's broker connection is closed with cl.
func (f *EventsFlags) loops(store executor.Store, log *slog.Logger, cl *clicore.Closers) ([]func(context.Context) error, error) {
	var runs []func(context.Context) error
	if f.URL.Set() {
		r, err := outbox.New(outbox.Config{Store: store, URL: f.URL.Reveal(), Stream: f.Stream, Prefix: f.Prefix, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("--events-url: %w", err)
		}
		cl.Add(r.Close)
		runs = append(runs, r.Run)
	}
	p := outbox.Purger{Store: store, Every: f.PurgeInterval, KeepEvents: f.Keep, Undelivered: !f.URL.Set(), Logger: log}
	return append(runs, p.Run), nil
}
