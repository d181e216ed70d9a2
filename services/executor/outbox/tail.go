package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TailConfig says which events Tail follows.
type TailConfig struct {
	// Tenant whose events are followed. Required.
	Tenant string
	// Command narrows them to one command's (its code); empty: every command.
	Command string
	// Prefix is the subjects' first token. Default "mandate".
	Prefix string
	// All starts from the oldest event the stream keeps instead of the next new one.
	All bool
}

// Tail follows the events of cfg.Tenant on nc with an ephemeral ordered consumer (the stream
// is found by subject) and calls fn with each message's CloudEvent JSON, in stream order,
// until ctx ends (then it returns nil) or fn fails.
func Tail(ctx context.Context, nc *nats.Conn, cfg TailConfig, fn func(data []byte) error) error {
	if cfg.Tenant == "" {
		return errors.New("outbox: a tenant is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	filter := TenantFilter(cfg.Prefix, cfg.Tenant)
	if cfg.Command != "" {
		filter = Subject(cfg.Prefix, cfg.Tenant, cfg.Command)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream, err := js.StreamNameBySubject(ctx, filter)
	if err != nil {
		return fmt.Errorf("no stream takes %s: %w", filter, err)
	}
	policy := jetstream.DeliverNewPolicy
	if cfg.All {
		policy = jetstream.DeliverAllPolicy
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: policy})
	if err != nil {
		return fmt.Errorf("following %s: %w", filter, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("following %s: %w", filter, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("following %s: %w", filter, err)
		}
		if err := fn(msg.Data()); err != nil {
			return err
		}
	}
}
