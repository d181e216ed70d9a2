package postgres

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mandate-dev/mandate/examples/helpdesk"
)

// TestClassOf: the store's errors the backend reports as a retriable
// helpdesk.unavailable (nothing changed, try again) include a full disk,
// exhausted memory, an I/O error and a read-only standby — not only a
// database that went away — so that the executor never caches them as a
// failed call (TestChaosDiskFull saw 500 handler.failed before); a
// constraint is a conflict; anything else stays unclassified.
func TestClassOf(t *testing.T) {
	for code, want := range map[string]error{
		"53100": helpdesk.ErrUnavailable, "53200": helpdesk.ErrUnavailable, "53300": helpdesk.ErrUnavailable,
		"58030": helpdesk.ErrUnavailable, "25006": helpdesk.ErrUnavailable, "57P01": helpdesk.ErrUnavailable,
		"08006": helpdesk.ErrUnavailable, "23505": helpdesk.ErrConflict, "40001": helpdesk.ErrConflict,
		"42601": nil, "22001": nil,
	} {
		err := fmt.Errorf("insert: %w", &pgconn.PgError{Code: code, Message: "could not extend file"})
		if got := classOf(err); !errors.Is(got, want) || (want == nil && got != nil) {
			t.Errorf("classOf(SQLSTATE %s) = %v, want %v", code, got, want)
		}
	}
}
