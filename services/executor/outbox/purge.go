package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/mandate-dev/mandate/services/executor"
)

// Purger bounds the executor's tables on a ticker: expired idempotency keys, lapsed limit
// spends, expired parked calls and delivered events older than KeepEvents (with Undelivered, undelivered ones too: for an executor without
// a relay, whose outbox nobody drains).
type Purger struct {
	Store executor.Store
	// Every is the interval between purges. Default 10 minutes.
	Every time.Duration
	// KeepEvents is how long events stay queryable after their commit. Default 24 hours.
	KeepEvents time.Duration
	// Undelivered purges old events whether or not a relay delivered them.
	Undelivered bool
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives what each purge deleted, and its failures. Default slog.Default().
	Logger *slog.Logger
}

// Run purges at once and then every Every until ctx ends, then returns nil. A failed purge is
// logged and tried again at the next tick.
func (p Purger) Run(ctx context.Context) error {
	if p.Every <= 0 {
		p.Every = 10 * time.Minute
	}
	if p.KeepEvents <= 0 {
		p.KeepEvents = 24 * time.Hour
	}
	if p.Now == nil {
		p.Now = time.Now
	}
	if p.Logger == nil {
		p.Logger = slog.Default()
	}
	t := time.NewTicker(p.Every)
	defer t.Stop()
	for {
		n, err := p.Store.Purge(ctx, executor.PurgePolicy{Now: p.Now(), KeepEvents: p.KeepEvents, Undelivered: p.Undelivered})
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			p.Logger.Warn("purging the executor's tables", "error", err)
		case n.Events > 0 || n.IdempotencyKeys > 0 || n.Spends > 0 || n.Parked > 0:
			p.Logger.Info("purged the executor's tables", "events", n.Events, "idempotency_keys", n.IdempotencyKeys, "limit_spends", n.Spends,
				"parked_calls", n.Parked)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
