package postgres_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	"github.com/mandate-dev/mandate/examples/helpdesk/helpdesktest"
	"github.com/mandate-dev/mandate/examples/helpdesk/postgres"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

func TestConformance(t *testing.T) {
	helpdesktest.Run(t, func(t *testing.T) helpdesk.Store {
		return postgres.New(pgtest.New(t, postgres.Migrations))
	})
}

// TestCheckConstraint shows the database refuses an over-refund on its own, as a last line of
// defence under the domain's check, and that the refusal is classified, not leaked.
func TestCheckConstraint(t *testing.T) {
	pool := pgtest.New(t, postgres.Migrations)
	st := postgres.New(pool)
	ctx := context.Background()
	if err := st.InTx(ctx, func(tx helpdesk.Tx) error {
		return tx.InsertTicket(ctx, helpdesktest.Ticket("acme", "T-1"))
	}); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(ctx, `UPDATE helpdesk.tickets SET refunded_minor = paid_minor + 1 WHERE ticket_id = 'T-1'`)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "23514" {
		t.Fatalf("over-refund through SQL: err = %v, want a check violation", err)
	}
}

// TestUnavailable shows a store whose database does not answer reports ErrUnavailable, which
// the backend turns into a retriable helpdesk.unavailable, without the driver's text.
func TestUnavailable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close() // nothing listens there any more
	pool, err := pgxpool.New(context.Background(), "postgres://postgres:hunter2@"+addr+"/helpdesk?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st := postgres.New(pool)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, rerr := st.Ticket(ctx, "acme", "T-1")
	terr := st.InTx(ctx, func(helpdesk.Tx) error { return nil })
	for name, err := range map[string]error{"read": rerr, "transaction": terr} {
		if !errors.Is(err, helpdesk.ErrUnavailable) {
			t.Errorf("%s: err = %v, want ErrUnavailable", name, err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: message leaks the connection string: %q", name, err)
		}
	}
}

// TestReceiptsMigration: the receipts table is pkg/receipt's, copied into migration 0003 so that
// the receipt commits in the transaction of the effect it records. A change to the package's
// schema fails here: it needs a new migration, not an edit of an applied one.
func TestReceiptsMigration(t *testing.T) {
	sql, err := fs.ReadFile(postgres.Migrations.FS, "0003_receipts.sql")
	if err != nil {
		t.Fatalf("no migration 0003_receipts: %v", err)
	}
	if string(sql) != receipt.SchemaSQL {
		t.Fatal("migration 0003_receipts is not receipt.SchemaSQL")
	}
}
