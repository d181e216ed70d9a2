package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/executor/simulate"
)

// maxSimulatedRows bounds what one simulation reads of a tenant's trail.
const maxSimulatedRows = 200_000

// runPolicySimulate implements `mandate policy simulate`: the trail's
// attempts since a time, replayed through a candidate policy and manifest
// (services/executor/simulate). It reads the trail and changes nothing.
func runPolicySimulate(ctx context.Context, args []string, io IO) error {
	var (
		src                 trailSource
		file, since, format string
		tenant              string
		confirmSideEffects  bool
		mf                  clicore.ManifestFlags
		from                time.Time
	)
	s := config.New("policy simulate", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	src.declare(s)
	s.String(&file, "policy", "", "candidate policy YAML file the trail's attempts are replayed through")
	s.Require("policy", func() bool { return file == "" })
	s.String(&since, "since", "7d", "replay the attempts of this long ago until now: a Go duration or a number of days (7d)")
	s.String(&tenant, "tenant", "", "replay only this tenant's trail (default: every tenant the candidate policy names; with --audit-addr, the token's)")
	s.String(&format, "format", "table", "table or json")
	s.Bool(&confirmSideEffects, "confirm-side-effects", false, "replay as a deployment whose executor runs with --confirm-side-effects")
	mf.DeclareOptional(s)
	s.Check(func() error {
		var errs []error
		d, err := parseSince(since)
		if err != nil {
			errs = append(errs, s.Errorf("since", "%v", err))
		}
		from = time.Now().Add(-d)
		if format != "table" && format != "json" {
			errs = append(errs, s.Errorf("format", "must be table or json"))
		}
		return errors.Join(errs...)
	})
	if err := s.Parse(args); err != nil {
		return err
	}
	raw, err := os.ReadFile(file) //nolint:gosec // the operator names the file
	if err != nil {
		return err
	}
	pol, err := directory.ParsePolicy(file, raw)
	if err != nil {
		return err
	}
	m, err := mf.Load()
	if err != nil {
		return err
	}
	tenants := []string{tenant}
	if tenant == "" && !src.viaAPI() {
		tenants = tenants[:0]
		for _, t := range pol.Tenants {
			tenants = append(tenants, t.Tenant.ID)
		}
	}
	var cl clicore.Closers
	defer cl.Close()
	st, err := src.open(ctx, &cl)
	if err != nil {
		return err
	}
	var rows []simulate.Row
	for _, t := range tenants {
		read, err := trailSince(ctx, st, t, from)
		if err != nil {
			return err
		}
		rows = append(rows, read...)
	}
	rep, err := simulate.Run(ctx, rows, simulate.Candidate{Manifest: m, Policy: pol, ConfirmSideEffects: confirmSideEffects})
	if err != nil {
		return err
	}
	against := "the embedded helpdesk sample manifest"
	if mf.Given() {
		against = mf.Path()
	}
	if format == "json" {
		enc := json.NewEncoder(io.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Since     time.Time             `json:"since"`
			Tenants   []string              `json:"tenants"`
			Attempts  int                   `json:"attempts"`
			Replayed  int                   `json:"replayed"`
			Unchanged int                   `json:"unchanged"`
			Changed   []simulate.Attempt    `json:"changed"`
			Skipped   map[simulate.Skip]int `json:"skipped"`
		}{from.UTC(), tenants, rep.Attempts, rep.Replayed, rep.Unchanged, orEmpty(rep.Changed), rep.Skipped})
	}
	fmt.Fprintf(io.Stdout, "replayed %d of %d attempts since %s through %s and %s; nothing was run\n",
		rep.Replayed, rep.Attempts, from.UTC().Format(time.RFC3339), file, against)
	for _, c := range []simulate.Change{simulate.NewlyRefused, simulate.NewlyNeedsApproval, simulate.NewlyPasses} {
		fmt.Fprintf(io.Stdout, "\n%s: %d\n", strings.ReplaceAll(string(c), "_", " "), rep.Count(c))
		tw := tabwriter.NewWriter(io.Stdout, 0, 4, 2, ' ', 0)
		for _, a := range rep.Changed {
			if a.Change != c {
				continue
			}
			note := ""
			if a.Approximate {
				note = "  (approximate: arguments withheld)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\tfor %s\twas %s\tnow %s%s\n", a.Time.UTC().Format(time.RFC3339), a.InvocationID,
				a.Command, a.Actor, a.UserID, a.Was, a.Now, note)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(io.Stdout, "\nunchanged: %d\n", rep.Unchanged)
	if n := rep.Attempts - rep.Replayed; n > 0 {
		fmt.Fprintf(io.Stdout, "not replayed: %d (%d unauthenticated, %d refused at a stage no policy decides, %d decided by withheld arguments)\n", n,
			rep.Skipped[simulate.SkipUnauthenticated], rep.Skipped[simulate.SkipNotPolicy], rep.Skipped[simulate.SkipWithheld])
	}
	return nil
}

func orEmpty(a []simulate.Attempt) []simulate.Attempt {
	if a == nil {
		return []simulate.Attempt{}
	}
	return a
}

// parseSince reads --since: a Go duration, or whole days as "7d".
func parseSince(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 {
			return 0, errors.New("must be a positive number of days (7d) or a Go duration (36h)")
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, errors.New("must be a positive number of days (7d) or a Go duration (36h)")
	}
	return d, nil
}

// trailSince reads a tenant's intent and outcome rows since from, oldest
// last (the store's order), at most maxSimulatedRows.
func trailSince(ctx context.Context, st trailReader, tenant string, from time.Time) ([]simulate.Row, error) {
	var rows []simulate.Row
	token := ""
	for {
		page, err := st.Query(ctx, audit.Filter{Tenant: tenant, From: from, PageSize: audit.MaxPageSize, PageToken: token})
		if err != nil {
			return nil, err
		}
		for _, r := range page.Records {
			if r.Phase != audit.PhaseIntent && r.Phase != audit.PhaseOutcome {
				continue
			}
			rows = append(rows, simulate.Row{
				InvocationID: r.InvocationID, Phase: string(r.Phase), Time: r.Time, Tenant: r.Tenant, Channel: string(r.Channel),
				Command: r.Command, UserID: r.UserID, ActorKind: string(r.ActorKind), AgentID: r.AgentID, Model: r.Model,
				Approved: r.Approved(), Outcome: string(r.Outcome), Stage: r.Stage, Code: r.Code, Arguments: r.Arguments,
			})
			if len(rows) > maxSimulatedRows {
				return nil, fmt.Errorf("tenant %s holds more than %d attempt rows since %s: simulate a shorter --since", tenant, maxSimulatedRows, from.UTC().Format(time.RFC3339))
			}
		}
		if page.NextPageToken == "" {
			return rows, nil
		}
		token = page.NextPageToken
	}
}
