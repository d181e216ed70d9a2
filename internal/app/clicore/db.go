package clicore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/storage/pg"
)

// DatabaseFlag declares --database-url and requires it, for the operator
// tools that work on the database directly.
func DatabaseFlag(s *config.Set, url *config.Secret) {
	s.SecretVar(url, "database-url", "Postgres connection string, e.g. postgres://user@host:5432/mandate")
	s.Require("database-url", func() bool { return !url.Set() })
}

// DatabaseWait is how long a command keeps trying a database that does
// not answer yet when it starts (a Postgres still initialising, a
// container started at the same time), before it gives up with the reason.
const DatabaseWait = 60 * time.Second

// ToolReplyTimeout is how long an operator tool waits for one reply from
// Postgres: longer than a service (whose callers must hear within
// seconds), for a tool's statements scan whole tables, and still bounded,
// so that a hung database ends the command with the reason.
const ToolReplyTimeout = 2 * time.Minute

// OpenPool opens a Postgres pool on url for an operator tool, waiting up
// to DatabaseWait for a server that does not answer yet.
func OpenPool(ctx context.Context, url config.Secret) (*pgxpool.Pool, error) {
	return pg.Open(ctx, url.Reveal(), pg.Options{WaitFor: DatabaseWait, ReplyTimeout: ToolReplyTimeout})
}
