package clicore

import (
	"context"

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

// OpenPool opens a Postgres pool on url.
func OpenPool(ctx context.Context, url config.Secret) (*pgxpool.Pool, error) {
	return pg.Open(ctx, url.Reveal(), pg.Options{})
}
