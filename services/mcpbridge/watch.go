package mcpbridge

import (
	"context"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// DefaultIdleTimeout is Config.IdleTimeout's default.
const DefaultIdleTimeout = 5 * time.Minute

// Reconnect delays of a failed catalog watch: doubled after each failure
// that delivered nothing, reset by a stream that delivered a set.
const (
	watchMinBackoff = 100 * time.Millisecond
	watchMaxBackoff = 30 * time.Second
)

// The per-principal server cache.
//
// Each principal (issuer, tenant, user, agent) that makes a request gets an
// entry: its *mcp.Server and a goroutine watching the principal's tool set
// in the catalog, so that open sessions hear tools/list_changed when a role
// is removed or the user is disabled, with no request of theirs in flight.
// The watch relays the newest token seen for the principal; when the
// catalog refuses it (it expired), the watch waits for a request to bring a
// fresh one. An entry is dropped, its watch stopped, once none of its
// sessions is open and IdleTimeout has passed since its last request or
// open session, so the cache holds the principals active in the last
// IdleTimeout plus those with open sessions. An entry is never dropped
// while a session is open on its server: the SDK pins a session to the
// server it started on, and a dropped server would stop following the
// catalog. Abandoned sessions are ended by Config.SessionTimeout, if set,
// or by the client's DELETE.

// entry returns p's entry (key is principalKey(p)), creating it and starting its watch on first
// use, after recording the request's token as the newest credentials.
// It returns nil once the Bridge is closed.
func (b *Bridge) entry(key string, p identity.Principal, token string) *entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	e := b.servers[key]
	if e == nil {
		ctx, cancel := context.WithCancel(b.ctx)
		e = &entry{srv: b.newServer(), ctx: ctx, cancel: cancel, tools: map[string]bool{}, fresh: make(chan struct{}, 1)}
		b.servers[key] = e
		e.credentials(p, token)
		b.wg.Add(1)
		go b.watch(e)
		if !b.sweeping {
			b.sweeping = true
			b.wg.Add(1)
			go b.sweep()
		}
	} else {
		e.credentials(p, token)
	}
	e.lastUsed = time.Now()
	return e
}

// credentials keeps the token that expires last, so that a replayed older
// token never replaces a newer one.
func (e *entry) credentials(p identity.Principal, token string) {
	if token == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.token == token || (e.token != "" && p.ExpiresAt.Before(e.p.ExpiresAt)) {
		return
	}
	e.p, e.token = p, token
	select {
	case e.fresh <- struct{}{}:
	default:
	}
}

// watchState reports whether a watch stream is live, and how many sets it
// delivered.
func (e *entry) watchState() (live bool, gen uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.live, e.gen
}

// syncRead applies a set a request read, unless the watch delivered a set
// since the read began: that one is newer.
func (e *entry) syncRead(b *Bridge, ts toolSet, gen uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gen != gen {
		return
	}
	e.sync(b, ts)
}

// delivered applies a set the watch delivered.
func (e *entry) delivered(b *Bridge, ts toolSet) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.live = true
	e.gen++
	e.sync(b, ts)
}

func (e *entry) setLive(live bool) {
	e.mu.Lock()
	e.live = live
	e.mu.Unlock()
}

// relay returns the credentials to relay; fresh signals only changes made
// after it.
func (e *entry) relay() (identity.Principal, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	select {
	case <-e.fresh:
	default:
	}
	return e.p, e.token
}

// watch follows e's principal in the catalog until the entry is dropped
// or the Bridge closed, reconnecting with backoff.
func (b *Bridge) watch(e *entry) {
	defer b.wg.Done()
	backoff := watchMinBackoff
	for {
		p, ctx := b.relayCtx(e)
		delivered := false
		err := b.watchTools(ctx, func(ts toolSet) {
			delivered = true
			e.delivered(b, ts)
		})
		e.setLive(false)
		if e.ctx.Err() != nil {
			return
		}
		if delivered {
			backoff = watchMinBackoff
		}
		var fresh <-chan struct{}
		if failure.ToStatus(err).Code() == codes.Unauthenticated {
			// The relayed token no longer passes: only a newer one helps.
			// Until it comes, requests read the set themselves.
			b.log.InfoContext(e.ctx, "mcpbridge: catalog watch waits for a fresh token", "tenant", p.Tenant, "user", p.UserID, "agent", p.AgentID)
			fresh = e.fresh
		} else {
			b.log.WarnContext(e.ctx, "mcpbridge: catalog watch ended; reconnecting", "tenant", p.Tenant, "user", p.UserID, "agent", p.AgentID, "error", err, "retry_in", backoff)
		}
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1)) //nolint:gosec // reconnect jitter, not a secret
		if fresh != nil {
			t.Stop()
		}
		select {
		case <-e.ctx.Done():
			t.Stop()
			return
		case <-fresh:
		case <-t.C:
		}
		t.Stop()
		backoff = min(2*backoff, watchMaxBackoff)
	}
}

// relayCtx returns the principal and a context carrying it and its newest
// raw token, as the catalog (in process or over gRPC) expects its callers.
func (b *Bridge) relayCtx(e *entry) (identity.Principal, context.Context) {
	p, token := e.relay()
	ctx := identity.WithPrincipal(e.ctx, p)
	if token != "" {
		ctx = identity.WithRawToken(ctx, token)
	}
	return p, ctx
}

// sweep drops idle entries until the Bridge closes.
func (b *Bridge) sweep() {
	defer b.wg.Done()
	tick := time.NewTicker(max(b.cfg.IdleTimeout/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case now := <-tick.C:
			b.dropIdle(now)
		}
	}
}

func (b *Bridge) dropIdle(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for key, e := range b.servers {
		open := false
		for range e.srv.Sessions() {
			open = true
			break
		}
		switch {
		case open:
			e.lastUsed = now
		case now.Sub(e.lastUsed) >= b.cfg.IdleTimeout:
			delete(b.servers, key)
			e.cancel()
		}
	}
}

// Close ends every open session and stops the catalog watches; requests
// after it are refused. It returns when every goroutine of the Bridge has
// stopped, also when called again or concurrently. Call it when the HTTP
// server begins to stop (e.g. context.AfterFunc on the serving context),
// so that standalone SSE streams do not hold up its shutdown.
func (b *Bridge) Close() {
	defer b.wg.Wait()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	entries := make([]*entry, 0, len(b.servers))
	for _, e := range b.servers {
		entries = append(entries, e)
	}
	clear(b.servers)
	b.mu.Unlock()
	b.cancel()
	b.tasks.closeAll()
	for _, e := range entries {
		for ss := range e.srv.Sessions() {
			_ = ss.Close()
		}
	}
}
