package pg

import (
	"context"
	"net"
	"sync"
	"time"
)

// A hung database — a host frozen, a server stopped with SIGSTOP, a
// network path that drops packets without a reset — keeps its TCP
// connections open and answers nothing. Without a bound, every statement
// then waits for as long as the caller's context allows (often none, or
// the client's own timeout), and every caller hangs with it.
//
// replyConn bounds the silence instead: while a connection waits for the
// server's reply, the read gives up once the server has sent nothing for
// the reply timeout. The read fails with a network timeout, which
// [Classify] calls unavailable, and pgx closes the connection, so the
// pool dials a fresh one for the next statement.
//
// The bound is on each wait for the server, not on the whole statement:
// a reply that keeps arriving keeps its statement alive. But Postgres
// buffers small rows until its send buffer fills or the statement ends,
// so in practice a statement that computes for longer than the timeout
// before it answers is cut as a hung server's would be; the timeout sits
// well above any statement a service runs. A connection idle in the pool
// reads nothing, and a listener's connection is exempt
// ([WaitingForNotifications]).
type replyConn struct {
	net.Conn
	timeout time.Duration

	mu sync.Mutex
	// set is the read deadline pgx itself asked for (a context that ends,
	// the close path's grace); zero means none. A read uses the earlier of
	// it and the reply timeout, so a cancellation still ends a read at once.
	set time.Time
}

func (c *replyConn) Read(p []byte) (int, error) {
	d := time.Now().Add(c.timeout)
	c.mu.Lock()
	if !c.set.IsZero() && c.set.Before(d) {
		d = c.set
	}
	_ = c.Conn.SetReadDeadline(d)
	c.mu.Unlock()
	return c.Conn.Read(p)
}

func (c *replyConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set = t
	return c.Conn.SetDeadline(t)
}

func (c *replyConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set = t
	return c.Conn.SetReadDeadline(t)
}

type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// boundReplies wraps dial so that its connections bound the server's
// silence to timeout; a connection dialled under [WaitingForNotifications]
// is left as it is.
func boundReplies(dial dialFunc, timeout time.Duration) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil || ctx.Value(waitingKey{}) != nil {
			return c, err
		}
		return &replyConn{Conn: c, timeout: timeout}, nil
	}
}

type waitingKey struct{}

// WaitingForNotifications marks ctx as the context of a connection that
// waits for the server to speak first (LISTEN), for which a silent server
// is the normal case: a connection dialled with it, from a pool's
// configuration, has no reply timeout.
func WaitingForNotifications(ctx context.Context) context.Context {
	return context.WithValue(ctx, waitingKey{}, true)
}
