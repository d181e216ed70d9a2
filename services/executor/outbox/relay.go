package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/mandate-dev/mandate/services/executor"
)

var tracer = otel.Tracer("mandate/outbox")

// Defaults of Config.
const (
	DefaultStream     = "MANDATE_EVENTS"
	DefaultPrefix     = "mandate"
	DefaultDuplicates = 2 * time.Minute
	DefaultMaxAge     = 7 * 24 * time.Hour
)

// Config configures a Relay. Zero fields take the documented defaults.
type Config struct {
	// Store is the executor store whose outbox is relayed. Required.
	Store executor.Store
	// URL names the NATS servers (nats://host:port, comma-separated). Required.
	URL string
	// Stream is the JetStream stream the events go to; the relay creates it over Prefix.>
	// when it does not exist, and refuses one that does not take those subjects. Default
	// MANDATE_EVENTS.
	Stream string
	// Prefix is the first subject token. Default "mandate".
	Prefix string
	// Duplicates is the duplicate window of a stream the relay creates: a relay restarted
	// within it never makes consumers see an event twice. Default 2 minutes.
	Duplicates time.Duration
	// MaxAge is how long a stream the relay creates keeps messages. Default 7 days.
	MaxAge time.Duration
	// Poll is how often an idle relay looks for new events. Default 200ms.
	Poll time.Duration
	// Batch is how many events of one tenant a pass reads at most. Default 256.
	Batch int
	// MinBackoff and MaxBackoff bound the wait after a failed pass (doubling, with jitter).
	// Defaults 100ms and 5s.
	MinBackoff, MaxBackoff time.Duration
	// PublishTimeout bounds one publish and its ack. Default 5s.
	PublishTimeout time.Duration
	// Name is the NATS connection name. Default "mandate executor relay".
	Name string
	// Logger receives the relay's warnings. Default slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Duplicates <= 0 {
		c.Duplicates = DefaultDuplicates
	}
	if c.MaxAge <= 0 {
		c.MaxAge = DefaultMaxAge
	}
	if c.Poll <= 0 {
		c.Poll = 200 * time.Millisecond
	}
	if c.Batch <= 0 {
		c.Batch = 256
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(5*time.Second, c.MinBackoff)
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = 5 * time.Second
	}
	if c.Name == "" {
		c.Name = "mandate executor relay"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Relay delivers the outbox to JetStream. Run it once per executor replica; replicas on one
// database may run at once (see the package comment).
type Relay struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream

	ready bool // the stream was found or created on this connection

	published, duplicates, failures atomic.Int64
}

// Stats counts what a Relay did since it started.
type Stats struct {
	// Published is how many events the stream stored.
	Published int64
	// Duplicates is how many publishes the stream acknowledged as duplicates (already
	// published by this relay before a failure, or by another).
	Duplicates int64
	// Failures is how many passes failed (broker down, stream missing, store unavailable).
	Failures int64
}

// New checks cfg and connects to NATS without waiting for it: a broker that is down now is
// retried in the background, and Run catches up when it answers.
func New(cfg Config) (*Relay, error) {
	cfg = cfg.withDefaults()
	switch {
	case cfg.Store == nil:
		return nil, errors.New("outbox: Store is required")
	case cfg.URL == "":
		return nil, errors.New("outbox: URL is required")
	}
	if err := validStream(cfg.Stream); err != nil {
		return nil, err
	}
	if Token(cfg.Prefix) != cfg.Prefix {
		return nil, fmt.Errorf("outbox: prefix %q is not one subject token", cfg.Prefix)
	}
	nc, err := Connect(cfg.URL, cfg.Name)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return &Relay{cfg: cfg, nc: nc, js: js}, nil
}

// Connect opens a NATS connection that keeps reconnecting and fails publishes at once while
// disconnected (no reconnect buffer), so that a caller backs off instead of waiting.
func Connect(url, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.ReconnectJitter(100*time.Millisecond, 100*time.Millisecond),
		nats.ReconnectBufSize(-1), nats.Timeout(2*time.Second))
	if err != nil {
		return nil, fmt.Errorf("outbox: connecting to NATS: %w", err)
	}
	return nc, nil
}

func validStream(name string) error {
	if name == "" || Token(name) != name {
		return fmt.Errorf("outbox: stream name %q is not valid", name)
	}
	return nil
}

// Close closes the NATS connection; call it after Run returned.
func (r *Relay) Close() { r.nc.Close() }

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	return Stats{Published: r.published.Load(), Duplicates: r.duplicates.Load(), Failures: r.failures.Load()}
}

