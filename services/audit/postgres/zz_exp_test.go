package postgres_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/audittest"
	"github.com/mandate-dev/mandate/services/audit/postgres"
)

func TestZZExp(t *testing.T) {
	pool := pgtest.New(t, postgres.Migrations)
	ctx := context.Background()
	st := postgres.New(pool, postgres.Options{Logger: quiet})
	defer st.Close()
	n := 0
	batch := func(size int) []audit.Record {
		var recs []audit.Record
		for range size {
			recs = append(recs, audittest.Rec("tenant-"+strconv.Itoa(n%4), "inv-"+strconv.Itoa(n), audit.PhaseIntent).Normalize(time.Now()))
			n++
		}
		return recs
	}
	measure := func(name string, size int) {
		const rounds = 300
		start := time.Now()
		for range rounds {
			if _, err := st.AppendBatch(ctx, batch(size)); err != nil {
				t.Fatal(err)
			}
		}
		d := time.Since(start) / rounds
		t.Logf("%-30s size=%d: %v per batch, %.0f rows/s", name, size, d, float64(size)/d.Seconds())
	}
	measure("warmup", 32)
	measure("all", 32)
	measure("all", 64)
	measure("all", 1)
	for _, step := range []struct{ name, sql string }{
		{"-pending", "ALTER TABLE audit.pending RENAME TO pending_off; CREATE TABLE audit.pending (tenant text, invocation_id text, seq bigint, time timestamptz, PRIMARY KEY (tenant, invocation_id))"},
		{"-agent,conv,approver idx", "DROP INDEX audit.records_agent, audit.records_conversation, audit.records_approver"},
		{"-time idx", "DROP INDEX audit.records_time"},
		{"-high risk idx", "DROP INDEX audit.records_high_risk"},
		{"-trigger", "DROP TRIGGER records_append_only ON audit.records"},
	} {
		if _, err := pool.Exec(ctx, step.sql); err != nil {
			t.Fatal(err)
		}
		measure(step.name, 32)
		measure(step.name, 64)
	}
	var one time.Duration
	for range 300 {
		s := time.Now()
		if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		one += time.Since(s)
	}
	t.Logf("SELECT 1 round trip: %v", one/300)
}
