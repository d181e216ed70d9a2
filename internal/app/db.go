package app

import (
	"context"
	"fmt"

	helppg "github.com/mandate-dev/mandate/examples/helpdesk/postgres"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	dirpg "github.com/mandate-dev/mandate/internal/directory/postgres"
	"github.com/mandate-dev/mandate/internal/storage/migrate"
	"github.com/mandate-dev/mandate/internal/storage/migrate/migrator"
	auditpg "github.com/mandate-dev/mandate/services/audit/postgres"
	confirmpg "github.com/mandate-dev/mandate/services/confirm/postgres"
	execpg "github.com/mandate-dev/mandate/services/executor/postgres"
)

// migrationSets lists every service's migrations, in the order
// `mandate migrate` applies them, and the helpdesk sample's schema when
// sample is asked for (--sample).
func migrationSets(sample bool) []migrate.Set {
	sets := []migrate.Set{dirpg.Migrations, auditpg.Migrations, confirmpg.Migrations, execpg.Migrations}
	if sample {
		sets = append(sets, helppg.Migrations)
	}
	return sets
}

// runMigrate applies every service's migrations.
func runMigrate(ctx context.Context, args []string, io IO) error {
	var (
		url    config.Secret
		sample bool
	)
	s := config.New("migrate", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	clicore.DatabaseFlag(s, &url)
	s.Bool(&sample, "sample", false, "also create the schema of the helpdesk sample backend, which mandate helpdesk --store=postgres needs")
	if err := s.Parse(args); err != nil {
		return err
	}
	pool, err := clicore.OpenPool(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	sets := migrationSets(sample)
	if err := migrator.Run(ctx, pool, sets...); err != nil {
		return err
	}
	services := make([]string, len(sets))
	for i, set := range sets {
		services[i] = set.Service
	}
	records, err := migrator.Status(ctx, pool, services...)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(io.Stdout, "migrations up to date: %d applied across %v\n", len(records), services)
	return err
}
