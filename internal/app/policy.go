package app

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	dirpg "github.com/mandate-dev/mandate/internal/directory/postgres"
	auditapi "github.com/mandate-dev/mandate/services/audit/api"
	"github.com/mandate-dev/mandate/services/catalog"
	"github.com/mandate-dev/mandate/services/executor"
)

// platformPermissions are the permissions Mandate's own services check,
// whatever the manifest: a policy may grant them though no command does.
var platformPermissions = []string{auditapi.ReadPermission, executor.ResolvePermission, catalog.OpsReadPermission}

// openDirectory opens the directory a policy is applied to; close releases
// it.
type openDirectory func(ctx context.Context, url config.Secret) (s directory.Store, close func(), err error)

// openPostgresDirectory opens the Postgres directory of --database-url.
func openPostgresDirectory(ctx context.Context, url config.Secret) (directory.Store, func(), error) {
	pool, err := clicore.OpenPool(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	store := dirpg.New(pool, dirpg.Options{})
	return store, func() { store.Close(); pool.Close() }, nil
}

// runPolicy implements `mandate policy apply -f FILE` and `mandate policy
// simulate`.
func runPolicy(ctx context.Context, args []string, io IO) error {
	if len(args) > 0 && args[0] == "simulate" {
		return runPolicySimulate(ctx, args[1:], io)
	}
	return policyApply(ctx, args, io, openPostgresDirectory)
}

// errPolicyRefused is the refusal of a policy file that does not fit the
// manifest; its findings are printed before it.
var errPolicyRefused = errors.New("policy refused, nothing was changed")

// policyApply checks a policy file against the deployment's manifest and
// applies it to the directory open opens, or with --dry-run says what it
// would change. The file is parsed and checked before the directory is
// opened: a refused file never reaches it.
func policyApply(ctx context.Context, args []string, io IO, open openDirectory) error {
	if len(args) == 0 || args[0] != "apply" {
		fmt.Fprintln(io.Stderr, joinLines(
			"Usage: mandate policy apply -f FILE [--dry-run] [--strict] [--manifest FILE --descriptors FILE] [--database-url URL]",
			"       mandate policy simulate --policy FILE [--since 7d] [--tenant T] [--manifest FILE --descriptors FILE] [--database-url URL]",
			"",
			"Applies a policy YAML file (tenants, features, limit overrides, roles, users,",
			"agents) to the directory in one transaction. Applying the same file twice",
			"changes nothing; a malformed file changes nothing and the error names the line.",
			"",
			"The file is first checked against the deployment's manifest (--manifest, or the",
			"embedded helpdesk sample). It is refused, and nothing is changed, when a command",
			"that a user may request has a four-eyes approver permission no other enabled",
			"user holds, or when a tenant's limit override \"<command code>/<limit id>\"",
			"names no limit a command of the manifest declares. A role permission or a tenant feature that no command, approver",
			"policy or Mandate service uses is a warning (the nearest known name is",
			"suggested); --strict refuses those too. --dry-run prints every tenant, role,",
			"user and agent the file would add, change or remove, and changes nothing.",
			"",
			"simulate replays the trail's attempts since --since through a candidate policy",
			"(and --manifest) in check mode and prints which calls would newly be refused,",
			"newly need approval, or newly pass. Nothing is run; docs/policy-simulate.md.",
		))
		return clicore.ErrUsage
	}
	var (
		url            config.Secret
		file           string
		dryRun, strict bool
		mf             clicore.ManifestFlags
	)
	s := config.New("policy apply", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	clicore.DatabaseFlag(s, &url)
	s.String(&file, "f", "", "policy YAML file; checked against the manifest first, and refused (nothing changed) if a command some user may request has an approver permission no other enabled user holds")
	s.Require("f", func() bool { return file == "" })
	s.Bool(&dryRun, "dry-run", false, "print every tenant, role, user and agent the file would add, change or remove, and change nothing")
	s.Bool(&strict, "strict", false, "refuse the file on warnings too: role permissions that no command, approver policy or Mandate service uses, tenant features no command requires")
	mf.DeclareOptional(s)
	if err := s.Parse(args[1:]); err != nil {
		return err
	}
	src, err := os.ReadFile(file) //nolint:gosec // the operator names the file
	if err != nil {
		return err
	}
	pol, err := directory.ParsePolicy(file, src)
	if err != nil {
		return fmt.Errorf("%w (nothing was changed)", err)
	}
	m, err := mf.Load()
	if err != nil {
		return err
	}
	against := "the embedded helpdesk sample manifest"
	if mf.Given() {
		against = mf.Path()
	}
	refused := 0
	for _, f := range directory.CheckPolicy(pol, m.Commands(), platformPermissions) {
		if !f.Warning || strict {
			refused++
		}
		fmt.Fprintf(io.Stderr, "%s: %s\n", file, f)
	}
	if refused > 0 {
		return fmt.Errorf("%s: %d finding(s) against %s: %w", file, refused, against, errPolicyRefused)
	}

	store, closeStore, err := open(ctx, url)
	if err != nil {
		return err
	}
	defer closeStore()
	if dryRun {
		plan, err := directory.PlanPolicy(ctx, store, pol)
		if err != nil {
			return err
		}
		for _, c := range plan.Changes {
			fmt.Fprintf(io.Stdout, "would %s\n", c)
		}
		_, err = fmt.Fprintf(io.Stdout, "dry run of %s (checked against %s): %s; nothing was changed\n", file, against, plan.Summary())
		return err
	}
	sum, err := directory.ApplyPolicy(ctx, store, pol)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(io.Stdout, "applied %s (checked against %s): %s\n", file, against, sum)
	return err
}
