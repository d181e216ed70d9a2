package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	dirpg "github.com/mandate-dev/mandate/internal/directory/postgres"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/audit"
	auditpg "github.com/mandate-dev/mandate/services/audit/postgres"
)

// seedTrail appends five records to tenant acme's chain.
func seedTrail(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	store := auditpg.New(pool, auditpg.Options{})
	defer store.Close()
	w := audit.NewWriter(store, audit.WriterOptions{})
	defer func() { _ = w.Close() }()
	for i := 1; i <= 5; i++ {
		rec := audit.Record{
			InvocationID: fmt.Sprintf("inv-%d", i), Phase: audit.PhaseOutcome, Tenant: "acme",
			Channel: audit.ChannelMCP, Command: "ticket.refund", Risk: "L3", SideEffects: []string{"ledger"},
			UserID: "carol", ActorKind: audit.ActorAgent, AgentID: "finance-bot", Model: "m",
			Outcome: audit.OutcomeExecuted,
		}
		if _, err := w.Append(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAuditVerifyNamesTheBrokenRow edits and deletes rows behind the
// service's back; `mandate audit verify` must fail and name the row.
func TestAuditVerifyNamesTheBrokenRow(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildMandate(t)
	cases := []struct {
		name   string
		tamper string
		want   string
	}{
		{"intact", "", "intact: 5 records"},
		{"edited middle row", "UPDATE audit.records SET user_id = 'mallory' WHERE tenant = 'acme' AND seq = 3", "BROKEN at seq 3 (invocation inv-3, phase outcome): hash_mismatch"},
		{"deleted middle row", "DELETE FROM audit.records WHERE tenant = 'acme' AND seq = 2", "BROKEN at seq 2"},
		{"deleted last row", "DELETE FROM audit.records WHERE tenant = 'acme' AND seq = 5", "BROKEN at seq 5"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool, url := pgtest.NewURL(t, dirpg.Migrations, auditpg.Migrations)
			seedTrail(t, pool)
			if tc.tamper != "" {
				// An owner can switch the append-only trigger off; the hash
				// chain is what catches that.
				for _, sql := range []string{"ALTER TABLE audit.records DISABLE TRIGGER records_append_only", tc.tamper} {
					if _, err := pool.Exec(context.Background(), sql); err != nil {
						t.Fatal(err)
					}
				}
			}
			out, err := mandate(t, bin, url, "audit", "verify", "--tenant", "acme")
			if (tc.tamper == "") != (err == nil) {
				t.Fatalf("exit error %v for %q\n%s", err, tc.name, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Fatalf("output does not contain %q:\n%s", tc.want, out)
			}
		})
	}
}

func TestAuditQuery(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildMandate(t)
	pool, url := pgtest.NewURL(t, dirpg.Migrations, auditpg.Migrations)
	seedTrail(t, pool)

	out, err := mandate(t, bin, url, "audit", "query", "--tenant", "acme", "--format", "json", "--actor-kind", "agent", "--risk", "L3,L4", "--side-effect", "ledger", "--limit", "2")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var page struct {
		Records []struct {
			Seq          int64
			InvocationID string
		} `json:"records"`
		NextPageToken string `json:"next_page_token"`
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(page.Records) != 2 || page.Records[0].Seq != 5 || page.NextPageToken == "" {
		t.Fatalf("page %+v", page)
	}
	out, err = mandate(t, bin, url, "audit", "query", "--tenant", "acme", "--command", "ticket.refund")
	if err != nil || !strings.Contains(out, "SEQ") || !strings.Contains(out, "inv-5") || !strings.Contains(out, "finance-bot") {
		t.Fatalf("table: %v\n%s", err, out)
	}
	out, err = mandate(t, bin, url, "audit", "query", "--tenant", "globex")
	if err != nil || strings.Contains(out, "inv-") {
		t.Fatalf("another tenant sees acme's rows: %v\n%s", err, out)
	}
	if out, err := mandate(t, bin, url, "audit", "query", "--tenant", "acme", "--from", "yesterday"); err == nil || !strings.Contains(out, "--from (MANDATE_FROM) must be an RFC 3339 time") {
		t.Fatalf("bad --from: %v\n%s", err, out)
	}
}
