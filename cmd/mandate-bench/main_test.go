package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestMain lets the test binary stand in for mandate-bench: run re-executes its own binary as
// the servers it measures.
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && (os.Args[1] == childMode || os.Args[1] == referenceMode) {
		main()
		return
	}
	os.Exit(m.Run())
}

// TestBenchPrintsTheRatios runs the whole benchmark with a handful of calls and checks that
// one run prints what the README quotes: the ratio table for every shape and, with Postgres and
// pgbench at hand, the audit comparison. It measures nothing.
func TestBenchPrintsTheRatios(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dozen servers")
	}
	cfg, err := parseFlags([]string{"-calls-1", "3", "-calls-16", "32", "-protocols", "2026-07-28", "-audit", "1s"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, cfg, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	got := out.String()
	t.Log(got)
	want := []string{"| mandate dev ", "governed / ungoverned", "allocs per call"}
	if postgresAnswers(ctx, cfg.databaseURL) {
		want = append(want, "| separate processes + Postgres ", "CPU/allocs per call by process")
		if _, err := exec.LookPath("pgbench"); err == nil {
			want = append(want, "Audit appends vs pgbench", "| group commit (")
		}
	}
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("output lacks %q", w)
		}
	}
}

func postgresAnswers(ctx context.Context, url string) bool {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, url)
	if err != nil {
		return false
	}
	_ = conn.Close(cctx)
	return true
}
