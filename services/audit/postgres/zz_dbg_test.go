package postgres_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mandate-dev/mandate/services/audit/postgres"
)

var dbgMu sync.Mutex
var dbgCounts = map[string]int{}

func init() {
	postgres.DebugErr = func(path string, err error) {
		k := path + ":" + "other"
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			k = path + ":" + pe.Code + ":" + pe.Message
		}
		dbgMu.Lock()
		dbgCounts[k]++
		dbgMu.Unlock()
	}
}

func TestZZDump(t *testing.T) {}

func dumpDbg(b interface{ Logf(string, ...any) }) {
	dbgMu.Lock()
	defer dbgMu.Unlock()
	b.Logf("%v", dbgCounts)
	dbgCounts = map[string]int{}
}
