package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandate-dev/mandate/internal/storage/pg"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/audittest"
	"github.com/mandate-dev/mandate/services/audit/postgres"
)

// auditClients is the concurrency of the audit comparison.
const auditClients = 16

// pgbenchScript is one single-row INSERT per transaction (autocommit), a
// row about the size of an audit intent.
const pgbenchScript = "INSERT INTO bench_pgbench (v) VALUES (repeat('x', 600));\n"

// auditResult is acknowledged appends per second against pgbench's
// single-row commits per second, same database, same clients.
type auditResult struct {
	groupCommit, perAppend, pgbench float64
	recordsPerTx                    float64
}

// compareAudit runs the audit Writer over the Postgres store (intent rows as
// the executor writes them, 4 tenants) with group commit and with one
// transaction per append, then pgbench, each for window at auditClients;
// rounds times, one result per round.
func compareAudit(ctx context.Context, dbURL, dir string, window time.Duration, rounds int) ([]auditResult, error) {
	pgbench, err := exec.LookPath("pgbench")
	if err != nil {
		return nil, errors.New("pgbench is not installed")
	}
	pool, err := pg.Open(ctx, dbURL, pg.Options{MaxConns: 32})
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE TABLE bench_pgbench (id bigserial PRIMARY KEY, v text NOT NULL)"); err != nil {
		return nil, err
	}
	quiet := slog.New(slog.DiscardHandler)
	st := postgres.New(pool, postgres.Options{Logger: quiet})
	defer st.Close()
	var seq atomic.Int64
	var results []auditResult
	for range rounds {
		var r auditResult
		for _, mode := range []struct {
			opts audit.WriterOptions
			dst  *float64
		}{{audit.WriterOptions{Logger: quiet}, &r.groupCommit}, {audit.WriterOptions{Logger: quiet, Unbatched: true}, &r.perAppend}} {
			settle(ctx, pool)
			w := audit.NewWriter(st, mode.opts)
			rate, err := appendFor(ctx, w, &seq, window)
			stats := w.Stats()
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return nil, err
			}
			*mode.dst = rate
			if !mode.opts.Unbatched && stats.Batches > 0 {
				r.recordsPerTx = float64(stats.Records) / float64(stats.Batches)
			}
		}
		settle(ctx, pool)
		if r.pgbench, err = runPgbench(ctx, pgbench, dbURL, dir, window); err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	return results, nil
}

// settle starts a contender with the same database state as the others:
// a CHECKPOINT writes out what the previous one (or the topology's load)
// left dirty, so that no contender pays for another's writes when a
// checkpoint falls in its window. Without the privilege (superuser or
// pg_checkpoint) the contenders start as they find the database.
func settle(ctx context.Context, pool *pgxpool.Pool) {
	_, _ = pool.Exec(ctx, "CHECKPOINT")
}

// appendFor appends from auditClients goroutines until window has passed
// and returns acknowledged appends (Append returned, i.e. committed) per
// second.
func appendFor(ctx context.Context, w *audit.Writer, seq *atomic.Int64, window time.Duration) (float64, error) {
	var (
		acked  atomic.Int64
		failed atomic.Pointer[error]
		wg     sync.WaitGroup
	)
	began := time.Now()
	deadline := began.Add(window)
	for range auditClients {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				n := seq.Add(1)
				rec := audittest.Rec("bench-"+strconv.FormatInt(n%4, 10), "inv-bench-"+strconv.FormatInt(n, 10), audit.PhaseIntent)
				if _, err := w.Append(ctx, rec); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				acked.Add(1)
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return 0, fmt.Errorf("audit append: %w", *err)
	}
	return float64(acked.Load()) / time.Since(began).Seconds(), nil
}

var tpsRE = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

func runPgbench(ctx context.Context, pgbench, dbURL, dir string, window time.Duration) (float64, error) {
	script := filepath.Join(dir, "pgbench.sql")
	if err := os.WriteFile(script, []byte(pgbenchScript), 0o600); err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, pgbench, "-n", "-c", strconv.Itoa(auditClients), "-j", "2", //nolint:gosec // G204: pgbench from PATH, our own arguments.
		"-T", strconv.Itoa(int(window.Seconds())), "-f", script, dbURL)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("pgbench: %w\n%s", err, tail(out.Bytes()))
	}
	m := tpsRE.FindSubmatch(out.Bytes())
	if m == nil {
		return 0, fmt.Errorf("pgbench printed no tps:\n%s", tail(out.Bytes()))
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// printAudit prints each writer's appends per second (the mean of the
// rounds) and its ratio to pgbench (the median round's, with the range).
func printAudit(out io.Writer, rs []auditResult, window time.Duration) {
	var gc, pa, pb, perTx float64
	var gcRatios, paRatios []float64
	for _, r := range rs {
		gc, pa, pb, perTx = gc+r.groupCommit, pa+r.perAppend, pb+r.pgbench, perTx+r.recordsPerTx
		gcRatios = append(gcRatios, r.groupCommit/r.pgbench)
		paRatios = append(paRatios, r.perAppend/r.pgbench)
	}
	n := float64(len(rs))
	fmt.Fprintf(out, "\nAudit appends vs pgbench, %d clients, %s each, same database", auditClients, window)
	if len(rs) > 1 {
		fmt.Fprintf(out, ", %d rounds (appends/s: the mean; ratio: the median round's, lowest–highest)", len(rs))
	}
	fmt.Fprint(out, ":\n\n")
	fmt.Fprintln(out, "| writer | acknowledged appends/s | × pgbench single-row commits |")
	fmt.Fprintln(out, "|---|---|---|")
	fmt.Fprintf(out, "| group commit (%.1f records/tx) | %.0f | %s |\n", perTx/n, gc/n, medianRange(gcRatios))
	fmt.Fprintf(out, "| one transaction per append | %.0f | %s |\n", pa/n, medianRange(paRatios))
	fmt.Fprintf(out, "| pgbench (INSERT of one row per transaction) | %.0f | 1.00 |\n", pb/n)
}
