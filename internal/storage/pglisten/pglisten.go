// Package pglisten keeps a PostgreSQL LISTEN open on a dedicated connection (outside any pool)
// and hands its notifications to a callback. When the connection fails it reconnects with
// jittered exponential backoff and, once LISTEN is back in place, tells the caller to resync:
// notifications sent while it was away are lost, so whatever they would have announced must be
// re-read.
package pglisten

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mandate-dev/mandate/internal/storage/pg"
)

// Config describes a listener. Conn and Channels are required; the callbacks run on the
// listener's goroutine, one at a time, and should not block for long.
type Config struct {
	// Conn is the connection configuration; each connection uses a copy of it.
	Conn *pgx.ConnConfig
	// ApplicationName, when set, is the connection's application_name, so that the listener
	// can be told apart in pg_stat_activity.
	ApplicationName string
	// Channels are the channels to LISTEN on.
	Channels []string
	// ReconnectMin and ReconnectMax bound the reconnect backoff. Defaults 100ms and 5s.
	ReconnectMin, ReconnectMax time.Duration
	// Logger receives connection problems. Default slog.Default().
	Logger *slog.Logger
	// Name names the listener in log messages, e.g. "audit listener".
	Name string

	// Connected is called each time LISTEN is in place. resync is false for the first
	// connection of a Run and true after every reconnect, when notifications may have been
	// missed.
	Connected func(ctx context.Context, resync bool)
	// Notify is called for each notification on one of Channels, in the order received.
	Notify func(ctx context.Context, n *pgconn.Notification)
	// Lost, when set, is called when a connection on which Connected was called fails while
	// ctx is still live, before the backoff wait.
	Lost func(ctx context.Context, err error)
}

func (c Config) withDefaults() Config {
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = 100 * time.Millisecond
	}
	if c.ReconnectMax < c.ReconnectMin {
		c.ReconnectMax = max(5*time.Second, c.ReconnectMin)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Name == "" {
		c.Name = "postgres listener"
	}
	if c.Connected == nil {
		c.Connected = func(context.Context, bool) {}
	}
	if c.Notify == nil {
		c.Notify = func(context.Context, *pgconn.Notification) {}
	}
	return c
}

// ErrInvalidConfig is returned by [Run] for a Config without Conn or Channels.
var ErrInvalidConfig = errors.New("pglisten: invalid config")

// Run listens until ctx ends, reconnecting as needed, and then returns nil. It returns an error
// only for an invalid Config.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Conn == nil || len(cfg.Channels) == 0 {
		return fmt.Errorf("%w: Conn and Channels are required", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	backoff := cfg.ReconnectMin
	first := true
	for {
		established := false
		err := listenOnce(ctx, cfg, func() {
			established = true
			backoff = cfg.ReconnectMin
			cfg.Connected(ctx, !first)
			first = false
		})
		if ctx.Err() != nil {
			return nil
		}
		if established && cfg.Lost != nil {
			cfg.Lost(ctx, err)
		}
		cfg.Logger.WarnContext(ctx, cfg.Name+" lost its connection; reconnecting",
			"error_kind", pg.Classify(err).String(), "error", err, "retry_in", backoff)
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1)) //nolint:gosec // reconnect jitter, not a secret
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, cfg.ReconnectMax)
	}
}

// listenOnce connects, listens and delivers notifications until the connection fails or ctx
// ends. connected is called once LISTEN is in place on every channel.
func listenOnce(ctx context.Context, cfg Config, connected func()) error {
	cc := cfg.Conn.Copy()
	if cfg.ApplicationName != "" {
		if cc.RuntimeParams == nil {
			cc.RuntimeParams = map[string]string{}
		}
		cc.RuntimeParams["application_name"] = cfg.ApplicationName
	}
	// A listener waits for the server to speak first: no reply timeout.
	conn, err := pgx.ConnectConfig(pg.WaitingForNotifications(ctx), cc)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	for _, ch := range cfg.Channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return err
		}
	}
	connected()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if slices.Contains(cfg.Channels, n.Channel) {
			cfg.Notify(ctx, n)
		}
	}
}