// Run relays until ctx ends, then returns nil. Failures (broker down, store unavailable) are
// logged and retried with backoff; they never stop the relay.
func (r *Relay) Run(ctx context.Context) error {
	failed := 0
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		n, err := r.pass(ctx)
		var wait time.Duration
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			r.failures.Add(1)
			failed++
			wait = r.backoff(failed)
			if failed == 1 || failed%20 == 0 {
				r.cfg.Logger.Warn("events relay: retrying", "error", err, "failures", failed, "retry_in", wait)
			}
		case n > 0:
			failed = 0 // more may be waiting: look again at once
		default:
			failed = 0
			wait = r.cfg.Poll
		}
		timer.Reset(wait)
	}
}

func (r *Relay) backoff(failed int) time.Duration {
	d := r.cfg.MinBackoff << min(failed-1, 16)
	if d <= 0 || d > r.cfg.MaxBackoff {
		d = r.cfg.MaxBackoff
	}
	// Full jitter in the upper half, so replicas do not retry in step.
	return d/2 + rand.N(d/2+1) //nolint:gosec // jitter needs no cryptographic randomness
}

// pass delivers up to one batch of every tenant with a backlog and returns how many events it
// delivered. One batch per tenant per pass keeps a busy tenant from starving the others.
func (r *Relay) pass(ctx context.Context) (int, error) {
	if err := r.ensureStream(ctx); err != nil {
		return 0, err
	}
	backlog, err := r.cfg.Store.Backlog(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading the backlog: %w", err)
	}
	total := 0
	for _, c := range backlog {
		n, err := r.deliver(ctx, c)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// deliver publishes a batch of c.Tenant's events after its cursor, one at a time and in seq
// order (each waits for the previous ack, so the stream holds them in commit order even when
// two relays race), then moves the cursor past what the stream acknowledged.
func (r *Relay) deliver(ctx context.Context, c executor.Cursor) (n int, err error) {
	ctx, span := tracer.Start(ctx, "relay")
	defer span.End()
	span.SetAttributes(attribute.String("mandate.tenant", c.Tenant), attribute.Int64("mandate.cursor", c.Delivered))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "relay failed")
		}
	}()
	evs, err := r.cfg.Store.Events(ctx, c.Tenant, c.Delivered, r.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("reading %s's events: %w", c.Tenant, err)
	}
	last := c.Delivered
	if len(evs) == 0 {
		// Every event up to the head was purged undelivered: nothing to wait for.
		last = c.Head
	}
	for _, e := range evs {
		if err = r.publish(ctx, e); err != nil {
			err = fmt.Errorf("publishing %s's event %d: %w", c.Tenant, e.Seq, err)
			break
		}
		last = e.Seq
		n++
	}
	if last > c.Delivered {
		// Record what was acknowledged even when the pass is ending: the stream has it.
		if merr := r.cfg.Store.MarkDelivered(context.WithoutCancel(ctx), c.Tenant, last); merr != nil {
			return n, errors.Join(err, fmt.Errorf("recording %s's cursor: %w", c.Tenant, merr))
		}
	}
	return n, err
}

func (r *Relay) publish(ctx context.Context, e executor.Event) error {
	body, err := json.Marshal(Envelope(e))
	if err != nil {
		return err
	}
	msg := nats.NewMsg(Subject(r.cfg.Prefix, e.Tenant, e.Command))
	msg.Header.Set("Content-Type", ContentType)
	msg.Data = body
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
	ack, err := r.js.PublishMsg(ctx, msg, jetstream.WithMsgID(e.InvocationID), jetstream.WithExpectStream(r.cfg.Stream))
	if err != nil {
		r.ready = false // the stream may be gone: look again before the next pass
		return err
	}
	if ack.Duplicate {
		r.duplicates.Add(1)
	} else {
		r.published.Add(1)
	}
	return nil
}

// ensureStream finds the stream, or creates it over Prefix.>, once per connection.
func (r *Relay) ensureStream(ctx context.Context) error {
	if r.ready {
		return nil
	}
	if !r.nc.IsConnected() {
		return errors.New("NATS is not connected")
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
	want := r.cfg.Prefix + ".>"
	s, err := r.js.Stream(ctx, r.cfg.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		_, err = r.js.CreateStream(ctx, jetstream.StreamConfig{
			Name: r.cfg.Stream, Description: "Mandate domain events (CloudEvents)", Subjects: []string{want},
			Storage: jetstream.FileStorage, Duplicates: r.cfg.Duplicates, MaxAge: r.cfg.MaxAge,
		})
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("creating stream %s: %w", r.cfg.Stream, err)
		}
	case err != nil:
		return fmt.Errorf("looking up stream %s: %w", r.cfg.Stream, err)
	case !slices.Contains(s.CachedInfo().Config.Subjects, want):
		return fmt.Errorf("stream %s does not take %s (its subjects: %v)", r.cfg.Stream, want, s.CachedInfo().Config.Subjects)
	}
	r.ready = true
	return nil
}
