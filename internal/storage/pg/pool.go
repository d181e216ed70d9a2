package pg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Options tunes [Open]. Zero fields take the defaults documented on each field.
type Options struct {
	// MaxConns caps the pool size. Default 10.
	MaxConns int32
	// MinConns is the number of idle connections kept open. Default 0.
	MinConns int32
	// MaxConnLifetime recycles connections after this age so that load balancers and failovers
	// rebalance. Default 1h.
	MaxConnLifetime time.Duration
	// MaxConnIdleTime closes connections idle for longer. Default 5m.
	MaxConnIdleTime time.Duration
	// HealthCheckPeriod is how often idle connections are checked. Default 30s.
	HealthCheckPeriod time.Duration
	// ConnectTimeout bounds establishing one connection (dial, TLS, auth). Default 5s; a
	// connect_timeout in the DSN wins.
	ConnectTimeout time.Duration
	// PingTimeout bounds each ping that Open performs. Default 5s.
	PingTimeout time.Duration
	// WaitFor is how long Open keeps trying a server that does not answer
	// yet (one starting up, or not listening yet), with a growing pause
	// between pings; 0 pings once. A server that refuses for good (bad
	// password, unknown database) ends the wait at once.
	WaitFor time.Duration
	// ReplyTimeout bounds how long a connection waits for the server's
	// reply without receiving a byte before it gives up with an
	// unavailable error (a hung database answers nothing: see replyConn).
	// Default 5s; negative means no bound.
	ReplyTimeout time.Duration
	// ApplicationName is reported in pg_stat_activity. Default "mandate"; an application_name in
	// the DSN wins.
	ApplicationName string
}

func (o Options) withDefaults() Options {
	if o.MaxConns <= 0 {
		o.MaxConns = 10
	}
	if o.MinConns < 0 {
		o.MinConns = 0
	}
	if o.MinConns > o.MaxConns {
		o.MinConns = o.MaxConns
	}
	if o.MaxConnLifetime <= 0 {
		o.MaxConnLifetime = time.Hour
	}
	if o.MaxConnIdleTime <= 0 {
		o.MaxConnIdleTime = 5 * time.Minute
	}
	if o.HealthCheckPeriod <= 0 {
		o.HealthCheckPeriod = 30 * time.Second
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 5 * time.Second
	}
	if o.PingTimeout <= 0 {
		o.PingTimeout = 5 * time.Second
	}
	if o.ReplyTimeout == 0 {
		o.ReplyTimeout = DefaultReplyTimeout
	}
	if o.ApplicationName == "" {
		o.ApplicationName = "mandate"
	}
	return o
}

// DefaultReplyTimeout is [Options.ReplyTimeout]'s default.
const DefaultReplyTimeout = 5 * time.Second

// ErrInvalidDSN is returned (wrapped) by [Open] when the connection string cannot be parsed. The
// message never repeats the connection string, which may hold a password.
var ErrInvalidDSN = errors.New("invalid database connection string")

type opaqueError struct {
	msg  string
	errs []error
}

func (e *opaqueError) Error() string   { return e.msg }
func (e *opaqueError) Unwrap() []error { return e.errs }

// Open parses dsn, builds a pool with opts applied and pings the server once. A ping failure
// closes the pool and returns an error that matches [ErrUnavailable].
func Open(ctx context.Context, dsn string, opts Options) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// The parser's message may quote the connection string; keep it out of the message
		// but reachable through errors.As for whoever must debug it.
		return nil, &opaqueError{msg: "pg: open: " + ErrInvalidDSN.Error(), errs: []error{ErrInvalidDSN, err}}
	}
	opts = opts.withDefaults()
	cfg.MaxConns = opts.MaxConns
	cfg.MinConns = opts.MinConns
	cfg.MaxConnLifetime = opts.MaxConnLifetime
	cfg.MaxConnLifetimeJitter = opts.MaxConnLifetime / 10
	cfg.MaxConnIdleTime = opts.MaxConnIdleTime
	cfg.HealthCheckPeriod = opts.HealthCheckPeriod
	if cfg.ConnConfig.ConnectTimeout <= 0 {
		cfg.ConnConfig.ConnectTimeout = opts.ConnectTimeout
	}
	if opts.ReplyTimeout > 0 {
		cfg.ConnConfig.DialFunc = boundReplies(cfg.ConnConfig.DialFunc, opts.ReplyTimeout)
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = opts.ApplicationName
	}

	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, Wrap("pg: open", err)
	}
	deadline := time.Now().Add(opts.WaitFor)
	pause := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		pingCtx, cancel := context.WithTimeout(ctx, opts.PingTimeout)
		err := pool.Ping(pingCtx)
		cancel()
		if err == nil {
			return pool, nil
		}
		kind := Classify(err)
		if kind == KindCanceled && ctx.Err() == nil {
			kind = KindUnavailable // our own ping timeout expired: the server did not answer
		}
		if kind != KindUnavailable || !time.Now().Add(pause).Before(deadline) {
			pool.Close()
			op := "pg: ping"
			if opts.WaitFor > 0 {
				op = fmt.Sprintf("pg: ping (%d attempts in %s)", attempt, opts.WaitFor)
			}
			return nil, &Error{Op: op, Kind: kind, Err: err, Reason: reason(err)}
		}
		select {
		case <-ctx.Done():
			pool.Close()
			return nil, &Error{Op: "pg: ping", Kind: KindCanceled, Err: ctx.Err()}
		case <-time.After(pause):
		}
		pause = min(2*pause, 2*time.Second)
	}
}

// reason says in a few words why a connection failed, from the error's
// kind and never from its text, which may name hosts and users: the
// server's SQLSTATE and its own message (which names neither), or what
// the network said.
func reason(err error) string {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return "SQLSTATE " + pgErr.Code + ": " + pgErr.Message
	}
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.As(err, &dnsErr):
		return "host not found"
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return "no answer within the ping timeout"
	}
	return ""
}
